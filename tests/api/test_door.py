"""The door (issue 46): every text that enters the service is UTF-8 that PostgreSQL's `text`
and `jsonb` accept (no NUL, no lone surrogate, no string past `MAX_DOOR_TEXT_CHARS`), checked
once before any route reads it (`api/routing.py`, `evidence/contract/boundary.py`), with a 4xx
naming the field; nothing stored can fail a later read of the API or the pages.

Hypothesis draws hostile text (lone surrogates, NUL, invalid UTF-8, oversized strings) into
bodies, headers, query strings, paths, forms and uploads, bounded and derandomized; on
PostgreSQL, the same while honest hosts and submitters lease, submit and list concurrently.
"""

from __future__ import annotations

import json
import secrets
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from sqlalchemy.orm import Session

from coldbench.api import dispatch
from coldbench.api.app import create_app
from coldbench.api.auth import service as auth_service
from coldbench.api.database import make_engine, make_sessionmaker
from coldbench.api.hosts.models import Host
from coldbench.api.settings import Settings
from coldbench.evidence.contract.boundary import (
    MAX_DOOR_TEXT_CHARS,
    TextRefused,
    door_json_loads,
    door_text_problem,
)
from coldbench.evidence.contract.canonical import sha256_hex
from tests.api.conftest import SentTasks, bearer
from tests.api.factories import (
    fingerprint,
    job_payload,
    make_api_key,
    make_host,
    make_job,
    records_jsonl,
)
from tests.api.test_endpoints import lease
from tests.web.builders import login

BOUNDED = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
    phases=[Phase.explicit, Phase.generate],
)
NUL = "\x00"
SURROGATES = ["\ud800", "\udbff", "\udc80", "\udfff"]
# Text no column can hold: a lone surrogate or NUL somewhere in otherwise ordinary text, or
# a string one character past the bound.
BAD_CHARACTER = st.sampled_from([NUL, *SURROGATES])
HOSTILE_STRING = st.one_of(
    st.builds(
        lambda head, bad, tail: head + bad + tail,
        st.text(st.characters(max_codepoint=0x3000, exclude_characters=NUL), max_size=6),
        BAD_CHARACTER,
        st.text(max_size=6),
    ),
    st.just("x" * (MAX_DOOR_TEXT_CHARS + 1)),
)
# Bytes that are not UTF-8: a stray continuation, an overlong form, an encoded surrogate,
# a byte never used, a sequence cut short.
INVALID_UTF8 = st.sampled_from([b"\x80", b"\xc0\xaf", b"\xed\xa0\x80", b"\xff", b"\xe2\x82"])


def _json_text(value: Any) -> str:
    """JSON as a client sends it: `ensure_ascii` escapes (`\\ud800`), which any client can
    write; httpx's own encoder cannot encode a lone surrogate at all."""
    return json.dumps(value)


def post_json(client: TestClient, path: str, value: Any, headers: dict[str, str]) -> Any:
    return client.post(
        path, content=_json_text(value), headers={**headers, "Content-Type": "application/json"}
    )


def assert_refused_naming(response: Any, field: str) -> None:
    """A 4xx whose one-line detail names `field`, and whose body never echoes the text."""
    assert 400 <= response.status_code < 500, (response.status_code, response.text)
    if response.request.method == "HEAD":
        assert response.status_code == 422
        return
    body = response.json()
    assert body.get("field") == field, body
    assert body["detail"].startswith(f"{field}: ") and "\n" not in body["detail"], body
    response.text.encode("utf-8")  # the answer itself is UTF-8 (no surrogate echoed)


def _place(value: str, path: list[str | int]) -> Any:
    """A document with `value` at `path`."""
    document: Any = value
    for step in reversed(path):
        document = [document] if isinstance(step, int) else {step: document}
    return document


def _dotted(path: list[str | int]) -> str:
    return ".".join(str(step) for step in path)


PATHS = st.lists(
    st.one_of(st.just(0), st.sampled_from(["fingerprint", "flags", "chip", "a", "variants"])),
    min_size=1,
    max_size=4,
).filter(lambda path: isinstance(path[0], str))


