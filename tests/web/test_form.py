"""The job form: parsing, errors beside their fields, CSRF, and submission through the same
service as the JSON API."""

from __future__ import annotations

import re
from typing import Any, get_args

import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from coldbench.api.jobs.models import Job
from coldbench.api.pages import form as job_form
from coldbench.api.settings import Settings
from coldbench.evidence.contract.schemas import Residency
from tests.api.factories import make_host
from tests.web.builders import csrf_of


def test_error_fields_map_to_form_inputs() -> None:
    rows = {0: 0, 1: 2}  # spec variant 1 came from the form's third row
    assert job_form.form_field("contexts", rows) == "contexts"
    assert job_form.form_field("host_labels", rows) == "host_labels"
    assert job_form.form_field("adapter", rows) == "adapter"
    assert job_form.form_field("variants.1.flags", rows) == "variant-2-flags"
    assert job_form.form_field("variants.0.recipe", rows) == "recipe"
    assert job_form.form_field("baseline", rows) == "variant-0-name"
    assert job_form.form_field(None, rows) == job_form.FORM_ERROR
    assert job_form.form_field("schema", rows) == job_form.FORM_ERROR


def _fields(page_html: str, **overrides: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "csrf_token": csrf_of(page_html),
        "repository": "",
        "recipe": "",
        "variant-0-name": "base",
        "variant-0-flags": "prefill_step_size=64",
        "variant-1-name": "cand",
        "variant-1-flags": "prefill_step_size=64, clear_cache=false",
        "mode": "ab",
        "custom_contexts": "64, 128",
        "rounds": "2",
        "decode_tokens": "2",
        "model": "preset:tiny",
        "host_labels": "",
        "hosts": "1",
        "precision": "0.05",
        "seed": "0",
    }
    fields.update(overrides)
    return fields


def _errors(html: str) -> dict[str, str]:
    return dict(re.findall(r'<p class="error" id="err-([\w-]+)" role="alert">([^<]*)</p>', html))


def _job_count(db_session: Session) -> int:
    return db_session.scalar(sa.select(sa.func.count()).select_from(Job)) or 0


def test_form_requires_login(client: TestClient) -> None:
    response = client.get("/", follow_redirects=False)
    assert response.status_code == 303
    assert response.headers["location"] == "/login?next=/"


def test_form_lists_allow_listed_repositories_and_presets(
    web: TestClient, db_session: Session
) -> None:
    make_host(db_session, "studio-1", repositories={"mlx-lm": {"recipes": ["editable"]}})
    html = web.get("/").text
    assert re.search(r'<option value=""[^>]*>embedded engine', html)
    assert '<option value="mlx-lm">mlx-lm (recipes: editable)</option>' in html
    for size in job_form.CONTEXT_PRESETS:
        assert f'name="contexts" value="{size}"' in html
    assert 'name="viewport"' in html


def test_submit_creates_the_job_and_redirects_to_its_page(
    web: TestClient, db_session: Session, api_key: str
) -> None:
    make_host(db_session, "studio-1")
    fields = _fields(web.get("/").text, contexts=["4096"])
    response = web.post("/", data=fields, follow_redirects=False)
    assert response.status_code == 303, _errors(response.text)
    job_id = response.headers["location"].removeprefix("/jobs/")
    job = db_session.get(Job, job_id)
    assert job is not None
    assert job.spec.contexts == [64, 128, 4096]
    assert job.spec.variants[1].model_dump() == {
        "name": "cand",
        "ref": None,
        "recipe": None,
        "flags": {"prefill_step_size": 64, "clear_cache": False},
    }
    assert job.spec.adapter == "embedded" and job.spec.repository is None
    assert job.spec.residency == "auto"  # the form's default
    assert job.submitted_by == api_key.split("_")[1]
    page = web.get(response.headers["location"])
    assert page.status_code == 200 and job_id in page.text


