"""benchmarks/profile_prefill.py on the tiny presets: it runs, covers every component, and
writes its JSON (the H200 runs it at the real shapes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import profile_prefill
from coldbench.kernels import detect_backend


def test_profile_tiny_llama_and_moe(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "profile.json"
    args = ["--contexts", "128", "--chunk", "64", "--repeats", "1", "--json", str(out)]
    assert profile_prefill.main(["--preset", "tiny", *args]) == 0
    (dense,) = json.loads(out.read_text())["profiles"]
    assert profile_prefill.main(["--preset", "tiny-moe", *args]) == 0
    (moe,) = json.loads(out.read_text())["profiles"]
    names = {c["name"] for c in dense["components"]}
    assert names == {
        "input_norm", "qkv_proj", "rope", "attention_sdpa", "o_proj", "residual_adds",
        "post_norm", "gate_up_proj", "swiglu", "down_proj",
    }  # fmt: skip
    assert {"qk_norm", "moe_router", "moe_gather_sort", "experts", "moe_combine"} <= {
        c["name"] for c in moe["components"]
    }
    for result in (dense, moe):
        assert result["context_tokens"] == 128 and result["chunk"] == 64
        assert result["layer_ms"] > 0
        assert all(c["ms"] > 0 and c["calls"] == 2 for c in result["components"])
        assert {f["name"] for f in result["fast_paths"]} == {"fused_swiglu", "fused_add_rms_norm"}
        for fast in result["fast_paths"]:
            if detect_backend() == "cpu":
                assert fast["fused_ms"] is None and fast["speedup"] is None
                assert fast["fallback"] == "needs metal or cuda; this host runs MLX on cpu"
            else:
                assert fast["speedup"] > 0, fast
    printed = capsys.readouterr().out
    assert "one layer, 128 tokens in chunks of 64" in printed and "attention_sdpa" in printed


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--contexts", "128"], "--contexts needs --preset"),
        (["--preset", "nope"], "unknown preset 'nope'"),
        (["--preset", "tiny", "--contexts", "0"], "--contexts: give positive token counts"),
        (["--preset", "tiny", "--contexts", "128", "--dtype", "int8"], "--dtype int8"),
    ],
)
def test_bad_arguments_are_one_line_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as raised:
        profile_prefill.main(argv)
    assert raised.value.code == 2
    assert message in capsys.readouterr().err