# --- the rule itself ----------------------------------------------------------------------


@BOUNDED
@given(text=HOSTILE_STRING, path=PATHS)
def test_door_json_loads_refuses_each_hostile_string_naming_its_path(
    text: str, path: list[str | int]
) -> None:
    raw = _json_text(_place(text, path)).encode("ascii")
    with pytest.raises(TextRefused) as refused:
        door_json_loads(raw)
    assert refused.value.field == _dotted(path)
    assert refused.value.problem == door_text_problem(text)


@BOUNDED
@given(head=st.text(max_size=8).map(json.dumps), bad=INVALID_UTF8)
def test_door_json_loads_refuses_bytes_that_are_not_utf8_naming_their_position(
    head: str, bad: bytes
) -> None:
    raw = b'{"a": ' + head.encode() + b', "b": "' + bad + b'"}'
    with pytest.raises(TextRefused) as refused:
        door_json_loads(raw)
    assert refused.value.field == "body"
    assert refused.value.problem.startswith(f"byte {raw.index(bad)} ")


@BOUNDED
@given(
    value=st.recursive(
        st.text(st.characters(exclude_categories=["Cs"], exclude_characters=NUL), max_size=8)
        | st.integers(-(2**31), 2**31)
        | st.booleans(),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
        max_leaves=10,
    )
)
def test_door_json_loads_passes_every_storable_document_unchanged(value: Any) -> None:
    assert door_json_loads(_json_text(value).encode()) == value
    assert door_json_loads(json.dumps(value, ensure_ascii=False).encode()) == value


def test_a_valid_surrogate_pair_is_text_like_any_other() -> None:
    assert door_json_loads(b'{"chip": "\\ud83d\\ude00"}') == {"chip": "\U0001f600"}


# --- every body, path, query, header and form ---------------------------------------------


def _operations(client: TestClient) -> list[tuple[str, str, bool]]:
    """(method, path with its parameters filled, whether it takes a JSON body) of every
    operation of the app's OpenAPI schema."""
    schema = client.get("/openapi.json").json()
    operations = []
    for path, methods in schema["paths"].items():
        filled = path
        for name in [part[1:-1] for part in path.split("/") if part.startswith("{")]:
            filled = filled.replace("{" + name + "}", "x")
        for method, operation in methods.items():
            content = operation.get("requestBody", {}).get("content", {})
            operations.append((method, filled, "application/json" in content))
    return operations


def test_every_json_body_of_every_operation_passes_the_door(
    client: TestClient, db_session: Session
) -> None:
    """Whatever the route and whoever calls: a JSON body holding a lone surrogate, NUL or
    an oversized string anywhere is 422 naming where, before authentication or any schema."""
    operations = [op for op in _operations(client) if op[2]]
    assert len(operations) >= 10, operations
    for method, path, _ in operations:
        for text in ("ok\ud800", f"a{NUL}b", "x" * (MAX_DOOR_TEXT_CHARS + 1)):
            body = {"fingerprint": {"chip": ["M3", text]}}
            response = client.request(
                method,
                path,
                content=_json_text(body),
                headers={"Content-Type": "application/json", "Authorization": "Bearer x"},
            )
            assert_refused_naming(response, "fingerprint.chip.1")
        response = client.request(
            method,
            path,
            content=b'{"a": "\xed\xa0\x80"}',
            headers={"Content-Type": "application/json", "Authorization": "Bearer x"},
        )
        assert_refused_naming(response, "body")


def test_every_path_and_query_of_every_operation_passes_the_door(client: TestClient) -> None:
    for method, path, _ in _operations(client):
        if "/x" in path:
            response = client.request(method, path.replace("/x", "/a%00b", 1))
            assert_refused_naming(response, "path")
        response = client.request(method, path, params={"attempt": f"1{NUL}"})
        assert_refused_naming(response, "query parameter 'attempt'")