def test_the_form_asks_for_a_residency_and_shows_a_bad_one_beside_it(
    web: TestClient, db_session: Session
) -> None:
    make_host(db_session, "studio-1")
    page = web.get("/").text
    assert all(f'<option value="{choice}"' in page for choice in get_args(Residency))
    response = web.post("/", data=_fields(page, residency="in-turns"), follow_redirects=False)
    assert response.status_code == 303, _errors(response.text)
    job = db_session.get(Job, response.headers["location"].removeprefix("/jobs/"))
    assert job is not None and job.spec.residency == "in-turns"
    count = _job_count(db_session)
    response = web.post("/", data=_fields(web.get("/").text, residency="both"))
    assert _errors(response.text) == {
        "residency": "&#39;both&#39;: give auto, side-by-side or in-turns"
    }, _errors(response.text)
    assert _job_count(db_session) == count


def test_bad_context_list_is_shown_beside_contexts_and_nothing_is_created(
    web: TestClient, db_session: Session
) -> None:
    make_host(db_session, "studio-1")
    before = _job_count(db_session)
    response = web.post("/", data=_fields(web.get("/").text, custom_contexts="64, 12x"))
    assert response.status_code == 422
    errors = _errors(response.text)
    assert "12x" in errors["contexts"] and "not a token count" in errors["contexts"]
    assert 'value="64, 12x"' in response.text  # what was typed is kept
    assert _job_count(db_session) == before


def test_unsafe_ref_and_bad_flags_are_shown_beside_their_row(
    web: TestClient, db_session: Session
) -> None:
    make_host(db_session, "studio-1", repositories={"mlx-lm": {"recipes": ["editable"]}})
    response = web.post(
        "/",
        data=_fields(
            web.get("/").text,
            repository="mlx-lm",
            recipe="editable",
            **{"variant-0-ref": "main", "variant-1-ref": "--upload-pack=x"},
        ),
    )
    assert response.status_code == 422
    assert "is not a plain branch" in _errors(response.text)["variant-1-ref"]
    response = web.post("/", data=_fields(web.get("/").text, **{"variant-1-flags": "compile"}))
    assert "name=value" in _errors(response.text)["variant-1-flags"]


def test_a_non_finite_flag_value_is_shown_beside_its_row(
    web: TestClient, db_session: Session
) -> None:
    """`inf`, `nan` and `1e999` read as floats JSON cannot hold: refused at the row, never a
    500."""
    make_host(db_session, "studio-1")
    before = _job_count(db_session)
    for value in ("inf", "nan", "1e999"):
        flags = {"variant-1-flags": f"prefill_step_size={value}"}
        response = web.post("/", data=_fields(web.get("/").text, **flags))
        assert response.status_code == 422, response.text[:200]
        assert "prefill_step_size" in _errors(response.text)["variant-1-flags"]
    assert _job_count(db_session) == before


def test_service_refusals_land_beside_their_fields(web: TestClient, db_session: Session) -> None:
    make_host(db_session, "studio-1", labels=["lab:home"])
    response = web.post("/", data=_fields(web.get("/").text, host_labels="gpu:h200"))
    assert response.status_code == 422
    assert "lacks labels gpu:h200" in _errors(response.text)["host_labels"]
    response = web.post("/", data=_fields(web.get("/").text, rounds="100000"))
    assert "at most" in _errors(response.text)["rounds"]
    response = web.post("/", data=_fields(web.get("/").text, hosts="2"))
    assert "only 1 can run it" in _errors(response.text)["hosts"]
    response = web.post("/", data=_fields(web.get("/").text, mode="ablation"))
    assert "at least one feature" in _errors(response.text)["features"]
    response = web.post("/", data=_fields(web.get("/").text, **{"variant-1-name": "base"}))
    assert "unique" in _errors(response.text)["variant-1-name"]  # the row that repeats it


def test_one_submit_shows_every_problem_beside_its_field(
    web: TestClient, db_session: Session
) -> None:
    """A flag the engine does not take, a size over the service's limit, a value out of range
    and a text that is no number: one submit, each said in words beside its own input."""
    make_host(db_session, "studio-1")
    before = _job_count(db_session)
    page = web.get("/").text
    response = web.post(
        "/",
        data=_fields(
            page,
            **{"variant-1-flags": "bogus_flag=3"},
            rounds="100000",
            precision="0.7",
            decode_tokens="many",
        ),
    )
    assert response.status_code == 422
    errors = _errors(response.text)
    assert errors == {
        "variant-1-flags": "the embedded adapter has no flag bogus_flag (prefill_step_size, "
        "clear_cache, compile, fused_swiglu, fused_add_rms_norm)",
        "rounds": "rounds=100000; at most 100 allowed",
        "precision": "0.7: give at most 0.5",
        "decode_tokens": "&#39;many&#39; is not a whole number",
    }, errors
    assert "Input should be" not in response.text
    assert _job_count(db_session) == before


