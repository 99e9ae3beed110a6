"""`coldbench admin ...` and `coldbench db ...` on the embedded default (a fresh folder)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import sqlalchemy as sa

from coldbench.evidence.contract.canonical import sha256_hex


def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COLDBENCH_")}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_admin_prints_tokens_stored_only_as_digests(
    tmp_path: Path, coldbench_cmd: list[str]
) -> None:
    enrolled = _run([*coldbench_cmd, "admin", "enroll", "--labels", "lab:home,gpu"], tmp_path)
    assert enrolled.returncode == 0, enrolled.stderr
    token = enrolled.stdout.strip()
    assert token.startswith("cbe_") and "shown once" in enrolled.stderr
    keyed = _run([*coldbench_cmd, "admin", "apikey", "alice"], tmp_path)
    assert keyed.returncode == 0, keyed.stderr
    key = keyed.stdout.strip()
    assert key.startswith("cbk_")
    engine = sa.create_engine(f"sqlite:///{tmp_path / '.coldbench' / 'coldbench.db'}")
    with engine.connect() as connection:
        tokens = connection.execute(sa.text("SELECT token_sha256, labels FROM enrollment_tokens"))
        ((token_sha256, labels),) = tokens.all()
        assert token_sha256 == sha256_hex(token.encode()) and "lab:home" in labels
        ((name, key_sha256),) = connection.execute(sa.text("SELECT name, key_sha256 FROM api_keys"))
        assert name == "alice" and key_sha256 == sha256_hex(key.encode())
    engine.dispose()
    assert token not in (tmp_path / ".coldbench" / "coldbench.db").read_bytes().decode("latin-1")


def test_admin_refuses_bad_labels(tmp_path: Path, coldbench_cmd: list[str]) -> None:
    done = _run([*coldbench_cmd, "admin", "enroll", "--labels", "ok,bad label"], tmp_path)
    assert done.returncode == 2 and "invalid label(s): bad label" in done.stderr


def test_db_commands_on_the_embedded_default(tmp_path: Path, coldbench_cmd: list[str]) -> None:
    for args in (["db", "upgrade"], ["db", "check"], ["db", "downgrade"], ["db", "upgrade"]):
        done = _run([*coldbench_cmd, *args], tmp_path)
        assert done.returncode == 0, done.stderr
    # a database behind head cannot be checked: one line saying what to run, exit 1
    downgraded = _run([*coldbench_cmd, "db", "downgrade", "--", "-1"], tmp_path)
    assert downgraded.returncode == 0 and "database downgraded to -1" in downgraded.stderr
    behind = _run([*coldbench_cmd, "db", "check"], tmp_path)
    assert behind.returncode == 1 and "Traceback" not in behind.stderr
    assert behind.stderr.strip().splitlines() == [
        "cannot check: Target database is not up to date. (run `coldbench db upgrade` first)"
    ]
    listing = _run([*coldbench_cmd, "--help"], tmp_path).stdout
    for command in ("server", "db", "admin", "celery"):
        assert command in listing


def test_server_refuses_a_github_configuration_that_is_not_valid(
    tmp_path: Path, coldbench_cmd: list[str]
) -> None:
    config = tmp_path / "github.toml"
    config.write_text(
        'service_url = "https://bench.example.org"\n[repositories."octo/mlx-lm"]\n'
        'token = "t"\nwebhook_secret = "too-short"\ncoldbench_repository = "mlx-lm"\n'
    )
    env = {
        **os.environ,
        "COLDBENCH_STATE_DIR": str(tmp_path),
        "COLDBENCH_GITHUB_CONFIG": str(config),
    }
    done = subprocess.run(
        [*coldbench_cmd, "server", "--port", "9"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (
        f"error: COLDBENCH_GITHUB_CONFIG: {config}: repositories.octo/mlx-lm.webhook_secret: "
        "webhook_secret needs at least 16 characters"
    )