def test_headers_and_forms_pass_the_door(client: TestClient, db_session: Session) -> None:
    _, secret = make_host(db_session, "studio-1")
    response = client.post(
        "/api/v1/leases",
        json={"fingerprint": fingerprint()},
        headers={"Authorization": f"Bearer {secret}{NUL}"},
    )
    assert_refused_naming(response, "header authorization")
    response = client.get("/hosts", headers={"Cookie": f"cb_session=a{NUL}b"})
    assert_refused_naming(response, "header cookie")
    response = client.post("/login", data={"api_key": f"cbk_{NUL}", "csrf_token": "t"})
    assert_refused_naming(response, "form field 'api_key'")
    response = client.post(
        "/login",
        content="api_key=%ED%A0%80&csrf_token=t",
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    # The form parser decodes percent escapes with replacement characters: no surrogate
    # survives it, and the login is refused as any unknown key is.
    assert response.status_code == 403, response.text


# --- the issue's cases, each stored shape read back ---------------------------------------


def _read_everything(client: TestClient, key: str) -> None:
    """Every list and page a submitter reads answers 200 in UTF-8."""
    for path in ("/api/v1/hosts", "/api/v1/jobs"):
        listed = client.get(path, headers=bearer(key))
        assert listed.status_code == 200, listed.text
    for job in client.get("/api/v1/jobs", headers=bearer(key)).json():
        detail = client.get(f"/api/v1/jobs/{job['id']}", headers=bearer(key))
        assert detail.status_code == 200, detail.text
    login(client, key)
    for page in ("/hosts", "/jobs", "/"):
        shown = client.get(page)
        assert shown.status_code == 200, (page, shown.text[:300])
        shown.content.decode("utf-8")


@pytest.mark.both_dialects
def test_the_issues_hostile_requests_are_refused_and_everything_reads_back(
    client: TestClient, db_session: Session, settings: Settings
) -> None:
    key = make_api_key(db_session)
    token = auth_service.create_enrollment_token(db_session=db_session)
    # 2. a registration with a surrogate in its fingerprint: refused, the token unspent.
    body = {
        "name": "intruder",
        "fingerprint": {**fingerprint(), "chip": "\ud800"},
        "models": ["preset:tiny"],
    }
    response = post_json(client, "/api/v1/workers/register", body, bearer(token))
    assert_refused_naming(response, "fingerprint.chip")
    body["fingerprint"] = fingerprint()
    assert post_json(client, "/api/v1/workers/register", body, bearer(token)).status_code == 201
    # 1. a lease with a surrogate in a fingerprint's extra field.
    _, secret = make_host(db_session, "studio-1")
    make_job(db_session, settings)
    response = post_json(
        client,
        "/api/v1/leases",
        {"fingerprint": {**fingerprint(), "vendor": {"x": "a\udc80"}}},
        bearer(secret),
    )
    assert_refused_naming(response, "fingerprint.vendor.x")
    # 4. a surrogate in a flag's value, then in its key.
    spec = job_payload()
    spec["variants"][1]["flags"] = {"kv_bits": "\udfff"}
    assert_refused_naming(
        post_json(client, "/api/v1/jobs", spec, bearer(key)), "variants.1.flags.kv_bits"
    )
    spec["variants"][1]["flags"] = {"kv\udfff": 4}
    assert_refused_naming(post_json(client, "/api/v1/jobs", spec, bearer(key)), "variants.1.flags")
    # Honest requests go on: the lease, a submission, and every read.
    assert lease(client, secret).status_code == 200
    assert post_json(client, "/api/v1/jobs", job_payload(seed=7), bearer(key)).status_code == 201
    _read_everything(client, key)


def _database_before_the_door(dialect: str, postgres_url: str, tmp_path: Path) -> Iterator[str]:
    """A database of `dialect` at the revision before this change, dropped afterwards."""
    if dialect == "sqlite":
        yield f"sqlite:///{tmp_path / 'before.db'}"
        return
    admin = sa.create_engine(postgres_url, isolation_level="AUTOCOMMIT")
    name = f"door_{secrets.token_hex(4)}"
    with admin.connect() as connection:
        connection.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        yield sa.engine.make_url(postgres_url).set(database=name).render_as_string(False)
    finally:
        with admin.connect() as connection:
            connection.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"])
def test_json_stored_before_the_door_is_cleaned_by_the_migration(
    dialect: str, postgres_url: str, tmp_path: Path
) -> None:
    """A host registered with a lone surrogate before this change broke every read of the
    host list: the migration replaces in every JSON column what no column can hold (U+FFFD),
    and the list reads back."""
    from alembic import command

    from coldbench.api.migration import alembic_config

    databases = _database_before_the_door(dialect, postgres_url, tmp_path)
    url = next(databases)
    try:
        config = alembic_config(url)
        command.upgrade(config, "5a7c3e91d2b4")
        raw = sa.create_engine(url)
        now = "now()" if dialect == "postgresql" else "CURRENT_TIMESTAMP"
        with raw.begin() as connection:
            # What a driver cannot send as text, a JSON column held as an escape.
            connection.exec_driver_sql(
                "INSERT INTO hosts (id, name, secret_sha256, fingerprint, enrolled_labels, labels,"
                " system_labels, repositories, models, created_at, health, calibration) VALUES"
                " ('h1', 'old', 'x', '{\"chip\": \"M3\\ud800\", \"k\": \"a\\u0000\"}',"
                " '[\"lab:a\"]', '[\"corpus:code\", \"lab:a\"]', '[]', '{}', '[]', "
                f'{now}, \'ready\', \'{{"model": "\\udfff", "ok": "\\ud83d\\ude00"}}\')'
            )
        command.upgrade(config, "head")
        with raw.connect() as connection:
            stored, own, calibration = connection.execute(
                sa.text("SELECT fingerprint, host_labels, calibration FROM hosts WHERE id = 'h1'")
            ).one()
        raw.dispose()
        decoded = [json.loads(v) if isinstance(v, str) else v for v in (stored, own, calibration)]
        assert decoded[0] == {"chip": "M3\ufffd", "k": "a\ufffd"}
        assert decoded[1] == ["corpus:code"]
        assert decoded[2] == {"model": "\ufffd", "ok": "\U0001f600"}
        settings = Settings(
            database_url=url,
            artifact_dir=tmp_path / "a",
            state_dir=tmp_path / "s",
            rehearse_at_start=False,
        )
        with dispatch.use_sender(SentTasks()), TestClient(create_app(settings)) as client:
            engine = make_engine(url)
            with make_sessionmaker(engine)() as db_session:
                key = make_api_key(db_session)
            engine.dispose()
            listed = client.get("/api/v1/hosts", headers=bearer(key))
            assert listed.status_code == 200 and listed.json()[0]["fingerprint"] == decoded[0]
    finally:
        next(databases, None)


# --- uploads --------------------------------------------------------------------------------


def _put(client: TestClient, secret: str, run_id: str, name: str, content: bytes) -> Any:
    return client.put(
        f"/api/v1/runs/{run_id}/artifacts/{name}",
        params={"attempt": 1},
        content=content,
        headers={**bearer(secret), "X-Content-SHA256": sha256_hex(content)},
    )


@pytest.mark.both_dialects
def test_a_records_file_that_is_not_utf8_is_refused_at_upload_with_its_line(
    client: TestClient, db_session: Session, settings: Settings
) -> None:
    """Issue 46, 7: one byte that is not UTF-8 in records.jsonl was accepted, and then every
    record of the run was dropped at ingest. It is refused at upload, naming its line;
    nothing is stored; the right bytes are accepted after."""
    _, secret = make_host(db_session, "studio-1")
    make_job(db_session, settings)
    run_id = lease(client, secret).json()["run_id"]
    good = records_jsonl(run_id)
    lines = good.split(b"\n")
    for bad in (b"\xff", b"\xed\xa0\x80", b"\xc3"):
        broken = b"\n".join([*lines[:2], lines[2][:-2] + bad + lines[2][-2:], *lines[3:]])
        response = _put(client, secret, run_id, "records.jsonl", broken)
        assert response.status_code == 422, response.text
        assert response.json()["field"] == "records.jsonl"
        assert response.json()["detail"].startswith("records.jsonl line 3: byte 0x"), response.text
    cut = good + b"\xe2\x82"
    response = _put(client, secret, run_id, "records.jsonl", cut)
    assert response.status_code == 422 and "ends inside a character" in response.text
    nul = good.replace(b'"base"', b'"ba\x00se"', 1)
    assert "holds a NUL byte" in _put(client, secret, run_id, "records.jsonl", nul).text
    store_files = [p for p in (settings.artifact_dir).rglob("*") if p.is_file()]
    assert store_files == []
    assert _put(client, secret, run_id, "records.jsonl", good).status_code == 201
    # A log is the host's own bytes, not JSON: kept as sent.
    assert _put(client, secret, run_id, "build-base.log", b"\xff\xfe gcc\n").status_code == 201


# --- admin arguments ------------------------------------------------------------------------


@BOUNDED
@given(text=HOSTILE_STRING.filter(lambda t: NUL not in t), position=st.sampled_from([0, 1]))
def test_every_admin_argument_passes_the_door(text: str, position: int) -> None:
    """What an admin types reaches no command unchecked (bytes that are not UTF-8 arrive as
    lone surrogates); refused with exit 2 naming the argument, before any database."""
    from typer.testing import CliRunner

    from coldbench.api.cli import app

    cases = [
        (["admin", "apikey", text], "argument 2"),
        (["admin", "labels", text, "--set", "a"], "argument 2"),
        (["admin", "labels", "studio-1", "--set", text], "--set"),
        (["admin", "revoke", "host", text], "argument 3"),
        (["admin", "enroll", f"--labels={text}"], "--labels"),
    ]
    args, field = cases[(position + len(text)) % len(cases)]
    result = CliRunner().invoke(
        app, args, env={"COLDBENCH_DATABASE_URL": "sqlite:////nonexistent/x.db"}
    )
    assert result.exit_code == 2, result.output
    assert f"{field}: {door_text_problem(text)}" in result.output


def test_an_admin_argument_that_is_not_utf8_is_refused(
    tmp_path: Path, coldbench_cmd: list[str]
) -> None:
    """The real command line: a byte that is not UTF-8 in an API key's name was a traceback
    (the database driver could not encode it); now one line and exit 2, nothing stored."""
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if not k.startswith("COLDBENCH_")}
    done = subprocess.run(
        [*coldbench_cmd, "admin", "apikey", b"al\xffce"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert b"argument 2: holds the lone surrogate U+DCFF (not UTF-8)" in done.stderr
    assert b"Traceback" not in done.stderr


# --- on PostgreSQL, concurrently with honest hosts and submitters ----------------------------

HONEST_HOSTS = 8


@pytest.fixture
def live_app(live_db: str, tmp_path: Path) -> Iterator[tuple[TestClient, Any, Settings]]:
    settings = Settings(
        database_url=live_db,
        artifact_dir=tmp_path / "artifacts",
        state_dir=tmp_path / "state",
        rehearse_at_start=False,
        lease_wait_max_s=1,
        lease_poll_s=0.2,
        # The subject is isolation, not the bounded wait (tests/api/test_hostile_input.py).
        db_request_timeout_s=30,
    )
    engine = make_engine(live_db)
    with dispatch.use_sender(SentTasks()), TestClient(create_app(settings)) as client:
        yield client, make_sessionmaker(engine), settings
    engine.dispose()


def test_hostile_text_fails_only_its_own_requests_while_honest_ones_go_on(
    live_app: tuple[TestClient, Any, Settings],
) -> None:
    """Honest hosts lease (their claims grouped in shared transactions) and submitters
    submit and list, in threads, for as long as hypothesis sends hostile text through an
    enrolled host, a submitter and an enrollment token into every kind of request. Every
    honest request succeeds; every hostile one is a 4xx naming its field; afterwards every
    stored row reads back through the API and the pages."""
    client, sessions, settings = live_app
    with sessions() as db_session:
        honest = [make_host(db_session, f"honest-{i}")[1] for i in range(HONEST_HOSTS)]
        _, hostile_secret = make_host(db_session, "hostile")
        keys = [make_api_key(db_session, f"key-{i}") for i in range(HONEST_HOSTS)]
        for _ in range(HONEST_HOSTS):
            make_job(db_session, settings)
        tokens = [auth_service.create_enrollment_token(db_session=db_session) for _ in range(60)]
    statuses: list[tuple[str, int, str]] = []
    lock = threading.Lock()
    stop = threading.Event()

    def note(what: str, response: Any) -> None:
        with lock:
            statuses.append((what, response.status_code, response.text[:200]))

    def honest_loop(index: int) -> None:
        seed = 1000 * index
        while not stop.is_set():
            note("lease", lease(client, honest[index], wait_s=0))
            seed += 1
            note(
                "submit",
                post_json(client, "/api/v1/jobs", job_payload(seed=seed), bearer(keys[index])),
            )
            note("hosts", client.get("/api/v1/hosts", headers=bearer(keys[index])))

    hostile_kinds = st.sampled_from(["register", "lease", "submit", "heartbeat", "header", "query"])

    @BOUNDED
    @given(kind=hostile_kinds, text=HOSTILE_STRING, where=st.sampled_from(["key", "value"]))
    def misbehave(kind: str, text: str, where: str) -> None:
        placed: dict[str, Any] = {"vendor": text} if where == "value" else {text: "v"}
        field = "fingerprint.vendor" if where == "value" else "fingerprint"
        if kind == "register":
            body = {"name": "intruder", "fingerprint": {**fingerprint(), **placed}}
            response = post_json(client, "/api/v1/workers/register", body, bearer(tokens.pop()))
        elif kind == "lease":
            body = {"fingerprint": {**fingerprint(), **placed}, "wait_s": 0}
            response = post_json(client, "/api/v1/leases", body, bearer(hostile_secret))
        elif kind == "submit":
            spec = job_payload()
            spec["variants"][1]["flags"] = {"kv_bits": text} if where == "value" else {text: 4}
            field = "variants.1.flags" + (".kv_bits" if where == "value" else "")
            response = post_json(client, "/api/v1/jobs", spec, bearer(keys[0]))
        elif kind == "heartbeat":
            body = {"run_id": "r", "attempt": 1, "progress": {"variant": text}}
            field = "progress.variant"
            response = post_json(client, "/api/v1/workers/heartbeat", body, bearer(hostile_secret))
        elif kind == "header":
            if NUL not in text:  # a header is bytes: of these only NUL can be refused
                return
            field = "header x-coldbench-note"
            response = client.get(
                "/api/v1/hosts",
                headers={
                    **bearer(keys[0]),
                    "X-Coldbench-Note": text.encode("utf-8", "surrogatepass"),
                },
            )
        else:
            if NUL not in text:
                # The server decodes a query with replacement characters, and the client
                # sends no query this long.
                return
            field = "query parameter 'before'"
            response = client.get("/api/v1/jobs", params={"before": text}, headers=bearer(keys[0]))
        assert_refused_naming(response, field)

    with ThreadPoolExecutor(HONEST_HOSTS) as pool:
        loops = [pool.submit(honest_loop, i) for i in range(HONEST_HOSTS)]
        try:
            misbehave()
        finally:
            stop.set()
            for loop in loops:
                loop.result()
    failed = [s for s in statuses if s[1] not in (200, 201, 204)]
    assert failed == [], failed[:5]
    assert {what for what, _, _ in statuses} == {"lease", "submit", "hosts"}
    assert len(statuses) >= 3 * HONEST_HOSTS, len(statuses)  # each host went round at least once
    with sessions() as db_session:
        stored = db_session.scalars(sa.select(Host.fingerprint).where(Host.name == "hostile")).one()
    assert stored == fingerprint(hostname="hostile")
    _read_everything(client, keys[0])