def test_the_embedded_engine_is_offered_no_refs(web: TestClient, db_session: Session) -> None:
    """Refs name commits of a repository: the embedded engine's form shows no ref column, and
    a bisection's form no candidate rows; the other modes' fields are hidden."""
    make_host(db_session, "studio-1", repositories={"mlx-lm": {"recipes": ["editable"]}})
    page = web.get("/").text
    ref_cells = re.findall(r'<t[dh][^>]*class="ref-cell"[^>]*>', page)
    assert ref_cells and all(" hidden" in cell for cell in ref_cells)
    assert re.search(r'<div class="row" id="bisect-fields" data-modes="bisect" hidden>', page)
    errors_page = web.post(
        "/", data=_fields(page, mode="bisect", repository="mlx-lm", good="v1")
    ).text
    candidates = re.findall(r'<tr class="candidate"[^>]*>', errors_page)
    assert candidates and all(" hidden" in row for row in candidates)
    assert not re.findall(r'<t[dh][^>]*class="ref-cell" hidden', errors_page)
    assert "bisect needs bad: a ref that is changed" in _errors(errors_page)["bad"]


def test_missing_or_foreign_csrf_token_is_refused(
    web: TestClient, client: TestClient, db_session: Session
) -> None:
    make_host(db_session, "studio-1")
    before = _job_count(db_session)
    fields = _fields(web.get("/").text)
    assert web.post("/", data={**fields, "csrf_token": ""}).status_code == 403
    # A token of another session (the login form's, bound to no session) does not pass.
    anonymous = TestClient(client.app)
    foreign = csrf_of(anonymous.get("/login").text)
    assert web.post("/", data={**fields, "csrf_token": foreign}).status_code == 403
    # The right field but no cookie (a cross-site post that cannot read the cookie's pair).
    web.cookies.delete("cb_csrf")
    assert web.post("/", data=fields).status_code == 403
    assert _job_count(db_session) == before


SERVER_OFFER = {
    "adapter": "openai-server",
    "recipes": ["editable"],
    "options": {"fast": {"type": "bool"}, "prefill_step_size": {"type": "int", "min": 1}},
}


def test_form_offers_each_repositorys_adapters_and_submits_a_server_job(
    web: TestClient, db_session: Session
) -> None:
    make_host(db_session, "studio-1", repositories={"mlx-lm": {"recipes": ["editable"]}})
    make_host(db_session, "studio-2", repositories={"mlx-server": SERVER_OFFER})
    html = web.get("/").text
    assert '<option value="mlx-lm">mlx-lm (for mlx-lm)</option>' in html
    assert '<option value="openai-server">openai-server (for mlx-server)</option>' in html
    fields = _fields(
        html,
        repository="mlx-server",
        recipe="editable",
        **{
            "variant-0-ref": "main",
            "variant-0-flags": "fast=0",
            "variant-1-ref": "main",
            "variant-1-flags": "fast=1",
        },
    )
    response = web.post("/", data=fields, follow_redirects=False)
    assert response.status_code == 303, _errors(response.text)
    job = db_session.get(Job, response.headers["location"].removeprefix("/jobs/"))
    assert job is not None and job.spec.adapter == "openai-server"


