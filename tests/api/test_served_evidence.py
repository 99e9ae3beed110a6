"""Evidence as served: digests checked on each request, security headers, escaped Markdown,
damaged zips answered clearly, and `coldbench verify --expect`."""

from __future__ import annotations

import io
import subprocess
import zipfile
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from coldbench.api.evidence import page as evidence_pages
from coldbench.api.evidence.models import Evidence
from coldbench.api.settings import Settings
from coldbench.evidence.bundles.bundle import build_bundle, verify_bundle, write_bundle, zip_bytes
from coldbench.evidence.contract.canonical import sha256_hex
from tests.api.factories import make_host, make_job
from tests.evidence.builders import provenance, simulate_run
from tests.web.builders import publish_evidence

SUFFIXES = ["", ".html", ".md", ".json", ".zip"]
# The stored file each URL is made from (the PR Markdown: the bundle's zip).
STORED_NAME = {
    "": "page.html",
    ".html": "report.html",
    ".md": "bundle.zip",
    ".json": "summary.json",
    ".zip": "bundle.zip",
}


@pytest.fixture
def evidence_id(client: TestClient, db_session: Session, settings: Settings) -> str:
    make_host(db_session, "studio-1")
    return publish_evidence(db_session, settings, make_job(db_session, settings))


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_altered_stored_evidence_is_409_not_served(
    client: TestClient, db_session: Session, evidence_id: str, suffix: str
) -> None:
    assert client.get(f"/e/{evidence_id}{suffix}").status_code == 200
    row = db_session.get(Evidence, evidence_id)
    entry = row.files[STORED_NAME[suffix]]
    path = client.app.state.store.path(entry["sha256"])  # type: ignore[attr-defined]
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit, same size
    path.write_bytes(bytes(data))
    response = client.get(f"/e/{evidence_id}{suffix}")
    assert response.status_code == 409, response.text
    detail = response.json()["detail"]
    assert STORED_NAME[suffix] in detail and "no longer matches" in detail
    assert "immutable" not in response.headers.get("cache-control", "")


def test_the_page_stored_at_publishing_is_served_with_the_requests_url(
    client: TestClient, db_session: Session, evidence_id: str
) -> None:
    row = db_session.get(Evidence, evidence_id)
    store = client.app.state.store  # type: ignore[attr-defined]
    stored = store.read_bytes(row.files["page.html"]["sha256"])
    placeholder = evidence_pages.page_url_placeholder(row.manifest_sha256)
    assert stored.count(placeholder.encode()) == 1  # the Markdown's link to this page
    here = client.get(f"/e/{evidence_id}")
    there = client.get(f"/e/{evidence_id}", headers={"Host": "evidence.example:8443"})
    for response, url in (
        (here, f"http://testserver/e/{evidence_id}"),
        (there, f"http://evidence.example:8443/e/{evidence_id}"),
    ):
        assert response.status_code == 200
        assert f"[`{evidence_id}`]({url})" in response.text
        assert placeholder not in response.text
        assert len(response.content) == len(stored) - len(placeholder) + len(url)
    assert here.headers["etag"] != there.headers["etag"]  # two URLs, two entities
    repeat = client.get(f"/e/{evidence_id}", headers={"If-None-Match": here.headers["etag"]})
    assert repeat.status_code == 304 and not repeat.content
    other = client.get(
        f"/e/{evidence_id}",
        headers={"If-None-Match": here.headers["etag"], "Host": "evidence.example:8443"},
    )
    assert other.status_code == 200
    head = client.head(f"/e/{evidence_id}")
    assert head.status_code == 200 and head.headers["etag"] == here.headers["etag"]
    # The request's Host is escaped where it lands in the page, as every other value (this
    # is one Starlette takes as the base URL; it falls back to its default for `<` or `"`).
    odd = client.get(f"/e/{evidence_id}", headers={"Host": "a&b"})
    assert odd.status_code == 200
    assert f"(http://a&amp;b/e/{evidence_id})" in odd.text and "http://a&b/" not in odd.text


def test_evidence_published_without_a_stored_page_renders_the_same_page(
    client: TestClient, db_session: Session, evidence_id: str
) -> None:
    stored = client.get(f"/e/{evidence_id}")
    row = db_session.get(Evidence, evidence_id)
    row.files = {name: entry for name, entry in row.files.items() if name != "page.html"}
    db_session.commit()
    rendered = client.get(f"/e/{evidence_id}")
    assert rendered.status_code == 200
    assert rendered.content == stored.content
    assert rendered.headers["cache-control"] == stored.headers["cache-control"]
    again = client.get(f"/e/{evidence_id}", headers={"If-None-Match": rendered.headers["etag"]})
    assert again.status_code == 304


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_evidence_outputs_carry_csp_and_nosniff(
    client: TestClient, evidence_id: str, suffix: str
) -> None:
    response = client.get(f"/e/{evidence_id}{suffix}")
    assert response.status_code == 200
    assert response.headers["x-content-type-options"] == "nosniff"
    csp = response.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in csp
    if suffix in (".md", ".json", ".zip"):
        assert "default-src 'none'" in csp and "sandbox" in csp


