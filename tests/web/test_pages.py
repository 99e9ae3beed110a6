"""Login, the hosts page, the job page and its progress JSON, the evidence page."""

from __future__ import annotations

import io
import re
import zipfile
from html import unescape

from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from coldbench.api.auth.models import ApiKey
from coldbench.api.database import utcnow
from coldbench.api.runs import claim as run_claim
from coldbench.api.settings import Settings
from coldbench.evidence.bundles.bundle import verify_files
from coldbench.evidence.contract.calibration import HostCalibration
from tests.api import agent_calls
from tests.api.factories import fingerprint, make_host, make_job
from tests.evidence.builders import calibration_sample
from tests.web.builders import csrf_of, publish_evidence

EXTERNAL = re.compile(r"""(?:src|href|action)\s*=\s*["']?\s*(?:https?:)?//""", re.IGNORECASE)


def test_login_with_a_wrong_key_says_so(client: TestClient) -> None:
    page = client.get("/login")
    response = client.post(
        "/login",
        data={"api_key": "cbk_0000000000000000_" + "x" * 30, "csrf_token": csrf_of(page.text)},
    )
    assert response.status_code == 401
    assert "unknown or revoked" in response.text
    assert "cb_session" not in response.cookies


def test_login_redirects_only_within_the_site(client: TestClient, api_key: str) -> None:
    page = client.get("/login?next=//evil.example/x")
    response = client.post(
        "/login",
        data={"api_key": api_key, "csrf_token": csrf_of(page.text), "next": "//evil.example/x"},
        follow_redirects=False,
    )
    assert response.status_code == 303 and response.headers["location"] == "/"
    cookie = response.headers["set-cookie"]
    assert "HttpOnly" in cookie and api_key not in cookie


def test_login_needs_the_csrf_token(client: TestClient, api_key: str) -> None:
    client.get("/login")
    assert client.post("/login", data={"api_key": api_key}).status_code == 403


def test_revoking_the_key_ends_the_browser_session(
    web: TestClient, db_session: Session, api_key: str
) -> None:
    assert web.get("/hosts").status_code == 200
    db_session.get(ApiKey, api_key.split("_")[1]).revoked_at = utcnow()
    db_session.commit()
    response = web.get("/hosts", follow_redirects=False)
    assert response.status_code == 303 and response.headers["location"] == "/login?next=/hosts"


def test_logout_clears_the_session(web: TestClient) -> None:
    page = web.get("/hosts")
    response = web.post("/logout", data={"csrf_token": csrf_of(page.text)}, follow_redirects=False)
    assert response.status_code == 303
    assert web.get("/", follow_redirects=False).status_code == 303


def test_logout_ends_the_session_on_the_server(web: TestClient) -> None:
    """A copy of the session cookie taken before logout (another tab, a stolen copy) opens
    nothing after it (issue 46: it opened /jobs until its 12 h TTL)."""
    kept = web.cookies.get("cb_session")
    assert kept and web.get("/jobs", follow_redirects=False).status_code == 200
    page = web.get("/hosts")
    web.post("/logout", data={"csrf_token": csrf_of(page.text)}, follow_redirects=False)
    web.cookies.set("cb_session", kept)
    response = web.get("/jobs", follow_redirects=False)
    assert response.status_code == 303 and response.headers["location"].startswith("/login")


