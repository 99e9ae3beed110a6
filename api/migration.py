"""The Alembic configuration of this checkout, usable from the CLI, the app and tests."""

from __future__ import annotations

from pathlib import Path

from alembic.config import Config

REPO_ROOT = Path(__file__).resolve().parent.parent


def alembic_config(url: str, *, configure_logger: bool = True) -> Config:
    """alembic.ini with this checkout's migrations and `url`. `configure_logger=False` leaves
    the process's logging as it is: alembic.ini's logging section (read by migrations/env.py)
    replaces the root logger's handlers and level, which in a running server or a test took
    over every log record of the process."""
    config = Config(str(REPO_ROOT / "alembic.ini"))
    config.attributes["configure_logger"] = configure_logger
    config.set_main_option("script_location", str(REPO_ROOT / "migrations"))
    # Percent signs in passwords would be read as interpolation by configparser.
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config
