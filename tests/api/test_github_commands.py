"""The `/coldbench` line of a pull-request comment: found, split, and read by the spec's text
parsers; every mistake answered in one line."""

from __future__ import annotations

import pytest

from coldbench.api.github.commands import (
    Ask,
    CommandError,
    available_modes,
    find_command,
    parse_command,
)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("/coldbench ab", "ab"),
        (
            "Looks good.\n\n  /coldbench ablation features=compile\nthanks",
            "ablation features=compile",
        ),
        ("/coldbench", ""),
        ("/coldbench\r\nmore text", ""),
        # Quoting someone else's command asks nothing; neither does a mention mid-line.
        ("> /coldbench ab", None),
        ("please run /coldbench ab", None),
        ("/coldbenchmark ab", None),
        ("no command here", None),
    ],
)
def test_the_command_is_the_first_line_that_starts_with_it(body: str, expected: str | None):
    assert find_command(body) == expected


def test_mode_and_options_are_read():
    assert parse_command("") == Ask()
    assert parse_command("ab") == Ask(mode="ab")
    assert parse_command("sweep contexts=4K,16K rounds=12 model=llama-3b labels=lab:studio") == Ask(
        mode="sweep",
        options={
            "contexts": "4K,16K",
            "rounds": "12",
            "model": "llama-3b",
            "labels": "lab:studio",
        },
    )
    assert parse_command("rounds=3 mode=ablation") == Ask(mode="ablation", options={"rounds": "3"})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("benchmark", "unknown mode `benchmark`; modes: ab, ablation, sweep"),
        ("ab rounds", "`rounds`: write options as key=value, e.g. rounds=12"),
        ("ab =3", "`=3`: write options as key=value"),
        ("ab command=rm", "unknown option `command`; options: contexts, rounds"),
        ("ab repository=other", "unknown option `repository`"),
        ("ab variants=x:ref=main", "unknown option `variants`"),
        ("ab rounds=3 rounds=4", "option `rounds` given twice"),
        ("ab mode=sweep", "option `mode` given twice"),
        ("ab `x`=1", "unknown option `'x'`"),
        ("ab " + "x" * 600, "longer than 500 characters"),
    ],
)
def test_mistakes_are_answered_in_one_line(text: str, message: str):
    with pytest.raises(CommandError, match=None) as caught:
        parse_command(text)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_commits_is_offered_only_where_the_job_spec_has_the_mode():
    from typing import get_args

    from coldbench.evidence.contract.schemas import Mode

    assert ("commits" in available_modes()) == ("commits" in get_args(Mode))
    assert available_modes()[:3] == ("ab", "ablation", "sweep")


def test_a_request_becomes_a_job_spec_through_the_one_builder():
    from coldbench.api.github.client import PullRequestHeads
    from coldbench.api.github.config import RepositoryConfig
    from coldbench.api.github.service import request_payload
    from coldbench.evidence.contract.schemas import JobRequest, JobSpec
    from coldbench.evidence.spec.job_options import JobOptionsError, resolve_job

    repository = RepositoryConfig.model_validate(
        {
            "token": "t",
            "webhook_secret": "s" * 16,
            "coldbench_repository": "mlx-lm",
            "defaults": {
                "contexts": "4K",
                "labels": "lab:studio",
                "features": "prefill_step_size=512",
            },
        }
    )
    heads = PullRequestHeads(number=7, base_sha="a" * 40, head_sha="b" * 40, state="open")
    spec = request_payload(
        repository, parse_command("sweep contexts=4K,16k rounds=12 model=llama-3b"), heads
    )
    assert (spec["mode"], spec["repository"], spec["adapter"]) == ("sweep", "mlx-lm", "mlx-lm")
    assert [(v["name"], v["ref"]) for v in spec["variants"]] == [
        ("base", "a" * 40),
        ("pr-7", "b" * 40),
    ]
    assert (spec["contexts"], spec["rounds"], spec["model"]) == ([4096, 16384], 12, "llama-3b")
    assert spec["host_labels"] == ["lab:studio"] and spec["features"] == []
    assert spec["residency"] == "auto"
    turns = request_payload(repository, parse_command("ab residency=in-turns"), heads)
    assert turns["residency"] == "in-turns"
    with pytest.raises(JobOptionsError, match="'both': give auto, side-by-side or in-turns"):
        request_payload(repository, parse_command("ab residency=both"), heads)
    ablation = request_payload(repository, parse_command("ablation"), heads)
    assert [v["name"] for v in ablation["variants"]] == ["pr-7"]
    assert ablation["features"] == ["prefill_step_size=512"]
    # Without rounds, none are sent: the service resolves the default as for any request
    # without them, measuring until decided as every door does.
    asked = request_payload(repository, Ask(), heads)
    assert "rounds" not in asked and asked["until"] == "decided"
    with pytest.raises(ValueError, match="rounds"):
        JobSpec.model_validate(asked)
    assert resolve_job(JobRequest.model_validate(asked)).rounds == 40
    fixed = request_payload(repository, parse_command("ab until=rounds"), heads)
    assert fixed["until"] == "rounds" and "rounds" not in fixed
    with pytest.raises(JobOptionsError, match="'4Q' is not a token count") as caught:
        request_payload(repository, parse_command("contexts=4Q rounds=0"), heads)
    assert "rounds" in str(caught.value)