def test_hosts_page_shows_fingerprint_labels_heartbeat_and_current_run(
    web: TestClient, db_session: Session, settings: Settings
) -> None:
    host, _secret = make_host(
        db_session, "studio-1", labels=["lab:home"], enrolled_labels=["team:a"]
    )
    make_host(db_session, "idle-box")
    job = make_job(db_session, settings)
    lease = agent_calls.claim_lease(
        db_session=db_session,
        settings=settings,
        host=host,
        report=run_claim.HostReport(
            fingerprint=fingerprint(hostname="studio-1", chip="Apple M3 Ultra", cores=32),
        ),
    )
    assert lease is not None
    agent_calls.heartbeat(
        db_session=db_session,
        settings=settings,
        host_id=host.id,
        run_id=lease.run_id,
        attempt=lease.attempt,
        progress={"cells_done": 3, "cells_total": 8, "variant": "cand", "context_tokens": 64},
    )
    html = web.get("/hosts").text
    row = re.search(r'<tr id="host-studio-1">(.*?)</tr>', html, re.S).group(1)
    assert "Apple M3 Ultra" in row and "32 cores" in row
    # Each label with its source: the admin's, the host's own, the server's.
    assert 'team:a <span class="source">admin</span>' in row
    assert 'lab:home <span class="source">host</span>' in row
    assert 'backend:cpu <span class="source">server</span>' in row
    assert f"/jobs/{job.id}" in row and "3/8 cells" in row
    assert "s ago" in row
    idle = re.search(r'<tr id="host-idle-box">(.*?)</tr>', html, re.S).group(1)
    assert "idle" in idle


def test_job_page_shows_progress_and_invalid_cells_and_polls_json(
    web: TestClient, db_session: Session, settings: Settings
) -> None:
    host, _secret = make_host(db_session, "studio-1")
    job = make_job(db_session, settings)
    html = web.get(f"/jobs/{job.id}").text
    assert 'id="job-state">queued' in html and "waiting for a host" in html
    # flags as the submitter writes them (evidence/contract/spec_text.py), not Python's False
    assert "<strong>cand</strong> · clear_cache=false</span>" in html
    assert f'href="/jobs/{job.id}">Refresh' in html  # the no-JavaScript path
    assert '<script src="/static/job.js">' in html
    lease = agent_calls.claim_lease(
        db_session=db_session,
        settings=settings,
        host=host,
        report=run_claim.HostReport(fingerprint=fingerprint(hostname="studio-1")),
    )
    invalid = {
        "variant": "cand",
        "round": 0,
        "context_tokens": 64,
        "reason": "silent no-op: prefill_step_size",
    }
    agent_calls.heartbeat(
        db_session=db_session,
        settings=settings,
        host_id=host.id,
        run_id=lease.run_id,
        attempt=lease.attempt,
        progress={
            "cells_done": 5,
            "cells_total": 8,
            "variant": "cand",
            "context_tokens": 128,
            "invalid": [invalid],
        },
    )
    state = web.get(f"/jobs/{job.id}/progress.json").json()
    assert state["is_final"] is False and state["evidence_url"] is None
    assert "5 / 8 cells" in state["html"] and "studio-1" in state["html"]
    assert "silent no-op: prefill_step_size" in state["html"]
    assert "cand @ 128 tokens" in state["html"]
    assert web.get("/jobs/0123456789abcdef").status_code == 404
    anonymous = TestClient(web.app)
    assert anonymous.get(f"/jobs/{job.id}/progress.json").status_code == 401


def test_cancel_from_the_job_page(web: TestClient, db_session: Session, settings: Settings) -> None:
    make_host(db_session, "studio-1")
    job = make_job(db_session, settings)
    page = web.get(f"/jobs/{job.id}")
    response = web.post(
        f"/jobs/{job.id}/cancel", data={"csrf_token": csrf_of(page.text)}, follow_redirects=False
    )
    assert response.status_code == 303
    assert web.get(f"/jobs/{job.id}/progress.json").json()["state"] == "cancelled"