def test_pages_copy_paste_commands_name_the_evidence_id(
    client: TestClient, evidence_id: str
) -> None:
    html = client.get(f"/e/{evidence_id}").text
    command = f"coldbench verify --expect {evidence_id} coldbench-{evidence_id}.zip"
    assert html.count(command) >= 2  # the report's own section and the PR Markdown


def test_corrupt_deflate_stream_is_a_clear_answer(
    client: TestClient, db_session: Session, evidence_id: str, tmp_path: Path
) -> None:
    row = db_session.get(Evidence, evidence_id)
    store = client.app.state.store  # type: ignore[attr-defined]
    damaged = corrupt_deflate(store.read_bytes(row.files["bundle.zip"]["sha256"]))
    blob = store.put_bytes(damaged)  # stored as such: the digest matches the damaged bytes
    row.files = {**row.files, "bundle.zip": {"sha256": blob.sha256, "bytes": blob.bytes}}
    db_session.commit()
    page = client.get(f"/e/{evidence_id}")
    assert page.status_code == 200  # the bundle's own report.html, checked, instead
    assert page.headers["x-content-type-options"] == "nosniff"
    bundle = tmp_path / "damaged.zip"
    bundle.write_bytes(damaged)
    done = _verify_cli(bundle)
    assert done.returncode == 1
    assert len(done.stdout.strip().splitlines()) == 1 and "unreadable" in done.stdout
    assert "Traceback" not in done.stderr


def corrupt_deflate(data: bytes) -> bytes:
    """The zip with the middle of its largest deflated entry scrambled (headers intact)."""
    archive = zipfile.ZipFile(io.BytesIO(data))
    info = max(archive.infolist(), key=lambda i: i.compress_size)
    assert info.compress_type == zipfile.ZIP_DEFLATED
    name_len = int.from_bytes(data[info.header_offset + 26 : info.header_offset + 28], "little")
    extra_len = int.from_bytes(data[info.header_offset + 28 : info.header_offset + 30], "little")
    start = info.header_offset + 30 + name_len + extra_len
    damaged = bytearray(data)
    for offset in range(start + 2, start + min(info.compress_size, 64)):
        damaged[offset] = 0xFF
    return bytes(damaged)


def _verify_cli(path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    import sys

    return subprocess.run(
        [sys.executable, "-m", "coldbench", "verify", *extra, str(path)],
        capture_output=True,
        text=True,
        check=False,
    )


def _bundle(tmp_path: Path, name: str, seed: int) -> tuple[Path, str]:
    records = simulate_run(
        effects={"base": 1.0, "fast": 1.1}, contexts=(64,), rounds=3, run_id="r-1", seed=seed
    )
    written = write_bundle(
        tmp_path / name, records=records, provenances=[provenance(run_id="r-1")], baseline="base"
    )
    return written.path, written.evidence_id


def test_verify_expect_refuses_a_swapped_bundle(tmp_path: Path) -> None:
    sent, sent_id = _bundle(tmp_path, "sent", seed=1)
    swapped, swapped_id = _bundle(tmp_path, "swapped", seed=2)
    assert sent_id != swapped_id and verify_bundle(swapped).is_intact
    refused = verify_bundle(swapped, expect=sent_id)
    assert not refused.is_intact and f"not the expected {sent_id}" in refused.problems[0]
    assert verify_bundle(sent, expect=sent_id).is_intact
    done = _verify_cli(swapped, "--expect", sent_id)
    assert done.returncode == 1 and f"not the expected {sent_id}" in done.stdout
    ok = _verify_cli(sent, "--expect", sent_id)
    assert ok.returncode == 0 and sent_id in ok.stdout


def test_summary_md_escapes_host_supplied_html() -> None:
    from coldbench.evidence.rendering.markdown import render_summary_md

    hostile = '<img src=x onerror="alert(1)">'
    records = simulate_run(
        effects={"base": 1.0, "fast": 1.1}, contexts=(64,), rounds=3, run_id="r-1", seed=0
    )
    reason = f"`{hostile}` ```\n{hostile}"
    records = [
        r.model_copy(update={"status": "invalid", "reason": reason}) if i < 2 else r
        for i, r in enumerate(records)
    ]
    # A command is one line (evidence/contract/boundary.py); a reason, a paragraph, may break lines.
    prov = provenance(run_id="r-1", hostname=hostile, command=f"``` {hostile} ```")
    files, summary = build_bundle(records=records, provenances=[prov], baseline="base")
    for text in (files["summary.md"].decode(), render_summary_md(summary, [prov])):
        assert "<img" not in text and "&lt;img" in text
        assert "<details><summary>How to read this</summary>" in text  # ours, kept
    assert sha256_hex(zip_bytes(files))  # the bundle still assembles
