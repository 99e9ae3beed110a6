"""The pages in headless Chromium, served by uvicorn in this process from a SQLite file, with
evidence published from simulated records (tests/evidence/builders.py): the first screen of an
A/B, an ablation and a bisection at 1280 and 390 px, the job and host lists updating
themselves, a failed job's reason in full, and cancel asking first.

Screenshots land in tests/_artifacts/ (git-ignored); docs/img/ holds copies of the evidence
ones (docs/WEB.md says how to repeat them).
"""

from __future__ import annotations

import os
import re
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import uvicorn
from playwright.sync_api import Browser, Page, expect, sync_playwright

from coldbench.api.app import create_app
from coldbench.api.database import upgrade_database
from coldbench.api.settings import Settings
from coldbench.evidence.contract.schemas import JobSpec
from tests.api.factories import make_api_key, make_host, make_job
from tests.conftest import REPO_ROOT
from tests.evidence.builders import provenance, record, simulate_run
from tests.web.builders import publish_bundle

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ARTIFACTS = REPO_ROOT / "tests" / "_artifacts"
# .ci/services provides it there, or says how to; COLDBENCH_TEST_CHROMIUM points elsewhere.
CHROMIUM = os.environ.get("COLDBENCH_TEST_CHROMIUM", "/usr/bin/chromium")
LAPTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}


@dataclass
class Served:
    url: str
    settings: Settings
    app: object
    api_key: str

    def session(self):  # noqa: ANN201 - a SQLAlchemy session of the served app
        return self.app.state.sessionmaker()  # type: ignore[attr-defined]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("served")
    database_url = f"sqlite:///{root / 'coldbench.db'}"
    upgrade_database(database_url)
    settings = Settings(
        database_url=database_url,
        artifact_dir=root / "artifacts",
        state_dir=root / "state",
        rehearse_at_start=False,
    )
    app = create_app(settings)
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    with app.state.sessionmaker() as db_session:
        api_key = make_api_key(db_session, "maintainer")
        make_host(db_session, "studio-1")
        make_host(db_session, "studio-2")
    try:
        yield Served(f"http://127.0.0.1:{port}", settings, app, api_key)
    finally:
        server.should_exit = True
        thread.join(timeout=20)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-gpu"]
        )
        yield browser
        browser.close()


@pytest.fixture
def page(browser: Browser, served: Served) -> Iterator[Page]:
    context = browser.new_context(viewport=LAPTOP, base_url=served.url)
    page = context.new_page()
    page.goto("/login")
    page.fill("#api_key", served.api_key)
    page.click("button[type=submit]")
    expect(page.locator("h1")).to_have_text("New benchmark job")
    try:
        yield page
    finally:
        context.close()


def _publish(served: Served, build: dict) -> str:
    with served.session() as db_session:
        job = make_job(db_session, served.settings)
        return publish_bundle(db_session, served.settings, job, **build)


def _ab(seed: int = 0) -> dict:
    """cand 57% slower while the baseline drifts further across the run; one invalid cell."""
    records = simulate_run(
        effects={"base": 1.0, "cand": 0.43},
        contexts=(512, 4096),
        rounds=8,
        drift_per_hour=-0.5,
        cell_s=150,
        noise=0.03,
        seed=seed,
    )
    records.append(
        record(
            variant="cand",
            round=8,
            context_tokens=512,
            prompt_tokens=512,
            status="invalid",
            reason="cached_tokens=64",
        )
    )
    measured = provenance()
    measured.targets = [
        measured.targets[0].model_copy(update={"variant": "base", "ref": "main"}),
        measured.targets[0].model_copy(
            update={
                "variant": "cand",
                "ref": "slow-prefill",
                "commit": "b" * 40,
                "flags": {"prefill_step_size": 512},
            }
        ),
    ]
    return {"records": records, "provenances": [measured], "baseline": "base"}


def _ablation() -> dict:
    spec = JobSpec.model_validate(
        {
            "mode": "ablation",
            "variants": [{"name": "cand"}],
            "contexts": [1024, 4096],
            "rounds": 8,
            "features": ["compile", "clear_cache=false"],
        }
    )
    effects = {"none": 1.0, "all": 1.2, "all-minus-compile": 1.05, "all-minus-clear_cache": 1.19}
    records = simulate_run(effects=effects, contexts=(1024, 4096), rounds=8, noise=0.01)
    return {"records": records, "provenances": [provenance()], "spec": spec}


def _bisection() -> dict:
    names = ["lo-b", "hi-c"]
    spec = JobSpec.model_validate(
        {
            "mode": "bisect",
            "adapter": "mlx-lm",
            "repository": "mlx-lm",
            "variants": [{"name": n, "ref": n[-1] * 40} for n in names],
            "contexts": [2048],
            "rounds": 8,
            "bisect": {
                "good": "v1.0",
                "bad": "main",
                "direction": "slower",
                # This step's line (lo, hi); the step before halved a..f to it.
                "line": [n[-1] * 40 for n in names],
                "steps": [
                    {
                        "lo": "a" * 40,
                        "mid": "c" * 40,
                        "hi": "f" * 40,
                        "decision": "lower",
                        "evidence_id": "1" * 24,
                    }
                ],
            },
        }
    )
    records = simulate_run(effects={"lo-b": 1.0, "hi-c": 0.8}, contexts=(2048,), rounds=8)
    measured = provenance()
    measured.targets = [
        measured.targets[0].model_copy(update={"variant": n, "commit": n[-1] * 40}) for n in names
    ]
    return {"records": records, "provenances": [measured], "spec": spec}