def test_evidence_page_serves_plotly_from_the_app_with_buttons(
    web: TestClient, db_session: Session, settings: Settings
) -> None:
    make_host(db_session, "studio-1")
    job = make_job(db_session, settings)
    evidence_id = publish_evidence(db_session, settings, job)
    anonymous = TestClient(web.app)  # evidence is readable by whoever has the id
    response = anonymous.get(f"/e/{evidence_id}")
    assert response.status_code == 200
    html = response.text
    assert len(html) < 1_000_000, "plotly.js must be served, not inlined"
    assert '<script src="/static/plotly.min.js"></script>' in html
    assert '<script src="/static/evidence.js"></script>' in html
    assert 'id="cb-copy-md"' in html and f'href="/e/{evidence_id}.zip"' in html
    markdown = re.search(r'<textarea id="cb-markdown" readonly>(.*?)</textarea>', html, re.S)
    assert f"[`{evidence_id}`](http://testserver/e/{evidence_id})" in markdown.group(1)
    assert "<table" in html and "fast" in html  # the tables read without JavaScript
    assert not EXTERNAL.search(html)
    # reproductions uploaded later add hosts: revalidated with the ETag, never immutable
    assert response.headers["cache-control"] == "public, no-cache"
    assert "default-src 'self'" in response.headers["content-security-policy"]
    again = anonymous.get(f"/e/{evidence_id}", headers={"If-None-Match": response.headers["etag"]})
    assert again.status_code == 304
    # The bundle's own report.html (plotly inlined, opens offline) stays at .html.
    assert len(anonymous.get(f"/e/{evidence_id}.html").content) > 1_000_000
    bundle = anonymous.get(f"/e/{evidence_id}.zip")
    files = {
        name: zipfile.ZipFile(io.BytesIO(bundle.content)).read(name)
        for name in zipfile.ZipFile(io.BytesIO(bundle.content)).namelist()
    }
    assert verify_files(files).is_intact
    assert anonymous.get("/e/" + "0" * 24).status_code == 404


def test_evidence_page_puts_reproduction_hosts_side_by_side(
    web: TestClient, db_session: Session, settings: Settings
) -> None:
    make_host(db_session, "studio-1")
    job = make_job(db_session, settings)
    # studio-2 measures the candidate slower: the hosts disagree, and the test says so.
    evidence_id = publish_evidence(
        db_session,
        settings,
        job,
        hosts=("studio-1", "studio-2"),
        host_effects={"studio-2": {"base": 1.0, "fast": 0.8}},
    )
    html = web.get(f"/e/{evidence_id}").text
    section = re.search(r'<section id="reproductions">(.*?)</section>', html, re.S).group(1)
    header = re.search(r"<thead>(.*?)</thead>", section, re.S).group(1)
    assert "studio-1" in header and "studio-2" in header and "ratio of ratios" in header
    rows = re.findall(r"<tr>(.*?)</tr>", re.search(r"<tbody>(.*?)</tbody>", section, re.S)[1])
    assert rows and all('<td class="flag">hosts disagree: studio-1 ' in row for row in rows)
    assert all("studio-2 / studio-1 0." in row and "Q = " in row for row in rows)
    # what each host was, beside the test: the difference may come from the machine
    assert "Agreement: hosts disagree where Welch&#39;s test of their log ratios" in section
    assert len(re.findall(r"<li>studio-\d", section)) == 2
    # Each host's own interval, side by side in the same row, then their ratio's.
    assert all(len(re.findall(r"\[\d\.\d+, \d\.\d+\]", row)) == 3 for row in rows)


def test_hosts_whose_machines_share_a_hostname_are_shown_by_their_registered_names(
    web: TestClient, db_session: Session, settings: Settings
) -> None:
    make_host(db_session, "studio-1")
    job = make_job(db_session, settings)
    evidence_id = publish_evidence(
        db_session, settings, job, hosts=("rack-a", "rack-b"), machine_hostname="vm"
    )
    html = web.get(f"/e/{evidence_id}").text
    section = re.search(r'<section id="reproductions">(.*?)</section>', html, re.S).group(1)
    header = re.search(r"<thead>(.*?)</thead>", section, re.S).group(1)
    assert "<th>rack-a</th><th>rack-b</th>" in header and "<th>vm</th>" not in header
    hosts = re.search(r'<ul id="hosts">(.*?)</ul>', html, re.S).group(1)
    assert "Host: rack-a (hostname vm, run r-1)" in hosts
    assert "Host: rack-b (hostname vm, run r-2)" in hosts


