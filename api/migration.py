"""The Alembic configuration of this checkout, usable from the CLI, the app and tests."""

from __future__ import annotations

from pathlib import Path

from alembic.config import Config

REPO_ROOT = Path(__file__).resolve().parent.parent


def alembic_config(url: str) -> Config:
    config = Config(str(REPO_ROOT / "alembic.ini"))
    config.set_main_option("script_location", str(REPO_ROOT / "migrations"))
    # Percent signs in passwords would be read as interpolation by configparser.
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config
