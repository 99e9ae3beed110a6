"""Migrations apply to an empty database, agree with the models, and downgrade."""

from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command

from api.migration import alembic_config
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
    assert "bundle_files" in _columns(empty_postgres, "jobs")
    assert {"calibration", "revoked_at"} <= _columns(empty_postgres, "hosts")
    config = alembic_config(empty_postgres)
    command.downgrade(config, "-1")  # host revocation
    assert "revoked_at" not in _columns(empty_postgres, "hosts")
    command.downgrade(config, "-1")  # host calibration
    assert "calibration" not in _columns(empty_postgres, "hosts")
    command.downgrade(config, "base")
    assert _tables(empty_postgres) == {"alembic_version"}
    command.upgrade(config, "head")
    command.check(config)


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