def test_job_page_leads_with_the_answer_once_evidence_exists(
    web: TestClient, db_session: Session, settings: Settings
) -> None:
    make_host(db_session, "studio-1")
    job = make_job(db_session, settings)
    assert 'id="answer"' not in web.get(f"/jobs/{job.id}").text
    evidence_id = publish_evidence(db_session, settings, job)
    evidence = web.get(f"/e/{evidence_id}").text
    sentences = re.findall(
        r"<li>(.*?)</li>", re.search(r'<ul class="headline">(.*?)</ul>', evidence, re.S).group(1)
    )
    assert (
        len(sentences) == 2 and "fast is " in sentences[0] and "faster at 64 tokens" in sentences[0]
    )
    for html in (
        web.get(f"/jobs/{job.id}").text,
        web.get(f"/jobs/{job.id}/progress.json").json()["html"],
    ):
        answer = re.search(r'<section id="answer" class="answer">(.*?)</section>', html, re.S)
        assert answer, "the job page shows the answer"
        # The same sentences as the evidence page, then the verdict table.
        assert re.findall(r"<li>(.*?)</li>", answer.group(1)) == sentences
        assert answer.group(1).count("<tr>") == 1 + 2  # header + 2 contexts x 1 candidate
        assert ">faster</td>" in answer.group(1)


def test_a_finished_run_shows_its_final_count_not_its_last_heartbeat(
    web: TestClient, db_session: Session, settings: Settings
) -> None:
    from coldbench.api.runs.models import Run

    host, _secret = make_host(db_session, "studio-1")
    job = make_job(db_session, settings)
    lease = agent_calls.claim_lease(
        db_session=db_session,
        settings=settings,
        host=host,
        report=run_claim.HostReport(fingerprint=fingerprint(hostname="studio-1")),
    )
    agent_calls.heartbeat(
        db_session=db_session,
        settings=settings,
        host_id=host.id,
        run_id=lease.run_id,
        attempt=lease.attempt,
        progress={"cells_done": 87, "cells_total": 96},
    )
    run = db_session.get(Run, lease.run_id)
    run.state = "completed"
    db_session.commit()
    html = web.get(f"/jobs/{job.id}/progress.json").json()["html"]
    assert "87 / 96" not in html and "finished; counting its cells" in html
    # What ingest writes when it has counted the run's records.
    run.state = "processed"
    run.progress = {**run.progress, "cells_done": 96, "cells_total": 96, "final": True}
    db_session.commit()
    html = web.get(f"/jobs/{job.id}/progress.json").json()["html"]
    # the heartbeat's count appears nowhere as a count (ids are hex and may contain "87")
    assert "96 cells recorded" in html and not re.search(r"(?<![0-9a-f])87(?![0-9a-f])", html)


def test_static_files_and_pages_never_point_elsewhere(
    web: TestClient, db_session: Session, settings: Settings
) -> None:
    make_host(db_session, "studio-1")
    job = make_job(db_session, settings)
    for path in ("/", "/hosts", "/jobs", f"/jobs/{job.id}", "/login"):
        response = web.get(path)
        assert response.status_code == 200, path
        assert not EXTERNAL.search(response.text), path
        assert "default-src 'self'" in response.headers["content-security-policy"]
    plotly = web.get("/static/plotly.min.js")
    assert plotly.status_code == 200 and len(plotly.content) > 1_000_000
    for name in ("coldbench.css", "job.js", "evidence.js"):
        assert web.get(f"/static/{name}").status_code == 200


