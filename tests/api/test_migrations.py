"""Migrations apply to an empty database, agree with the models, and downgrade."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command

from coldbench.api.migration import alembic_config
from coldbench.evidence.contract.protocol import ATTEMPT_STATES, JobState, RepositoryOffer, RunState
from tests.api.conftest import POSTGRES_URL, _server_url


@pytest.fixture
def empty_postgres() -> Iterator[str]:
    name = f"coldbench_test_mig_{secrets.token_hex(4)}"
    admin = sa.create_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.exec_driver_sql(f'CREATE DATABASE "{name}"')
    yield _server_url(POSTGRES_URL, name)
    with admin.connect() as connection:
        connection.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin.dispose()


VERSIONS = Path(__file__).resolve().parents[2] / "migrations" / "versions"


def _tables(url: str) -> set[str]:
    engine = sa.create_engine(url)
    try:
        return set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


def _columns(url: str, table: str) -> set[str]:
    engine = sa.create_engine(url)
    try:
        return {column["name"] for column in sa.inspect(engine).get_columns(table)}
    finally:
        engine.dispose()


@pytest.mark.postgres
def test_postgres_upgrade_check_downgrade(empty_postgres: str, coldbench_cmd: list[str]) -> None:
    env = {**os.environ, "COLDBENCH_DATABASE_URL": empty_postgres}
    for args in (["db", "upgrade"], ["db", "check"]):
        done = subprocess.run([*coldbench_cmd, *args], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    assert "models and migrations agree" in done.stderr
    assert {"hosts", "jobs", "runs", "cells", "artifacts", "evidence"} <= _tables(empty_postgres)
    assert "host_id" in _columns(empty_postgres, "evidence_reproductions")
    command.downgrade(alembic_config(empty_postgres), "9d4e2b7f1c03")  # before reproductions
    assert "evidence_reproductions" not in _tables(empty_postgres)
    command.upgrade(alembic_config(empty_postgres), "head")
    assert "bundle_files" in _columns(empty_postgres, "jobs")
    assert {"calibration", "revoked_at"} <= _columns(empty_postgres, "hosts")
    config = alembic_config(empty_postgres)
    command.downgrade(config, "3b1f2c9d8e7a")  # before repository offers and state checks
    command.downgrade(config, "-1")  # host revocation
    assert "revoked_at" not in _columns(empty_postgres, "hosts")
    command.downgrade(config, "-1")  # host calibration
    assert "calibration" not in _columns(empty_postgres, "hosts")
    command.downgrade(config, "e5efff44487f")  # the initial schema, before bundle_files
    assert "bundle_files" not in _columns(empty_postgres, "jobs")
    command.downgrade(config, "base")
    assert _tables(empty_postgres) == {"alembic_version"}
    command.upgrade(config, "head")
    command.check(config)


def _host_repositories(url: str) -> dict[str, Any]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            value = connection.execute(sa.text("SELECT repositories FROM hosts")).scalar_one()
    finally:
        engine.dispose()
    return json.loads(value) if isinstance(value, str) else value


@pytest.mark.postgres
def test_repository_offers_migration_up_and_down(empty_postgres: str) -> None:
    """Hosts registered before adapters were reported get mlx-lm and no options; downgrade
    gives back exactly what was stored."""
    config = alembic_config(empty_postgres)
    command.upgrade(config, "3b1f2c9d8e7a")
    old = {"mlx-lm": {"recipes": ["editable"]}}
    engine = sa.create_engine(empty_postgres)
    with engine.begin() as connection:
        connection.execute(
            sa.text(
                "INSERT INTO hosts (id, name, secret_sha256, fingerprint, enrolled_labels, "
                "labels, repositories, models, created_at, health) VALUES ('h1', 'studio-1', "
                "'x', '{}', '[]', '[]', CAST(:repositories AS JSON), '[]', now(), 'ready')"
            ),
            {"repositories": json.dumps(old)},
        )
    engine.dispose()
    command.upgrade(config, "3c1d2e9a7b45")
    upgraded = _host_repositories(empty_postgres)
    assert upgraded == {"mlx-lm": {"adapter": "mlx-lm", "options": {}, "recipes": ["editable"]}}
    RepositoryOffer.model_validate(upgraded["mlx-lm"])
    command.downgrade(config, "3b1f2c9d8e7a")
    assert _host_repositories(empty_postgres) == old


def _check_constraints(url: str, table: str) -> set[str]:
    engine = sa.create_engine(url)
    try:
        return {c["name"] for c in sa.inspect(engine).get_check_constraints(table)}
    finally:
        engine.dispose()


@pytest.mark.postgres
def test_state_checks_up_and_down(empty_postgres: str) -> None:
    """Only the StrEnums' states can be stored; downgrade removes exactly those CHECKs."""
    config = alembic_config(empty_postgres)
    command.upgrade(config, "8e4f0b7c2a19")
    for table in ("jobs", "runs", "run_attempts"):
        assert f"ck_{table}_state" in _check_constraints(empty_postgres, table)
    engine = sa.create_engine(empty_postgres)
    insert = sa.text(
        "INSERT INTO jobs (id, spec, spec_sha256, state, created_at, updated_at) "
        "VALUES (:id, '{}', 'x', :state, now(), now())"
    )
    with engine.begin() as connection:
        for state in JobState:
            connection.execute(insert, {"id": f"j-{state}", "state": state})
    with pytest.raises(sa.exc.IntegrityError, match="ck_jobs_state"), engine.begin() as c:
        c.execute(insert, {"id": "j-bad", "state": "finished"})
    engine.dispose()
    command.downgrade(config, "3c1d2e9a7b45")
    for table in ("jobs", "runs", "run_attempts"):
        assert f"ck_{table}_state" not in _check_constraints(empty_postgres, table)
    command.upgrade(config, "head")
    command.check(config)


def test_the_enums_and_the_migrations_checks_agree() -> None:
    """A state added to an enum needs a migration that allows it."""
    import importlib.util

    path = next(VERSIONS.glob("*_8e4f0b7c2a19_state_checks.py"))
    loader = importlib.util.spec_from_file_location("state_checks", path)
    assert loader is not None and loader.loader is not None
    migration = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(migration)
    expected = {"jobs": tuple(JobState), "runs": tuple(RunState), "run_attempts": ATTEMPT_STATES}
    assert expected == migration.STATES


def test_sqlite_upgrade_check_downgrade(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    config = alembic_config(url)
    command.upgrade(config, "head")
    command.check(config)
    command.downgrade(config, "-1")
    command.upgrade(config, "head")
    assert "cells" in _tables(url)


def test_migration_files_are_named_by_date() -> None:
    versions = Path(__file__).resolve().parents[2] / "migrations" / "versions"
    names = [p.name for p in versions.glob("*.py")]
    assert names and all(
        len(n) > 11 and n[:4].isdigit() and n[4] == "-" and n[10] == "_" for n in names
    ), names