def test_adapter_and_option_refusals_land_beside_their_fields(
    web: TestClient, db_session: Session
) -> None:
    make_host(db_session, "studio-2", repositories={"mlx-server": SERVER_OFFER})
    base = {"repository": "mlx-server", "variant-0-ref": "main", "variant-1-ref": "main"}
    response = web.post(
        "/",
        data=_fields(
            web.get("/").text,
            **base,
            adapter="mlx-lm",
            **{"variant-0-flags": "", "variant-1-flags": ""},
        ),
    )
    assert response.status_code == 422
    assert (
        "drives mlx-server with the openai-server adapter, not mlx-lm"
        in (_errors(response.text)["adapter"])
    )
    response = web.post(
        "/",
        data=_fields(
            web.get("/").text, **base, **{"variant-0-flags": "", "variant-1-flags": "turbo=1"}
        ),
    )
    assert "declares no option turbo" in _errors(response.text)["variant-1-flags"]
    response = web.post(
        "/",
        data=_fields(
            web.get("/").text,
            **base,
            **{"variant-0-flags": "", "variant-1-flags": "prefill_step_size=0"},
        ),
    )
    assert "0 is below the minimum 1" in _errors(response.text)["variant-1-flags"]


def test_a_repository_hosts_drive_two_ways_needs_the_adapter_chosen(
    web: TestClient, db_session: Session
) -> None:
    make_host(db_session, "studio-1", repositories={"mlx-lm": {"recipes": ["editable"]}})
    make_host(db_session, "studio-2", repositories={"mlx-lm": SERVER_OFFER})
    fields = _fields(
        web.get("/").text,
        repository="mlx-lm",
        **{"variant-0-ref": "main", "variant-1-ref": "main", "variant-1-flags": ""},
    )
    response = web.post("/", data=fields)
    assert (
        "hosts drive mlx-lm with mlx-lm and openai-server: choose the adapter"
        in (_errors(response.text)["adapter"])
    )
    response = web.post("/", data={**fields, "adapter": "mlx-lm"}, follow_redirects=False)
    assert response.status_code == 303, _errors(response.text)


def test_default_rounds_can_reach_a_verdict_and_fewer_are_warned_about(
    web: TestClient, db_session: Session
) -> None:
    import html as html_lib
    import json

    from coldbench.evidence.analysis.stats import units_for_verdict
    from coldbench.evidence.spec.job_options import default_rounds

    make_host(db_session, "studio-1")
    page = web.get("/").text
    # Left blank, rounds are resolved by the service as for every door: measuring until
    # decided (the form's default too), four first looks, within the service's time budget.
    assert re.search(r'id="rounds" name="rounds" inputmode="numeric" value=""', page)
    assert '<option value="" selected>default: decided</option>' in page
    assert '<option value="rounds">rounds</option>' in page
    assert 'name="budget_minutes" inputmode="decimal" value="" placeholder="service default"' in (
        page
    )
    assert "the service&#39;s default_budget_minutes (60 unless it sets another)" in page
    blank = web.post("/", data=_fields(page, rounds=""), follow_redirects=False)
    assert blank.status_code == 303, _errors(blank.text)
    job = db_session.get(Job, blank.headers["location"].removeprefix("/jobs/"))
    assert job.spec.until == "decided" and job.spec.budget_minutes == 60
    assert job.spec.rounds == default_rounds(job.spec) == 4 * units_for_verdict() == 40
    fixed = web.post("/", data=_fields(page, rounds="", until="rounds"), follow_redirects=False)
    assert fixed.status_code == 303, _errors(fixed.text)
    job = db_session.get(Job, fixed.headers["location"].removeprefix("/jobs/"))
    assert (job.spec.until, job.spec.rounds, job.spec.budget_minutes) == ("rounds", 10, None)
    assert 'id="rounds-warning"' not in web.get(blank.headers["location"]).text
    table = re.search(r'data-rounds-needed="([^"]+)"', page).group(1)
    needed = json.loads(html_lib.unescape(table))
    assert needed["2"] == units_for_verdict() and needed["8"] == units_for_verdict()
    assert '<script src="/static/form.js"></script>' in page
    assert web.get("/static/form.js").status_code == 200
    # Too few rounds for two contexts: accepted, and the job page says why it cannot conclude.
    response = web.post("/", data=_fields(page, rounds="3"), follow_redirects=False)
    assert response.status_code == 303
    job_page = web.get(response.headers["location"]).text
    warning = re.search(r'id="rounds-warning">([^<]*)<', job_page)
    assert warning and f"needs at least {units_for_verdict()} rounds" in warning.group(1)
    assert "3 rounds cannot reach a verdict: the robust interval" in warning.group(1)
    enough = web.post(
        "/", data=_fields(page, rounds=str(units_for_verdict())), follow_redirects=False
    )
    assert 'id="rounds-warning"' not in web.get(enough.headers["location"]).text