def test_text_from_hosts_is_escaped_in_the_page_and_its_live_updates(
    web: TestClient, db_session: Session, settings: Settings
) -> None:
    host, _secret = make_host(db_session, "studio-1")
    job = make_job(db_session, settings)
    lease = agent_calls.claim_lease(
        db_session=db_session,
        settings=settings,
        host=host,
        report=run_claim.HostReport(fingerprint=fingerprint(hostname="studio-1")),
    )
    hostile = "<script>alert(1)</script>"
    agent_calls.heartbeat(
        db_session=db_session,
        settings=settings,
        host_id=host.id,
        run_id=lease.run_id,
        attempt=lease.attempt,
        progress={
            "cells_done": 1,
            "cells_total": 2,
            "invalid": [{"variant": "cand", "round": 0, "context_tokens": 64, "reason": hostile}],
        },
    )
    for html in (
        web.get(f"/jobs/{job.id}").text,
        web.get(f"/jobs/{job.id}/progress.json").json()["html"],
    ):
        assert hostile not in html
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_hosts_page_shows_the_calibration_of_calibrated_hosts(
    web: TestClient, db_session: Session
) -> None:
    from coldbench.api.hosts import service as host_service

    host, _secret = make_host(db_session, "h200")
    make_host(db_session, "fresh-box")
    host_service.store_calibration(
        db_session=db_session,
        host=host,
        calibration=HostCalibration.model_validate(calibration_sample("h200")),
    )
    html = web.get("/hosts").text
    row = re.search(r'<tr id="host-h200">(.*?)</tr>', html, re.S).group(1)
    assert "A/A jobs with a faster/slower verdict: 0 of 10 (0%)" in row
    assert "planted effect (prefill_step_size=1024) detected: 10 of 10 (slower 10)" in row
    assert "smallest effect this host resolves: +-0.80%" in row
    assert "llama-8b-shape, 24 rounds, measured 2026-11-29" in row
    fresh = re.search(r'<tr id="host-fresh-box">(.*?)</tr>', html, re.S).group(1)
    assert "not calibrated" in fresh


def test_a_bisection_page_shows_its_steps_as_they_complete(
    web: TestClient, db_session: Session, settings: Settings
) -> None:
    from coldbench.api.jobs import bisect
    from coldbench.api.jobs import service as job_service
    from coldbench.evidence.analysis.bisect import step_spec
    from tests.api.factories import job_payload

    make_host(db_session, "studio-1", repositories={"mlx-lm": {"recipes": ["editable"]}})
    job = job_service.create_job(
        db_session=db_session,
        settings=settings,
        payload=job_payload(
            mode="bisect",
            adapter="mlx-lm",
            repository="mlx-lm",
            variants=[{"name": "stock"}],
            contexts=[64],
            rounds=6,
            bisect={"good": "v1", "bad": "main", "direction": "slower"},
        ),
    )
    html = web.get(f"/jobs/{job.id}").text
    assert 'id="bisect-facts">first slower commit between <code>v1</code>' in html
    assert 'id="bisect-steps"' in html and "good..bad, resolved by its host" in html
    (first,) = bisect.steps_of(db_session=db_session, job_id=job.id)
    line = [c * 40 for c in "abc"]
    (run,) = job_service.job_runs(db_session=db_session, job_id=first.id)
    run.resolved_spec = step_spec(first.spec, line, [])
    first.state, first.evidence_id = "done", "1" * 24
    first.summary = {"bisect": {"decision": "lower", "why": "mid is slower like hi"}}
    db_session.commit()
    assert bisect.advance(db_session=db_session, job_id=first.id) == "step 2"
    live = web.get(f"/jobs/{job.id}/progress.json").json()["html"]
    step_one = re.search(r'<tr id="step-1">(.*?)</tr>', live, re.S).group(1)
    assert "<code>aaaaaaaaaa</code> · <code>bbbbbbbbbb</code> · <code>cccccccccc</code>" in step_one
    assert "<strong>lower</strong>: mid is slower like hi" in step_one
    assert f'href="/e/{"1" * 24}"' in step_one
    step_two = re.search(r'<tr id="step-2">(.*?)</tr>', live, re.S).group(1)
    assert (
        "<code>aaaaaaaaaa</code> · – · <code>bbbbbbbbbb</code>" in step_two and "queued" in step_two
    )
    second = bisect.steps_of(db_session=db_session, job_id=job.id)[-1]
    assert f'step 2 of <a href="/jobs/{job.id}">' in web.get(f"/jobs/{second.id}").text
    assert f'step 2 of <a href="/jobs/{job.id}">{job.id}</a>' in web.get("/jobs").text


