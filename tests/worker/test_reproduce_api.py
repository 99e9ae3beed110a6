"""`coldbench reproduce URL --api URL`: a second host re-runs a job the service published and
uploads it; the evidence page and its Markdown gain the host's row with the hosts' agreement.
A bundle that is no reproduction is refused and kept, with the command that sends it again."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.stack import Stack, stop_process

pytestmark = pytest.mark.postgres


def _evidence(service: Stack, job_id: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        job = service.job(job_id)
        if job.get("evidence_id"):
            return str(job["evidence_id"])
        assert job["state"] not in ("failed", "cancelled"), job
        assert time.monotonic() < deadline, job
        time.sleep(0.5)


def test_a_second_host_uploads_its_reproduction_and_the_page_shows_it(
    micro_model_dir: Path,
    coldbench_cmd: list[str],
    tmp_path_factory: pytest.TempPathFactory,
    service: Stack,
) -> None:
    hosts = {}
    for name in ("repro-a", "repro-b"):
        root = tmp_path_factory.mktemp(name)
        config = root / "worker.toml"
        config.write_text(f'name = "{name}"\nstate_dir = "state"\nallow_presets = ["micro"]\n')
        hosts[name] = config
    log = hosts["repro-a"].parent / "agent.log"
    agent = service.start_agent(hosts["repro-a"], token=service.enrollment_token(), log=log)
    celery = service.start_celery("reproduce-celery")  # ingest, analysis, the evidence
    try:
        service.wait_hosts({"repro-a"}, [(agent, log)])
        created = service.submit(
            {
                "adapter": "embedded",
                "variants": [
                    {"name": "base", "flags": {}},
                    {"name": "cand", "flags": {"prefill_step_size": 128}},
                ],
                "contexts": [256],
                "rounds": 6,
                "decode_tokens": 1,
                "model": "preset:micro",
                "host_labels": ["host:repro-a"],
            }
        )
        assert created.status_code == 201, created.text
        evidence_id = _evidence(service, created.json()["id"], timeout_s=400)
    finally:
        stop_process(agent)
        stop_process(celery)
    # Host B enrolls (its agent exits once idle), then reproduces from the evidence URL alone.
    b_log = hosts["repro-b"].parent / "agent.log"
    enrolling = service.start_agent(
        hosts["repro-b"], token=service.enrollment_token(), log=b_log, extra=["--idle-exit-s", "1"]
    )
    assert enrolling.wait(120) == 0, b_log.read_text()
    url = f"{service.url}/e/{evidence_id}"
    before = httpx.get(url)
    where = hosts["repro-b"].parent

    def reproduce(*args: str) -> subprocess.CompletedProcess[str]:
        """`coldbench reproduce ARGS` as host B, uploading to the service."""
        return subprocess.run(
            [
                *coldbench_cmd,
                *("reproduce", *args),
                *("--api", service.url, "--config", str(hosts["repro-b"])),
            ],
            cwd=where,
            capture_output=True,
            text=True,
            timeout=400,
            check=False,
        )

    done = reproduce(url, "--out", "again", "--state-dir", "state")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert f"uploaded to {service.url}/e/{evidence_id} as host repro-b's" in done.stdout
    page = httpx.get(url, headers={"If-None-Match": before.headers["etag"]})
    assert page.status_code == 200 and page.headers["etag"] != before.headers["etag"]
    assert '<section id="cb-hosts">' in page.text and "repro-b" in page.text
    markdown = httpx.get(f"{url}.md").text
    assert "### Reproduced on other hosts" in markdown
    assert "hosts agree within" in markdown or "hosts disagree: " in markdown
    # A bundle that reproduces nothing is refused, kept, and the way to resend it said.
    original = where / "original.zip"
    original.write_bytes(httpx.get(f"{url}.zip").content)
    refused = reproduce(str(original), "--upload-only")
    assert refused.returncode == 1, refused.stderr
    assert "error: not uploaded: " in refused.stderr and "no reproduces.json" in refused.stderr
    assert f"--api {service.url} --upload-only" in refused.stderr and original.exists()
    again = reproduce("again", "--upload-only")
    assert again.returncode == 0, again.stderr  # the same bundle again: the same row
    assert httpx.get(url).text.count('<section id="cb-hosts">') == 1