def test_a_default_above_the_services_limit_is_said_beside_the_rounds(
    web: TestClient, db_session: Session, settings: Settings
) -> None:
    """The service resolves a blank rounds field (checked_spec): where its limit is below the
    default, the refusal lands beside the rounds input, and rounds within it are taken."""
    make_host(db_session, "studio-1")
    settings.max_rounds = 30
    page = web.get("/").text
    response = web.post("/", data=_fields(page, rounds=""))
    assert response.status_code == 422
    assert _errors(response.text)["rounds"] == (
        "this job&#39;s default is 40 rounds, more than this service&#39;s limit of 30: give "
        "rounds (at most 30), or fewer rounds per process"
    )
    taken = web.post("/", data=_fields(page, rounds="30"), follow_redirects=False)
    assert taken.status_code == 303, _errors(taken.text)


def test_history_mode_is_offered_and_its_rules_land_beside_their_fields(
    web: TestClient, db_session: Session
) -> None:
    make_host(db_session, "studio-1", repositories={"mlx-lm": {"recipes": ["editable"]}})
    page = web.get("/").text
    assert 'name="mode" value="history"' in page
    before = _job_count(db_session)
    response = web.post("/", data=_fields(page, mode="history"))
    assert response.status_code == 422
    assert "history mode needs a repository" in _errors(response.text)["repository"]
    fields = _fields(
        page,
        mode="history",
        repository="mlx-lm",
        recipe="editable",
        **{"variant-0-ref": "v1.0", "variant-1-ref": "main", "variant-0-flags": ""},
        **{"variant-1-flags": ""},
    )
    response = web.post("/", data=fields, follow_redirects=False)
    assert response.status_code == 303, _errors(response.text)
    job = db_session.get(Job, response.headers["location"].removeprefix("/jobs/"))
    assert job.spec.mode == "history" and job.spec.adapter == "mlx-lm"
    assert [v.ref for v in job.spec.variants] == ["v1.0", "main"]
    assert _job_count(db_session) == before + 1


def test_a_history_range_and_a_bisection_are_submitted_from_the_form(
    web: TestClient, db_session: Session
) -> None:
    make_host(db_session, "studio-1", repositories={"mlx-lm": {"recipes": ["editable"]}})
    page = web.get("/").text
    assert 'name="mode" value="bisect"' in page and 'id="good"' in page and 'id="range"' in page
    one_row = {"repository": "mlx-lm", "variant-1-name": "", "variant-1-flags": ""}
    response = web.post(
        "/",
        data=_fields(page, mode="history", range="v1.0..main", last="3", **one_row),
        follow_redirects=False,
    )
    assert response.status_code == 303, _errors(response.text)
    job = db_session.get(Job, response.headers["location"].removeprefix("/jobs/"))
    assert job.spec.history is not None
    assert (job.spec.history.range, job.spec.history.last) == ("v1.0..main", 3)
    assert job.spec.variants[0].ref is None

    bisect = {"mode": "bisect", "good": "v1.0", "bad": "main", "direction": "slower"}
    response = web.post(
        "/",
        data=_fields(page, **bisect, **one_row, custom_contexts="64", rounds="6"),
        follow_redirects=False,
    )
    assert response.status_code == 303, _errors(response.text)
    job = db_session.get(Job, response.headers["location"].removeprefix("/jobs/"))
    assert job.spec.bisect is not None and job.spec.bisect.model_dump() == {
        "good": "v1.0",
        "bad": "main",
        "direction": "slower",
        "steps": [],
        "line": None,
    }
    assert [v.model_dump() for v in job.spec.variants] == [
        {"name": "base", "ref": None, "recipe": None, "flags": {"prefill_step_size": 64}}
    ]
    # A bisection shows no candidate row: what a hidden row still holds is not read.
    two_rows = web.post(
        "/",
        data=_fields(page, **bisect, repository="mlx-lm", custom_contexts="64"),
        follow_redirects=False,
    )
    assert two_rows.status_code == 303, _errors(two_rows.text)
    job = db_session.get(Job, two_rows.headers["location"].removeprefix("/jobs/"))
    assert [v.name for v in job.spec.variants] == ["base"]
    before = _job_count(db_session)
    injected = web.post(
        "/", data=_fields(page, **{**bisect, "good": "--exec=x"}, **one_row, custom_contexts="64")
    )
    assert injected.status_code == 422
    assert "not a plain branch" in _errors(injected.text)["good"]
    assert _job_count(db_session) == before