def test_pages_are_gzipped_for_clients_that_accept_it_but_not_the_agents_loop(
    web: TestClient, db_session: Session, settings: Settings
) -> None:
    from coldbench.api.app import WORKER_PROTOCOL_PATH

    make_host(db_session, "studio-1")
    job = make_job(db_session, settings)
    evidence_id = publish_evidence(db_session, settings, job)
    for path in (f"/e/{evidence_id}", f"/e/{evidence_id}.md", "/jobs", f"/jobs/{job.id}"):
        zipped = web.get(path, headers={"Accept-Encoding": "gzip"})
        assert zipped.headers.get("content-encoding") == "gzip", path
        assert "Accept-Encoding" in zipped.headers["vary"]
        plain = web.get(path, headers={"Accept-Encoding": "identity"})
        assert "content-encoding" not in plain.headers, path
        # (the lists say "N s ago": only the immutable evidence reads the same twice)
        assert plain.text == zipped.text or not path.startswith("/e/"), path
    page = web.get(f"/e/{evidence_id}", headers={"Accept-Encoding": "gzip"})
    assert int(page.headers["content-length"]) < len(page.content) / 3
    # plotly.js is compressed once and cached by its route; the middleware leaves it alone.
    plotly = web.get("/static/plotly.min.js", headers={"Accept-Encoding": "gzip"})
    assert plotly.headers["content-encoding"] == "gzip" and len(plotly.content) > 1_000_000
    for path in (
        "/api/v1/leases",
        "/api/v1/workers/heartbeat",
        "/api/v1/workers/register",
        "/api/v1/runs/abc/artifacts/records.jsonl",
        "/api/v1/runs/abc/complete",
    ):
        assert WORKER_PROTOCOL_PATH.match(path), path
    assert not WORKER_PROTOCOL_PATH.match("/api/v1/jobs")


def test_evidence_answers_head_and_a_bad_id_reads_as_a_page_in_a_browser(
    web: TestClient, db_session: Session, settings: Settings
) -> None:
    make_host(db_session, "studio-1")
    job = make_job(db_session, settings)
    evidence_id = publish_evidence(db_session, settings, job)
    anonymous = TestClient(web.app)
    for suffix in ("", ".md", ".json", ".zip", ".html"):
        got = anonymous.get(f"/e/{evidence_id}{suffix}", headers={"Accept-Encoding": "identity"})
        head = anonymous.head(f"/e/{evidence_id}{suffix}", headers={"Accept-Encoding": "identity"})
        assert head.status_code == 200 and head.content == b"", suffix
        assert head.headers["content-type"] == got.headers["content-type"], suffix
        assert head.headers["content-length"] == str(len(got.content)), suffix
    browser = {"Accept": "text/html,application/xhtml+xml,*/*;q=0.8"}
    for bad in ("0" * 24, "not-an-id", "0" * 24 + ".md"):
        page = anonymous.get(f"/e/{bad}", headers=browser)
        assert page.status_code == 404 and page.headers["content-type"].startswith("text/html")
        assert "<h1>No such evidence</h1>" in page.text and "no evidence" in page.text
        api = anonymous.get(f"/e/{bad}", headers={"Accept": "application/json"})
        assert api.status_code == 404 and api.json()["detail"].startswith("no evidence")
    assert anonymous.head("/e/" + "0" * 24).status_code == 404


def test_one_pr_markdown_linked_on_the_page_the_md_url_and_for_a_comment(
    web: TestClient, db_session: Session, settings: Settings
) -> None:
    from coldbench.api.evidence import service as evidence_service

    make_host(db_session, "studio-1")
    job = make_job(db_session, settings)
    evidence_id = publish_evidence(db_session, settings, job)
    served = web.get(f"/e/{evidence_id}.md").text
    page = web.get(f"/e/{evidence_id}").text
    copied = re.search(r'<textarea id="cb-markdown" readonly>(.*?)</textarea>', page, re.S)
    assert unescape(copied.group(1)) == served  # what the browser shows and copies
    assert f"Evidence id: [`{evidence_id}`](http://testserver/e/{evidence_id})" in served
    assert "Evidence id: the first 24 hex digits" not in served
    assert "<details><summary>Variants as built</summary>" in served
    # What a pull-request comment posts: the same text for the same public URL.
    assert (
        evidence_service.pr_markdown(
            db_session=db_session,
            store=web.app.state.store,  # type: ignore[attr-defined]
            evidence_id=evidence_id,
            base_url="http://testserver/",
        )
        == served
    )
    # The job page's Markdown link is this URL.
    assert f'href="/e/{evidence_id}.md">Markdown</a>' in web.get(f"/jobs/{job.id}").text


