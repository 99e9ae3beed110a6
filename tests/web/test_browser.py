"""The pages in a real browser: headless Chromium (Playwright) against a real stack.

Child processes, all stopped at the end: `coldbench server` (embedded SQLite), `coldbench
celery worker` (kombu's SQLAlchemy transport) and a `coldbench worker` agent enrolled with a
one-use token, measuring the micro model on this CPU. A job is submitted through the form, its
progress watched, the evidence page opened, the Markdown copied and the bundle downloaded and
verified with `coldbench verify`. Every request the browser makes must go to the test server.
Screenshots land in tests/_artifacts/ (git-ignored).
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, expect, sync_playwright

from coldbench.evidence.analysis.stats import units_for_verdict
from tests.conftest import REPO_ROOT
from tests.stack import Stack, running_stack

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ARTIFACTS = REPO_ROOT / "tests" / "_artifacts"
# .ci/services provides it there, or says how to; COLDBENCH_TEST_CHROMIUM points elsewhere.
CHROMIUM = os.environ.get("COLDBENCH_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
LAPTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}


def _git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=coldbench-tests", "-c", "user.email=t@coldbench.invalid", *args],
        cwd=repo,
        check=True,
        capture_output=True,
    )


def _wait_until(condition: Any, timeout_s: float, what: str, stack: Stack) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {n}\n{stack.log(n)}" for n in ("server", "celery", "agent"))
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}\n{logs}")
        time.sleep(0.3)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, micro_model_dir: Path) -> Iterator[Stack]:
    """The embedded default (SQLite, kombu's SQLAlchemy transport; preset:micro resolves to
    micro_model_dir) with two agents on this machine, local-1 and local-2."""
    root = tmp_path_factory.mktemp("stack")
    with running_stack(root, database="sqlite", server=False, api_key=None) as stack:
        enrollments = {
            name: stack.cli("admin", "enroll", "--labels", "lab:test")
            for name in ("local-1", "local-2")
        }
        stack.api_key = stack.cli("admin", "apikey", "browser-tester")
        # A repository on the host's allow-list: a small local git repository.
        repo = root / "stub-repo"
        (repo / "mlx_lm").mkdir(parents=True)
        (repo / "mlx_lm" / "__init__.py").write_text('STUB = "main"\n')
        _git(repo, "init", "-q", "-b", "main")
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "-m", "stub")
        # Two agents on this one machine: both report its hostname, so only their registered
        # names (local-1, local-2) tell them apart.
        for name in ("local-1", "local-2"):
            (root / f"{name}.toml").write_text(
                f'name = "{name}"\nlabels = ["lab:home"]\nstate_dir = "{name}-state"\n'
                'allow_presets = ["micro", "tiny"]\n'
                f'[repositories.stub]\nurl = "{repo}"\n'
                "[repositories.stub.recipes.editable]\n"
                'command = ["{python}", "-m", "pip", "install", "--no-deps", "-e", "."]\n'
            )
        stack.start_server()
        stack.start_celery()
        for name, log in (("local-1", "agent.log"), ("local-2", "local-2.log")):
            stack.start_agent(root / f"{name}.toml", token=enrollments[name], log=root / log)
        with stack.http() as http:
            _wait_until(
                lambda: len(http.get("/hosts").json()) == 2, 90, "both agents to register", stack
            )
        yield stack


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        yield browser
        browser.close()


@dataclass
class Session:
    context: BrowserContext
    page: Page
    requests: list[str]
    console_errors: list[str]

    def foreign_requests(self, base_url: str) -> list[str]:
        # data: and blob: URLs are made inside the page; they never touch the network.
        return [
            url
            for url in self.requests
            if not url.startswith(base_url + "/") and not url.startswith(("data:", "blob:"))
        ]


@pytest.fixture
def session(browser: Browser, stack: Stack) -> Iterator[Session]:
    """A logged-in browser context that records every request it makes."""
    context = browser.new_context(viewport=LAPTOP, accept_downloads=True, base_url=stack.url)
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=stack.url)
    requests: list[str] = []
    console_errors: list[str] = []
    context.on("request", lambda request: requests.append(request.url))
    page = context.new_page()
    page.on("console", lambda m: console_errors.append(m.text) if m.type == "error" else None)
    page.goto("/")
    expect(page).to_have_url(re.compile(r"/login\?next=/$"))
    page.fill("#api_key", stack.api_key)
    page.click("button[type=submit]")
    expect(page.locator("h1")).to_have_text("New benchmark job")
    try:
        yield Session(context, page, requests, console_errors)
    finally:
        context.close()


def _shot(page: Page, name: str, *, full_page: bool = True) -> Path:
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=full_page)
    return path


WIDER_THAN_VIEWPORT = """() => {
  const width = document.documentElement.clientWidth;
  if (document.documentElement.scrollWidth <= width) { return []; }
  return Array.from(document.querySelectorAll("body *"))
    .filter((e) => e.getBoundingClientRect().right > width + 1)
    .filter((e) => !e.parentElement.closest("table, pre, .chart"))
    .slice(0, 5)
    .map((e) => e.tagName + "#" + e.id + "." + e.className + " " + e.getBoundingClientRect().right);
}"""


def _assert_fits(page: Page) -> None:
    """Nothing makes the page wider than the screen (wide tables scroll inside themselves)."""
    # plotly redraws its charts some time after a resize: slow on a loaded machine. (Polled
    # from here: wait_for_function evaluates strings in the page, which its CSP forbids.)
    deadline = time.monotonic() + 20
    fits = "document.documentElement.scrollWidth <= document.documentElement.clientWidth"
    while not page.evaluate(fits) and time.monotonic() < deadline:
        page.wait_for_timeout(250)
    assert page.evaluate(WIDER_THAN_VIEWPORT) == []


def _fill_job(page: Page, **values: str) -> None:
    page.fill("input[name=variant-0-flags]", values.get("base_flags", "prefill_step_size=32"))
    page.fill("input[name=variant-1-flags]", values.get("cand_flags", ""))
    page.uncheck("input[name=contexts][value='4096']")
    page.fill("#custom_contexts", values.get("contexts", "64, 128"))
    page.fill("#rounds", "2")
    page.fill("#decode_tokens", "2")
    page.fill("#model", "preset:micro")


def test_submit_watch_progress_open_evidence_copy_and_verify(
    session: Session, stack: Stack, coldbench_cmd: list[str], tmp_path: Path
) -> None:
    page = session.page
    _fill_job(page, cand_flags="prefill_step_size=32, clear_cache=false")
    # A third variant whose flag implies stock's single chunk on these prompts: inert, which
    # the evidence page lists per context.
    page.fill("input[name=variant-2-name]", "wide")
    page.fill("input[name=variant-2-flags]", "prefill_step_size=4096")
    # Two rounds for 2 contexts x 2 candidates: the form warns, as it is typed, that they
    # cannot reach a verdict; the number it asks for makes the warning go.
    warning = page.locator("#rounds-warning")
    expect(warning).to_be_visible()
    expect(warning).to_contain_text(f"needs at least {units_for_verdict()} rounds")
    _shot(page, "form-rounds-warning")
    page.fill("#rounds", str(units_for_verdict()))
    expect(warning).to_be_hidden()
    _shot(page, "form-filled")
    page.click("button.primary")
    expect(page).to_have_url(re.compile(r"/jobs/[0-9a-f]{16}$"))
    job_id = page.url.rsplit("/", 1)[1]
    page.evaluate("window.__sameDocument = true")  # gone if the page ever reloads

    seen_done: list[int] = []
    seen_states: list[str] = []
    # Generous: this machine is shared, and under load a job can take minutes.
    deadline = time.monotonic() + 300
    while not page.locator("#evidence-link").is_visible():
        assert time.monotonic() < deadline, stack.log("agent") + stack.log("celery")
        seen_states.append(page.locator("#job-state").inner_text())
        assert seen_states[-1] not in ("failed", "cancelled"), (
            page.locator("#progress").inner_text() + stack.log("agent") + stack.log("celery")
        )
        cells = page.locator(".cells")
        if cells.count():
            seen_done.append(int(cells.first.get_attribute("data-done") or 0))
            if len(set(seen_done)) == 2 and seen_done[-1] != seen_done[-2]:
                _shot(page, "job-progress")  # the first time it moved
        time.sleep(0.25)
    assert page.evaluate("window.__sameDocument") is True, "the page updated itself in place"
    assert "running" in seen_states, seen_states
    assert seen_done and seen_done == sorted(seen_done), seen_done
    assert len(set(seen_done)) >= 2, f"progress never moved: {seen_done}"
    expect(page.locator("#job-state")).to_have_text("done")
    # The answer, once evidence exists: one sentence per context, then the verdict table.
    expect(page.locator("#answer ul.headline li")).to_have_count(2)
    expect(page.locator("#answer ul.headline li").first).to_contain_text("at 64 tokens")
    expect(page.locator("#answer table.verdicts tbody tr")).to_have_count(4)
    # A finished run shows its final count, not its last heartbeat's progress.
    expect(page.locator(".cells.final")).to_contain_text("cells recorded")
    assert "(last report)" not in page.locator("table.runs").inner_text()
    job_sentences = page.locator("#answer ul.headline li").all_inner_texts()
    _shot(page, "job-done")

    page.click("#evidence-link a >> nth=0")
    expect(page).to_have_url(re.compile(r"/e/[0-9a-f]{24}$"))
    evidence_id = page.url.rsplit("/", 1)[1]
    expect(page.locator("h1")).to_contain_text("cand")
    # The page opens with the answer: the same sentences, above the fold, before the rules.
    assert page.locator("#answer ul.headline li").all_inner_texts() == job_sentences
    answer_box = page.locator("#answer").bounding_box()
    assert answer_box and answer_box["y"] < LAPTOP["height"] / 2, answer_box
    table_box = page.locator("#verdicts table").first.bounding_box()
    assert table_box and table_box["y"] < LAPTOP["height"], table_box
    how_box = page.locator("#how-to-read").bounding_box()
    assert how_box and how_box["y"] > table_box["y"] + table_box["height"]
    expect(page.locator("#inert")).to_contain_text("64 tokens: wide (prefill_step_size)")
    # plotly.js came from the app and drew every chart.
    expect(page.locator("#fig-tps .main-svg").first).to_be_visible(timeout=60_000)
    assert page.locator(".chart .main-svg").count() >= 4
    _shot(page, "evidence-laptop")
    page.screenshot(path=str(ARTIFACTS / "evidence-page.png"))

    page.bring_to_front()  # the clipboard API wants a focused document
    page.click("#cb-copy-md")
    expect(page.locator("#cb-copy-status")).to_have_text("Copied.", timeout=20_000)
    markdown = page.evaluate("navigator.clipboard.readText()")
    assert f"[`{evidence_id}`]({stack.url}/e/{evidence_id})" in markdown
    assert "| context |" in markdown or "|---|" in markdown

    with page.expect_download() as download_info:
        page.click("#cb-download")
    bundle = tmp_path / download_info.value.suggested_filename
    download_info.value.save_as(bundle)
    assert bundle.name == f"coldbench-{evidence_id}.zip"
    verified = subprocess.run(
        [*coldbench_cmd, "verify", str(bundle)], capture_output=True, text=True, timeout=120
    )
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert evidence_id in verified.stdout + verified.stderr

    page.set_viewport_size(PHONE)
    _shot(page, "evidence-phone", full_page=False)
    _assert_fits(page)
    page.goto(f"/jobs/{job_id}")
    _shot(page, "job-phone", full_page=False)
    _assert_fits(page)
    page.goto("/hosts")
    expect(page.locator("#host-local-1")).to_contain_text("lab:home")
    _shot(page, "hosts-phone")
    _assert_fits(page)
    page.set_viewport_size(LAPTOP)
    _shot(page, "hosts")

    assert session.foreign_requests(stack.url) == []
    assert not [e for e in session.console_errors if "Content Security Policy" in e]


def test_form_errors_beside_fields_and_an_unknown_ref_fails_the_run(
    session: Session, stack: Stack
) -> None:
    page = session.page
    _fill_job(page, contexts="64, 12x")
    page.click("button.primary")
    error = page.locator("#contexts-field #err-contexts")
    expect(error).to_contain_text("'12x' is not a token count")
    expect(page.locator("#custom_contexts")).to_have_value("64, 12x")
    expect(page.locator("#custom_contexts")).to_have_attribute("aria-invalid", "true")
    _shot(page, "form-errors")
    page.set_viewport_size(PHONE)
    _shot(page, "form-errors-phone", full_page=False)
    _assert_fits(page)
    page.set_viewport_size(LAPTOP)

    # An unknown ref is only known to be unknown on the host: the job is accepted and its run
    # fails with the host's reason, shown on the job page.
    page.fill("#custom_contexts", "64")
    page.select_option("#repository", "stub")
    page.fill("#recipe", "editable")
    page.fill("input[name=variant-0-ref]", "no-such-branch")
    page.fill("input[name=variant-1-ref]", "main")
    page.fill("input[name=variant-1-flags]", "")
    page.click("button.primary")
    expect(page).to_have_url(re.compile(r"/jobs/[0-9a-f]{16}$"))
    expect(page.locator("#job-state")).to_have_text("failed", timeout=180_000)
    expect(page.locator("table.runs")).to_contain_text("ref 'no-such-branch' not found")
    _shot(page, "job-unknown-ref")
    assert session.foreign_requests(stack.url) == []


def test_two_hosts_sharing_a_hostname_are_shown_by_their_registered_names(
    session: Session, stack: Stack
) -> None:
    """Both agents run on this machine, so both report its hostname."""
    page = session.page
    # Blank: the builder's default for the job, enough for a verdict.
    expect(page.locator("#rounds")).to_have_value("")
    expect(page.locator("#rounds")).to_have_attribute("placeholder", "auto")
    _fill_job(page, contexts="64", cand_flags="prefill_step_size=64")
    page.fill("#rounds", str(units_for_verdict()))
    page.fill("#hosts", "2")
    expect(page.locator("#rounds-warning")).to_be_hidden()
    page.click("button.primary")
    expect(page).to_have_url(re.compile(r"/jobs/[0-9a-f]{16}$"))
    expect(page.locator("#evidence-link")).to_be_visible(timeout=300_000)
    hosts = page.locator("table.runs td[data-label=host]").all_inner_texts()
    assert sorted(hosts) == ["local-1", "local-2"], hosts
    page.click("#evidence-link a >> nth=0")
    expect(page).to_have_url(re.compile(r"/e/[0-9a-f]{24}$"))
    header = page.locator("#reproductions thead th").all_inner_texts()
    assert sorted(header[2:4]) == ["local-1", "local-2"], header
    lines = page.locator("#hosts li").all_inner_texts()
    named = sorted(line.split(" (")[0] for line in lines if line.startswith("Host: "))
    assert named == ["Host: local-1", "Host: local-2"], lines
    _shot(page, "evidence-two-hosts")
    assert session.foreign_requests(stack.url) == []