def test_the_form_names_every_flag_each_adapter_takes(web: TestClient, db_session: Session) -> None:
    from coldbench.evidence.spec.engine_flags import ADAPTER_FLAGS

    make_host(db_session, "studio-1")
    page = web.get("/").text
    for adapter in ("embedded", "mlx-lm"):
        for name in ADAPTER_FLAGS[adapter]:
            assert f"<code>{name}</code>" in page, name


def test_a_commits_job_is_submitted_from_the_form_with_its_errors_beside_their_fields(
    web: TestClient, db_session: Session
) -> None:
    make_host(db_session, "studio-1", repositories={"mlx-lm": {"recipes": ["editable"]}})
    page = web.get("/").text
    assert 'name="mode" value="commits"' in page and 'id="base"' in page and 'id="head"' in page
    fields = {"mode": "commits", "base": "main", "head": "my-pr", "alone": "true"}
    # Like a bisection, a commits job runs one configuration: the candidate rows are not read.
    response = web.post(
        "/", data=_fields(page, **fields, repository="mlx-lm"), follow_redirects=False
    )
    assert response.status_code == 303, _errors(response.text)
    job = db_session.get(Job, response.headers["location"].removeprefix("/jobs/"))
    commits = job.spec.commits
    assert commits is not None and (commits.base, commits.head) == ("main", "my-pr")
    assert commits.alone is True and commits.line is None
    assert [v.name for v in job.spec.variants] == ["base"] and job.spec.variants[0].ref is None
    before = _job_count(db_session)
    refused = web.post(
        "/", data=_fields(page, mode="commits", base="--exec=x", head="", repository="mlx-lm")
    )
    assert refused.status_code == 422
    errors = _errors(refused.text)
    assert "not a plain branch" in errors["base"] and "commits needs head" in errors["head"]
    assert _job_count(db_session) == before