def _in_view(page: Page, selector: str) -> bool:
    box = page.locator(selector).first.bounding_box()
    viewport = page.viewport_size
    assert box and viewport, selector
    return box["y"] + box["height"] <= viewport["height"] and box["x"] + box["width"] <= (
        viewport["width"] + 1
    )


@pytest.mark.parametrize(
    ("name", "build"), [("ab", _ab), ("ablation", _ablation), ("bisect", _bisection)]
)
def test_evidence_first_screen_says_what_was_compared_and_what_undercuts_it(
    page: Page, served: Served, name: str, build: object
) -> None:
    evidence_id = _publish(served, build())  # type: ignore[operator]
    page.goto(f"/e/{evidence_id}")
    # On the first screen at 1280 px: what was compared, the answer, what undercuts it.
    for selector in ("#compared", "#answer", "#caveats"):
        assert _in_view(page, selector), selector
    compared = page.locator("#compared").inner_text()
    assert "studio-1" in compared and "measured on" in compared
    if name == "ab":
        assert "cand @ slow-prefill bbbbbbbbbbbb · prefill_step_size=512" in compared
        caveats = page.locator("#caveats li").all_inner_texts()
        assert any(re.match(r"The baseline drifted -\d+\.\d+% across run", c) for c in caveats)
        assert any(c.startswith("1 cells were invalid") for c in caveats), caveats
        assert _in_view(page, "#verdicts table.verdicts")
    if name == "ablation":
        # One sentence, then the leave-one-out table, both on the first screen.
        expect(page.locator("#answer li")).to_have_count(1)
        expect(page.locator("#answer li")).to_contain_text("compile pays at 1024, 4096 tokens")
        assert _in_view(page, "#ablation table")
    if name == "bisect":
        expect(page.locator("#answer li")).to_contain_text("First slower commit at 2048 tokens")
    page.screenshot(path=str(ARTIFACTS / f"evidence-{name}.png"))
    page.set_viewport_size(PHONE)
    page.wait_for_timeout(300)
    page.screenshot(path=str(ARTIFACTS / f"evidence-{name}-phone.png"))
    # At 390 px the verdict tables keep ratio, p and verdict inside the screen's width.
    for table in page.locator("table.verdicts").all():
        headers = table.locator("thead th").all()
        for cell in headers:
            text = cell.inner_text()
            if text.startswith(("ratio", "all /", "p (", "verdict")):
                box = cell.bounding_box()
                assert box and box["x"] + box["width"] <= PHONE["width"], (name, text, box)


def test_lists_update_themselves_and_a_failed_reason_is_shown_whole(
    page: Page, served: Served
) -> None:
    reason = "variant base: ref no-such-branch not found in stub.git (" + "detail " * 40 + ")"
    with served.session() as db_session:
        failed = make_job(db_session, served.settings)
        failed.state, failed.reason = "failed", reason
        db_session.commit()
    page.goto("/jobs")
    cell = page.locator(f"#job-{failed.id} td.outcome")
    expect(cell).to_have_text(reason)
    box = cell.bounding_box()
    assert box and box["x"] + box["width"] <= LAPTOP["width"], box
    assert page.evaluate("document.documentElement.scrollWidth") <= LAPTOP["width"]
    page.screenshot(path=str(ARTIFACTS / "jobs.png"))
    page.evaluate("window.__sameDocument = true")
    with served.session() as db_session:
        later = make_job(db_session, served.settings)
    expect(page.locator(f"#job-{later.id}")).to_be_visible(timeout=20_000)
    assert page.evaluate("window.__sameDocument") is True  # updated in place, not reloaded
    page.goto(f"/jobs/{failed.id}")
    reason_box = page.locator("#job-reason").bounding_box()
    assert reason_box and reason_box["x"] + reason_box["width"] <= LAPTOP["width"]
    expect(page.locator("#job-reason")).to_have_text(reason)

    page.goto("/hosts")
    expect(page.locator("#host-studio-1 td[data-label=health]")).to_have_text("ready")
    with served.session() as db_session:
        make_host(db_session, "studio-3")
    expect(page.locator("#host-studio-3")).to_be_visible(timeout=20_000)


def test_cancel_asks_before_it_cancels(page: Page, served: Served) -> None:
    with served.session() as db_session:
        job = make_job(db_session, served.settings)
    page.goto(f"/jobs/{job.id}")
    confirm = page.locator("#cancel-confirm")
    expect(confirm).to_be_hidden()
    page.click("#cancel summary")
    expect(confirm).to_be_visible()
    page.screenshot(path=str(ARTIFACTS / "job-cancel-confirm.png"))
    confirm.click()
    expect(page.locator("#job-state")).to_have_text("cancelled")
    expect(page.locator("table.runs td[data-label=host]")).to_have_text("never leased")
    expect(page.locator("table.runs td[data-label=state]")).to_have_text("cancelled")


def test_screens_leave_no_foreign_request(browser: Browser, served: Served) -> None:
    """The evidence page fetches only from its own server (plotly.js included)."""
    evidence_id = _publish(served, _ab(seed=1))
    context = browser.new_context(viewport=LAPTOP, base_url=served.url)
    requests: list[str] = []
    context.on("request", lambda request: requests.append(request.url))
    page = context.new_page()
    page.goto(f"/e/{evidence_id}")
    expect(page.locator("#fig-tps .main-svg").first).to_be_visible(timeout=60_000)
    context.close()
    assert all(url.startswith(served.url + "/") or url.startswith("data:") for url in requests)
    assert Path(ARTIFACTS).exists()