def test_a_host_that_stopped_is_offline_and_the_lists_update_themselves(
    web: TestClient, db_session: Session, settings: Settings
) -> None:
    from datetime import timedelta

    host, _secret = make_host(db_session, "stopped-box")
    make_host(db_session, "live-box")
    host.last_heartbeat_at = utcnow() - timedelta(seconds=settings.lease_ttl_s + 5)
    db_session.commit()
    html = web.get("/hosts").text
    stopped = re.search(r'<tr id="host-stopped-box">(.*?)</tr>', html, re.S).group(1)
    assert ">offline</span>" in stopped and "ready" not in stopped
    live = re.search(r'<tr id="host-live-box">(.*?)</tr>', html, re.S).group(1)
    assert ">ready</span>" in live
    for path in ("/hosts", "/jobs"):
        page = web.get(path).text
        assert 'data-live-s="5"' in page and '<script src="/static/live.js"></script>' in page
    assert web.get("/static/live.js").status_code == 200


def test_jobs_list_shows_each_outcome_in_full(
    web: TestClient, db_session: Session, settings: Settings
) -> None:
    make_host(db_session, "studio-1")
    answered = make_job(db_session, settings)
    publish_evidence(db_session, settings, answered)
    failed = make_job(db_session, settings)
    reason = "variant base: ref no-such-branch not found in stub.git; " + "x" * 300
    failed.state, failed.reason = "failed", reason
    nothing = make_job(db_session, settings)
    nothing.state = "done"
    nothing.summary = {
        "bisect": {
            "direction": "slower",
            "final": True,
            "first_bad_commit": None,
            "reason": "too noisy: the bad side's interval is [0.313, 0.821]",
        }
    }
    db_session.commit()
    html = web.get("/jobs").text

    def row(job_id: str) -> str:
        return re.search(rf'<tr id="job-{job_id}">(.*?)</tr>', html, re.S).group(1)

    assert "faster" in row(answered.id) and "tone-ok" in row(answered.id)
    assert reason in row(failed.id) and "tone-bad" in row(failed.id)
    # A bisection that found nothing is done, but not an answer.
    assert "no single first commit: too noisy" in row(nothing.id)
    assert 'class="state state-done tone-warn"' in row(nothing.id)
    job_page = web.get(f"/jobs/{nothing.id}").text
    assert 'id="job-outcome">Done without an answer: no single first commit' in job_page


def test_cancel_asks_first_and_a_cancelled_run_says_so(
    web: TestClient, db_session: Session, settings: Settings
) -> None:
    host, _secret = make_host(db_session, "studio-1")
    make_host(db_session, "studio-2")
    job = make_job(db_session, settings, hosts=2)
    lease = agent_calls.claim_lease(
        db_session=db_session,
        settings=settings,
        host=host,
        report=run_claim.HostReport(fingerprint=fingerprint(hostname="studio-1")),
    )
    agent_calls.heartbeat(
        db_session=db_session,
        settings=settings,
        host_id=host.id,
        run_id=lease.run_id,
        attempt=lease.attempt,
        progress={"cells_done": 2, "cells_total": 8, "eta_s": 185.0},
    )
    page = web.get(f"/jobs/{job.id}").text
    # The button only opens a confirmation, which says what cancelling does.
    confirm = re.search(r'<details class="cancel" id="cancel">(.*?)</details>', page, re.S)
    assert confirm and "cannot be undone" in confirm.group(1)
    assert 'id="cancel-confirm">Yes, cancel this job</button>' in confirm.group(1)
    # One vocabulary: a leased run is running, like its job; the time left is shown.
    assert 'id="job-state">running' in page
    assert f'<tr id="run-{lease.run_id}">' in page
    leased = re.search(rf'<tr id="run-{lease.run_id}">(.*?)</tr>', page, re.S).group(1)
    assert ">running</span>" in leased and ">leased<" not in leased
    timing = re.search(r'<p class="hint" id="job-timing">(.*?)</p>', page).group(1)
    # counted down from the heartbeat (tests/web/test_timing.py has the rule)
    assert timing.startswith("Going for ")
    assert re.search(r"about 3 min [0-5] s of measuring left", timing)
    web.post(f"/jobs/{job.id}/cancel", data={"csrf_token": csrf_of(page)})
    page = web.get(f"/jobs/{job.id}").text
    assert 'id="cancel"' not in page
    runs = re.findall(r'<tr id="run-[^"]+">(.*?)</tr>', page, re.S)
    assert len(runs) == 2 and all(">cancelled</span>" in run for run in runs)
    assert "waiting for a host" not in page and "never leased" in page
    assert re.search(r'id="job-timing">Took \d+ s from submission to its cancelled state', page)


