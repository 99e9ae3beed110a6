"""`coldbench compare`: one job's bundles from several hosts, side by side, agreeing or not;
different jobs refused saying what differs."""

from __future__ import annotations

import http.server
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from coldbench.evidence.bundles.bundle import build_bundle, evidence_id_of, write_folder, zip_bytes
from coldbench.evidence.bundles.compare import (
    CompareError,
    compare_hosts,
    comparison_lines,
    host_runs,
    load_source,
)
from coldbench.evidence.contract.schemas import JobSpec
from tests.evidence.builders import provenance, simulate_run

SPEC = {
    "adapter": "mlx-lm",
    "repository": "mlx-lm",
    "model": "preset:tiny",
    "contexts": [256],
    "rounds": 10,
    "variants": [
        {"name": "base", "ref": "main", "flags": {"prefill_step_size": 2048}},
        {"name": "fast", "ref": "feature", "flags": {"compile": True}},
    ],
}


def _bundle(
    folder: Path, *, hostname: str, effect: float, seed: int, **spec: Any
) -> tuple[Path, str]:
    records = simulate_run(
        effects={"base": 1.0, "fast": effect},
        contexts=(256,),
        rounds=10,
        run_id=f"r-{hostname}",
        seed=seed,
    )
    files, _ = build_bundle(
        records=records,
        provenances=provenance(f"r-{hostname}", hostname),
        spec=JobSpec.model_validate({**SPEC, **spec}),
        n_resamples=500,
    )
    write_folder(folder, files)
    return folder, evidence_id_of(files["manifest.json"])


def _compare(*paths: Path | str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "coldbench", "compare", *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_hosts_of_one_job_that_agree_and_that_disagree(tmp_path: Path) -> None:
    a, a_id = _bundle(tmp_path / "a", hostname="h100", effect=1.06, seed=1)
    b, _ = _bundle(tmp_path / "b", hostname="h200", effect=1.06, seed=2)
    c, _ = _bundle(tmp_path / "c", hostname="m3", effect=0.94, seed=3)
    agreeing = compare_hosts([*host_runs(load_source(str(a))), *host_runs(load_source(str(b)))])
    (row,) = agreeing.rows
    assert row.outcome.agree is True and not agreeing.disagreements
    lines = comparison_lines(agreeing)
    assert lines[1].startswith(f"- h100: evidence {a_id}; h100 (run `r-h100`): Apple M3 Ultra")
    assert "MLX 0.32.4" in lines[1]
    assert f"  {row.outcome.statement}" in lines
    assert row.outcome.statement.startswith("hosts agree within +-")

    done = _compare(a, b, c)
    assert done.returncode == 1, done.stderr
    assert "fast / base at 256 tokens:" in done.stdout
    assert "  hosts disagree: h100 +" in done.stdout and ", m3 -" in done.stdout
    assert "Q = " in done.stdout and "2 df" in done.stdout
    assert done.stdout.rstrip().endswith("hosts disagree at 1 of 1: fast @ 256")


def test_different_jobs_are_refused_saying_what_differs(tmp_path: Path) -> None:
    a, _ = _bundle(tmp_path / "a", hostname="h100", effect=1.0, seed=1)
    b, _ = _bundle(tmp_path / "b", hostname="h200", effect=1.0, seed=2, rounds=12)
    done = _compare(a, b)
    assert done.returncode == 2
    assert "are different jobs (spec digests " in done.stderr
    assert "job.rounds: 10 vs 12" in done.stderr


def test_a_bundle_of_one_host_alone_or_altered_is_refused(tmp_path: Path) -> None:
    a, _ = _bundle(tmp_path / "a", hostname="h100", effect=1.0, seed=1)
    with pytest.raises(CompareError, match="at least two hosts"):
        compare_hosts(host_runs(load_source(str(a))))
    b, _ = _bundle(tmp_path / "b", hostname="h200", effect=1.0, seed=2)
    (b / "records.jsonl").write_bytes((b / "records.jsonl").read_bytes()[:-10])
    done = _compare(a, b)
    assert done.returncode == 2 and "not intact: records.jsonl: altered" in done.stderr


@pytest.fixture
def evidence_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A plain HTTP server of `/e/<id>.zip` files, as the service serves them."""
    root = tmp_path / "served"
    (root / "e").mkdir(parents=True)

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, directory=str(root), **kwargs)

        def log_message(self, *_args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", root / "e"
    finally:
        server.shutdown()
        server.server_close()


def test_an_evidence_url_is_fetched_and_must_be_that_evidence(
    tmp_path: Path, evidence_server: tuple[str, Path]
) -> None:
    base, served = evidence_server
    a, a_id = _bundle(tmp_path / "a", hostname="h100", effect=1.06, seed=1)
    b, b_id = _bundle(tmp_path / "b", hostname="h200", effect=1.06, seed=2)
    from coldbench.evidence.bundles.bundle import read_bundle

    (served / f"{a_id}.zip").write_bytes(zip_bytes(read_bundle(a)))
    # another bundle served under b's id: intact, but not the evidence the URL names
    (served / f"{b_id}.zip").write_bytes(zip_bytes(read_bundle(a)))
    hosts = host_runs(load_source(f"{base}/e/{a_id}")) + host_runs(load_source(str(b)))
    assert [h.evidence_id for h in hosts] == [a_id, b_id]
    with pytest.raises(CompareError, match=f"is evidence {a_id}, not {b_id}"):
        host_runs(load_source(f"{base}/e/{b_id}"))
    with pytest.raises(CompareError, match="HTTP 404"):
        load_source(f"{base}/e/{'0' * 24}")
    with pytest.raises(CompareError, match="not an evidence URL"):
        load_source(f"{base}/jobs/abc")