def test_a_job_option_added_to_the_table_is_on_the_form_with_its_help_default_and_modes(
    web: TestClient, db_session: Session, monkeypatch: Any
) -> None:
    """The form is made from JOB_OPTIONS: an option added there is an input (its label, its
    help with the default the builder fills, shown only in its modes), what is typed in it
    reaches the builder and comes back on an error, and its problems land beside it."""
    from coldbench.evidence.spec import job_options

    monkeypatch.setitem(
        job_options.JOB_OPTIONS,
        "warmup_rounds",
        job_options.JobOption(
            "warmup_rounds",
            "--warmup-rounds",
            "Rounds measured and dropped.",
            "N",
            default_text="1",
        ),
    )
    monkeypatch.setitem(
        job_options.JOB_OPTIONS,
        "probe_order",
        job_options.JobOption(
            "probe_order", "--probe-order", "Which end first.", "good|bad", modes=("bisect",)
        ),
    )
    given: list[dict[str, Any]] = []
    build = job_options.build_job_spec

    def builder(options: dict[str, Any], **kwargs: Any) -> Any:
        given.append(dict(options))
        if options.get("warmup_rounds") == "-1":
            raise job_options.JobOptionsError(
                [job_options.Problem("warmup_rounds", "-1: give at least 0", "warmup_rounds")]
            )
        return build({k: v for k, v in options.items() if k != "warmup_rounds"}, **kwargs)

    monkeypatch.setattr(job_form, "build_job_spec", builder)
    make_host(db_session, "studio-1")
    page = web.get("/").text
    matrix = page[page.index("<legend>Matrix</legend>") : page.index("<legend>Hosts</legend>")]
    assert '<label for="warmup_rounds">Warmup rounds</label>' in matrix
    assert (
        '<input id="warmup_rounds" name="warmup_rounds" inputmode="numeric" value="" '
        'placeholder="1" aria-describedby="warmup_rounds-hint">'
    ) in matrix
    assert re.search(
        r'<p class="hint" id="warmup_rounds-hint">Rounds measured and dropped\. Default: 1\.</p>',
        matrix,
    )
    bisect = re.search(
        r'<div class="row" id="bisect-fields" data-modes="bisect" hidden>(.*?)'
        r'(?=<div class="row" id="commits-fields")',
        page,
        re.S,
    )
    assert bisect and '<select id="probe_order" name="probe_order"' in bisect.group(1)
    assert '<option value="good">good</option>' in bisect.group(1)
    assert "probe_order" not in page.replace(bisect.group(1), "")

    before = _job_count(db_session)
    typed = _fields(page, custom_contexts="64, 12x", warmup_rounds="3", probe_order="bad")
    response = web.post("/", data=typed)
    assert response.status_code == 422
    assert given[-1]["warmup_rounds"] == "3"
    assert "probe_order" not in given[-1]  # another mode's option: not read
    assert "12x" in _errors(response.text)["contexts"]
    assert 'name="warmup_rounds" inputmode="numeric" value="3"' in response.text  # kept
    response = web.post("/", data={**typed, "custom_contexts": "64", "warmup_rounds": "-1"})
    assert _errors(response.text) == {"warmup_rounds": "-1: give at least 0"}
    assert 'aria-describedby="warmup_rounds-hint err-warmup_rounds"' in response.text
    response = web.post(
        "/", data={**typed, "custom_contexts": "64", "warmup_rounds": ""}, follow_redirects=False
    )
    assert response.status_code == 303, _errors(response.text)
    assert given[-1]["warmup_rounds"] == ""  # left to the builder's default
    assert _job_count(db_session) == before + 1


def test_the_form_leaves_each_default_to_the_builder_and_shows_it(
    web: TestClient, db_session: Session
) -> None:
    """No default is typed in for the user: each input is blank and says the builder's
    default_text; a form submitted blank gets the builder's job (a bisection measures until
    decided, as `coldbench run --mode bisect` does)."""
    from coldbench.evidence.spec.job_options import JOB_OPTIONS, build_job_spec

    make_host(db_session, "studio-1", repositories={"mlx-lm": {"recipes": ["editable"]}})
    page = web.get("/").text
    for name in ("decode_tokens", "precision", "seed", "hosts", "corpus", "model"):
        default = JOB_OPTIONS[name].default_text
        assert re.search(rf'id="{name}" name="{name}"[^>]* value="" placeholder="{default}"', page)
        assert f"Default: {default}." in page, name
    for name in ("until", "residency"):
        default = JOB_OPTIONS[name].default_text
        assert re.search(
            rf'<select id="{name}" name="{name}"[^>]*>\s*<option value="" selected>default: '
            + re.escape(str(default)),
            page,
        ), name
    assert re.search(r'<input type="radio" name="mode" value="ab" checked>', page)
    assert not re.search(r'name="contexts" value="\d+" checked', page)
    bisect = {"mode": "bisect", "repository": "mlx-lm", "good": "v1", "bad": "main"}
    response = web.post(
        "/",
        data={"csrf_token": csrf_of(page), "direction": "slower", **bisect},
        follow_redirects=False,
    )
    assert response.status_code == 303, _errors(response.text)
    job = db_session.get(Job, response.headers["location"].removeprefix("/jobs/"))
    assert job is not None
    expected = build_job_spec({**bisect, "direction": "slower", "adapter": "mlx-lm"})
    assert job.spec.until == expected.until == "decided"
    assert job.spec.contexts == expected.contexts
    assert (job.spec.decode_tokens, job.spec.precision, job.spec.seed, job.spec.model) == (
        expected.decode_tokens,
        expected.precision,
        expected.seed,
        expected.model,
    )