def test_a_commits_job_page_shows_base_head_and_the_commits_its_host_resolved(
    web: TestClient, db_session: Session, settings: Settings
) -> None:
    from coldbench.api.jobs import service as job_service
    from coldbench.evidence.analysis.commits import commits_spec
    from tests.api.factories import job_payload

    make_host(db_session, "studio-1", repositories={"mlx-lm": {"recipes": ["editable"]}})
    job = job_service.create_job(
        db_session=db_session,
        settings=settings,
        payload=job_payload(
            mode="commits",
            adapter="mlx-lm",
            repository="mlx-lm",
            variants=[{"name": "stock"}],
            contexts=[64],
            rounds=8,
            commits={"base": "main", "head": "my-pr", "alone": True},
        ),
    )
    # two variants per commit with `alone`, besides base and head
    assert job.spec.commits is not None
    assert job.spec.commits.max_commits == min(32, (settings.max_variants - 2) // 2)
    html = web.get(f"/jobs/{job.id}").text
    facts = re.search(r'<td id="commits-facts">(.*?)</td>', html, re.S).group(1)
    assert "<code>main..my-pr</code> left out of head, and alone on base" in facts
    assert "resolved by the host that runs it" in facts
    line = [c * 40 for c in "abc"]
    (run,) = job_service.job_runs(db_session=db_session, job_id=job.id)
    run.resolved_spec = commits_spec(job.spec, line)
    db_session.commit()
    html = web.get(f"/jobs/{job.id}").text
    listed = re.search(r'<span id="resolved-commits">(.*?)</span>', html, re.S).group(1)
    assert listed == f"<code>{'b' * 12}</code>, <code>{'c' * 12}</code>"


def test_evidence_whose_warm_canary_passed_is_marked_invalid_on_every_page(
    web: TestClient, db_session: Session, settings: Settings
) -> None:
    """engine/canary.py's canary judged cold (the cold check blind): the job page, the evidence
    page and its Markdown say the evidence is invalid before any verdict."""
    from tests.evidence.builders import provenance, record, simulate_run
    from tests.web.builders import publish_bundle

    make_host(db_session, "studio-1")
    job = make_job(db_session, settings)
    records = simulate_run(effects={"base": 1.0, "fast": 1.2}, contexts=(64, 128), rounds=8)
    canary = record(
        round=-2,
        order=-1,
        reason="warm canary (its prompt's first half was cached on purpose): passed as cold",
    )
    evidence_id = publish_bundle(
        db_session,
        settings,
        job,
        records=[*records, canary],
        provenances=[provenance()],
        baseline="base",
    )
    job_page = web.get(f"/jobs/{job.id}").text
    assert 'id="evidence-invalid"' in job_page and "warm canary" in job_page
    page = web.get(f"/e/{evidence_id}").text
    assert page.index('id="evidence-invalid"') < page.index('<section id="answer">')
    assert "**Evidence invalid:** Run r-1's warm canary" in web.get(f"/e/{evidence_id}.md").text
