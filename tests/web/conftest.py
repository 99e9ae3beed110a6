"""Fixtures for page tests: the API test databases (shared with tests/api) and a logged-in
browser-like client."""

# ruff: noqa: F811  (fixture parameters share the names of the fixtures imported below)
from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from tests.api.conftest import (  # noqa: F401  (fixtures shared with the API tests)
    client,
    db_session,
    db_url,
    engines,
    postgres_migrated,
    postgres_url,
    sent_tasks,
    settings,
    sqlite_migrated,
)
from tests.api.factories import make_api_key
from tests.web.builders import login


@pytest.fixture
def api_key(db_session: Session) -> str:
    return make_api_key(db_session, "maintainer")


@pytest.fixture
def web(client: TestClient, api_key: str) -> Iterator[TestClient]:
    """The test client with a logged-in browser session (cookies kept between requests)."""
    login(client, api_key)
    yield client
