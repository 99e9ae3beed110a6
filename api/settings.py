"""Settings of the central service: one pydantic-settings class, environment prefix COLDBENCH_."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from coldbench.evidence.contract.schemas import SpecLimits

STATE_DIR = Path(".coldbench")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="COLDBENCH_", extra="ignore")

    # Empty means the embedded default: a SQLite file under .coldbench/, upgraded at start.
    database_url: str = ""
    # Empty means the embedded default: kombu's SQLAlchemy transport on .coldbench/broker.db.
    redis_url: str = ""
    artifact_dir: Path = STATE_DIR / "artifacts"
    # `s3://bucket/prefix`: artifacts in an S3-compatible bucket shared by every API replica and
    # Celery worker (api/artifacts/store.py); empty means the local folder artifact_dir.
    artifact_url: str = Field("", pattern=r"^(s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/.*)?)?$")
    # Endpoint of an S3-compatible service other than AWS (MinIO, Ceph, ...); credentials may
    # also come from the usual AWS_* variables or an instance role when these are empty.
    s3_endpoint_url: str = ""
    s3_region: str = ""
    s3_access_key_id: str = ""
    s3_secret_access_key: SecretStr = SecretStr("")
    # The local store refuses an upload (507, nothing kept) that would leave less free space
    # than this on its filesystem.
    artifact_min_free_bytes: int = Field(256 * 1024 * 1024, ge=0)
    state_dir: Path = STATE_DIR

    # sha256 hex of the admin token for the HTTP admin endpoints (enrollment tokens and API
    # keys); empty disables them, leaving `coldbench admin` on the server as the only way.
    admin_token_sha256: str = Field("", pattern=r"^([0-9a-f]{64})?$")

    max_artifact_bytes: int = Field(512 * 1024 * 1024, ge=1)
    # An upload temporary not written to for this long was cut by a killed server: the beat
    # task and each server start remove it (an upload in flight writes every few ms).
    upload_tmp_max_age_s: int = Field(3600, ge=60)
    # Every other request body (jobs, registration, leases, completion with its manifest):
    # refused with 413 before it is parsed (api/routing.py).
    max_request_body_bytes: int = Field(1024 * 1024, ge=1024)
    # List lengths checked before any per-item validation of a job spec.
    max_host_labels: int = Field(32, ge=1)
    max_contexts: int = Field(16, ge=1)
    max_rounds: int = Field(100, ge=1)
    # A job measuring until decided (the default) that gives no time budget stops at the first
    # look after this many minutes of measuring (0: at its rounds budget alone), so one noisy
    # job cannot hold a shared host for hours.
    default_budget_minutes: float = Field(60.0, ge=0, le=10_080, allow_inf_nan=False)
    max_decode_tokens: int = Field(1024, ge=0)
    max_context_tokens: int = Field(262_144, ge=1)
    max_hosts_per_job: int = Field(16, ge=1)
    max_variants: int = Field(32, ge=1)

    # Threads serving synchronous endpoints and the database work of async ones (a waiting
    # lease request holds no thread).
    api_threads: int = Field(200, ge=8)
    # Database connections of each API process, all opened on first need and kept; none is
    # opened beyond them (a request waits for one). The async engine's serve the agents'
    # requests and submissions, the sync engine's the rest (pages, lists, registration, the
    # sweep). Few on purpose: PostgreSQL runs only as many statements at once as it has cores,
    # and every connection is a server process that parses and plans each statement again on
    # its first use (asyncpg's prepared statements are per connection): a large pool opens
    # and prepares anew exactly when a burst of agents arrives.
    db_async_pool_size: int = Field(6, ge=1)
    db_sync_pool_size: int = Field(8, ge=1)
    # Before its first request the server runs one agent cycle's transactions on each async
    # connection and rolls them back, so that no request pays for compiling and preparing
    # statements (api/rehearsal.py). Off only where many short-lived apps start (tests).
    rehearse_at_start: bool = True
    # Transactions of uploads and completions at once per API process (0: no limit); the
    # others wait for a turn, parked off the event loop's ready queue, and never hold more of
    # the async pool than this, so a lease claim (or a heartbeat, a submission) neither waits
    # for a connection behind them nor behind their statements on the loop.
    db_bulk_transactions_max: int = Field(2, ge=0)

    # The longest a request waits on the database (the API process's engines; Celery and the
    # command line keep the drivers' own waits): for a connection of the pool, to connect
    # (psycopg's sync connect: whole seconds, at least 2), for a lock and for a statement
    # (PostgreSQL's lock_timeout and statement_timeout; asyncpg also gives up on a server that
    # stops answering a quarter second later; SQLite's busy timeout). Past it the request is
    # answered 503 with Retry-After, and what its transaction wrote is rolled back.
    db_request_timeout_s: float = Field(1.0, gt=0)

    lease_ttl_s: int = Field(60, ge=1)
    lease_wait_max_s: int = Field(25, ge=0)
    # A waiting lease request is woken by a notification when work is queued; this bounds the
    # wait between two claims when no notification comes (SQLite, a listener reconnecting).
    lease_poll_s: float = Field(2.0, gt=0)
    # How often each API process requeues runs whose lease or hard timeout passed (Celery beat
    # does it too; either is enough).
    lease_sweep_s: float = Field(5.0, gt=0)
    run_timeout_s: int = Field(6 * 3600, ge=1)
    max_attempts: int = Field(3, ge=1)

    # Celery: how long an unacknowledged task waits in Redis before it is delivered again
    # (a worker killed mid-task); must exceed the longest task.
    celery_visibility_timeout_s: int = Field(3600, ge=1)
    # Prefix of every Redis key Celery uses: lets several deployments (or test sessions)
    # share one Redis database without taking each other's tasks.
    celery_key_prefix: str = Field("", pattern=r"^[A-Za-z0-9_.:-]{0,64}$")
    # Celery beat: how often lost leases are expired and stored-but-unprocessed work resent.
    beat_expire_leases_s: float = Field(15.0, gt=0)
    beat_reprocess_s: float = Field(60.0, gt=0)
    ingest_batch_size: int = Field(500, ge=1)
    # Pause between ingest batches: keeps a large ingest from starving the database of write
    # slots; tests use it to kill a Celery worker while an ingest is half done.
    ingest_batch_pause_s: float = Field(0.0, ge=0)

    # The GitHub integration's per-repository configuration (api/github/config.py, a TOML file
    # holding tokens and webhook secrets: keep it readable by the service only); unset, the
    # webhook answers 404 and no pull request is answered.
    github_config: Path | None = None

    # Signs the browser's session and CSRF cookies (api/pages). Empty means a random secret
    # kept in state_dir/web-secret; replicas behind one proxy must share one value.
    web_secret: str = ""
    web_session_ttl_s: int = Field(12 * 3600, ge=60)

    @model_validator(mode="after")
    def _artifacts_under_state_dir(self) -> Settings:
        # Moving the state folder moves the default store with it.
        if "artifact_dir" not in self.model_fields_set:
            self.artifact_dir = self.state_dir / "artifacts"
        return self

    @property
    def spec_limits(self) -> SpecLimits:
        """The job sizes this service takes, as JobSpec's validation checks them."""
        return SpecLimits(
            max_contexts=self.max_contexts,
            max_context_tokens=self.max_context_tokens,
            max_rounds=self.max_rounds,
            max_decode_tokens=self.max_decode_tokens,
            max_hosts=self.max_hosts_per_job,
        )

    @property
    def is_embedded(self) -> bool:
        return not self.database_url

    @property
    def sqlalchemy_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.state_dir / 'coldbench.db').resolve()}"

    @property
    def broker_url(self) -> str:
        if self.redis_url:
            return self.redis_url
        return f"sqla+sqlite:///{(self.state_dir / 'broker.db').resolve()}"

    @property
    def result_backend_url(self) -> str:
        if self.redis_url:
            return self.redis_url
        return f"db+sqlite:///{(self.state_dir / 'results.db').resolve()}"


@lru_cache
def get_settings() -> Settings:
    return Settings()
