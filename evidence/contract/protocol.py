"""The worker protocol: every request and response an agent and the API exchange.

One type per message, imported by both sides (the API's routers and `worker/agent.py`), so the
agent never builds a JSON shape by hand and the API never accepts one it did not declare.
Every request model forbids unknown fields: a message from a newer or older agent that the API
does not understand is refused with the field named, never half-stored.

The messages, in the order a host sends them (all under `API_PREFIX`, bearer-authenticated):

- `POST /workers/register` (enrollment token) `RegisterRequest` -> `RegisterResponse`
- `POST /leases` (worker secret) `LeaseRequest` -> `Lease`, or 204 after `wait_s`
- `POST /workers/heartbeat` `HeartbeatRequest` -> `HeartbeatResponse`
- `PUT /runs/{run_id}/artifacts/{name}?attempt=N` raw body with `CONTENT_SHA256_HEADER`
  -> `ArtifactReceipt`
- `POST /runs/{run_id}/complete` `CompleteRequest` -> `CompleteResponse`
- `PUT /workers/calibration` `CalibrationReport` -> `CalibrationAccepted` (after `coldbench
  calibrate`; the report is the result file itself,
  `coldbench.evidence.contract.calibration.HostCalibration`)

Errors come back as `ErrorBody`: one line, and the request field it is about where there is one.
Jobs and runs report their state as `JobState` and `RunState` (the API stores nothing else:
its tables CHECK them), which `coldbench submit` and the pages read.

## What a host offers: repositories, adapters and options

Registration (and every lease request, so an edited worker.toml is seen without enrolling
again) reports each allow-listed repository as a `RepositoryOffer`: the adapter that drives it
on this host, its build recipe names, and the options its worker.toml declares. The API refuses
at submit a job that no host can run (wrong adapter, unknown option, value out of bounds), and
the form offers per repository the adapters hosts allow for it.

An option is declared by the host owner (worker.toml, `worker/config.py`) and only *described*
here by `OptionDeclaration`: its type (`int` within optional inclusive bounds, or `bool`) and
whether the host proves from the server's own output that it ran. What the option does (argv
pieces, environment variables, proof regex) stays on the host and never travels: a submitter
picks a value, the host maps it. `worker/config.py` turns each declared option into an
`OptionDeclaration` for registration.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Final, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, model_validator

from coldbench.evidence.contract.boundary import INT32_MAX, MULTILINE, Checked, Int32, Paragraph
from coldbench.evidence.contract.calibration import HostCalibration
from coldbench.evidence.contract.schemas import (
    NAME_PATTERN,
    REPOSITORY_ADAPTER,
    AdapterName,
    FlagValue,
    HostInfo,
    Label,
    Name,
)

API_PREFIX: Final = "/api/v1"
# The longest a lease request may wait for work before the API answers 204. The agent waits
# this long by default; the API clamps `wait_s` to it (and to its own setting, if lower).
LEASE_WAIT_MAX_S: Final = 25
CONTENT_SHA256_HEADER: Final = "X-Content-SHA256"
# An agent's heartbeat period (idle or not); each heartbeat renews its run's lease.
HEARTBEAT_S: Final = 15.0
# The agent reports at most this many not-ok cells per heartbeat (the newest ones).
MAX_INVALID_IN_HEARTBEAT: Final = 50
MAX_REASON_CHARS: Final = 4000

ModelName = Annotated[str, Field(pattern=r"^(preset:)?[A-Za-z0-9][A-Za-z0-9_.+-]{0,99}$")]
# run_attempts.attempt and artifacts.attempt are 32-bit integer columns on PostgreSQL.
ATTEMPT_MAX: Final = 2**31 - 1
Attempt = Annotated[int, Field(ge=1, le=ATTEMPT_MAX)]
# Flag and option names, as in a VariantSpec's flags.
OptionName = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,63}$")]
RunStatus = Literal["succeeded", "failed"]


class JobState(StrEnum):
    """queued -> running -> analyzing -> done; failed when no run produced data; cancelled."""

    QUEUED = "queued"
    RUNNING = "running"
    ANALYZING = "analyzing"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def is_final(self) -> bool:
        return self in (JobState.DONE, JobState.FAILED, JobState.CANCELLED)


class RunState(StrEnum):
    """queued -> leased -> completed (raw stored) -> processed (ingested); failed is a benchmark
    result and final; expired when every attempt was lost; cancelled with its job.

    An attempt (one lease of a run) is leased, then completed, failed, expired or cancelled.
    """

    QUEUED = "queued"
    LEASED = "leased"
    COMPLETED = "completed"
    PROCESSED = "processed"
    FAILED = "failed"
    EXPIRED = "expired"
    CANCELLED = "cancelled"

    @property
    def is_final(self) -> bool:
        return self in FINAL_RUN_STATES

    @property
    def label(self) -> str:
        """The word pages show, in the jobs' vocabulary (a leased run is running)."""
        return _RUN_LABELS[self]


_RUN_LABELS: Final = {
    RunState.QUEUED: "queued",
    RunState.LEASED: "running",
    RunState.COMPLETED: "uploaded",
    RunState.PROCESSED: "done",
    RunState.FAILED: "failed",
    RunState.EXPIRED: "lost",
    RunState.CANCELLED: "cancelled",
}

FINAL_RUN_STATES: Final = frozenset(
    {RunState.PROCESSED, RunState.FAILED, RunState.EXPIRED, RunState.CANCELLED}
)
ATTEMPT_STATES: Final = (
    RunState.LEASED,
    RunState.COMPLETED,
    RunState.FAILED,
    RunState.EXPIRED,
    RunState.CANCELLED,
)


class _Request(Checked):
    model_config = ConfigDict(extra="forbid")


# --- registration ------------------------------------------------------------------------------


class OptionDeclaration(_Request):
    """A host-declared option of a repository, as a submitter may use it (never its argv)."""

    type: Literal["int", "bool"]
    min: int | None = None  # inclusive bounds of an int option; None: unbounded on that side
    max: int | None = None
    proof: bool = False  # the host counts a regex over the server's output as proof it ran

    @model_validator(mode="after")
    def _bounds_fit_the_type(self) -> OptionDeclaration:
        if self.type == "bool" and (self.min is not None or self.max is not None):
            raise ValueError("a bool option has no bounds")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min {self.min} is above max {self.max}")
        return self

    def why_not(self, value: FlagValue) -> str | None:
        """None when `value` is acceptable; otherwise what is wrong with it, in a few words."""
        if self.type == "bool":
            # `fast=1` is how a variant usually turns an option on.
            if isinstance(value, bool) or (isinstance(value, int) and value in (0, 1)):
                return None
            return f"{value!r} is not true, false, 1 or 0"
        if isinstance(value, bool) or not isinstance(value, int):
            return f"{value!r} is not a whole number"
        if self.min is not None and value < self.min:
            return f"{value} is below the minimum {self.min}"
        if self.max is not None and value > self.max:
            return f"{value} is above the maximum {self.max}"
        return None

    def describe(self) -> str:
        """`int 1..8192`, `int >= 1`, `bool`: for messages and the form."""
        if self.type == "bool":
            return "bool"
        if self.min is not None and self.max is not None:
            return f"int {self.min}..{self.max}"
        if self.min is not None:
            return f"int >= {self.min}"
        if self.max is not None:
            return f"int <= {self.max}"
        return "int"


class RepositoryOffer(_Request):
    """One allow-listed repository of a host: how it is driven and what a job may pick."""

    adapter: AdapterName = REPOSITORY_ADAPTER  # embedded: a coldbench checkout whose engine/ runs
    recipes: list[Name] = Field(default_factory=list, max_length=50)
    options: dict[OptionName, OptionDeclaration] = Field(default_factory=dict, max_length=100)


Repositories = Annotated[dict[Name, RepositoryOffer], Field(max_length=100)]


class RegisterRequest(_Request):
    name: str = Field(pattern=NAME_PATTERN)
    fingerprint: HostInfo
    labels: list[Label] = Field(default_factory=list, max_length=100)
    repositories: Repositories = Field(default_factory=dict)
    models: list[ModelName] = Field(default_factory=list, max_length=200)


class RegisterResponse(BaseModel):
    worker_id: str
    secret: str  # shown once; the API keeps only its digest


# --- leases ------------------------------------------------------------------------------------


class LeaseRequest(_Request):
    """No labels: a host's labels come from its enrollment and the admin, never from a lease."""

    fingerprint: HostInfo
    wait_s: int = Field(0, ge=0, le=LEASE_WAIT_MAX_S)
    # What the host's worker.toml offers now; None keeps what it registered (older agents).
    repositories: Repositories | None = None
    models: list[ModelName] | None = Field(None, max_length=200)


class Lease(BaseModel):
    """A run leased to this host: keep it alive with heartbeats, finish with a completion."""

    run_id: str
    attempt: int
    job_id: str
    spec: dict[str, Any]  # a coldbench.job/1 JobSpec; the agent validates it before running
    timeout_s: int
    lease_ttl_s: int


# --- heartbeat ---------------------------------------------------------------------------------


class InvalidCell(Checked):
    model_config = ConfigDict(extra="allow")
    variant: str | None = Field(None, max_length=200)
    round: Int32 | None = None
    context_tokens: Int32 | None = None
    reason: Paragraph | None = Field(None, max_length=MAX_REASON_CHARS)


class Progress(Checked):
    model_config = ConfigDict(extra="allow")
    cells_done: int = Field(ge=0, le=INT32_MAX)
    cells_total: int = Field(ge=0, le=INT32_MAX)
    variant: str | None = Field(None, max_length=200)
    context_tokens: Int32 | None = None
    # Seconds the rest of the run's cells should take at the mean cell time so far, as of this
    # heartbeat (the server counts it down from the heartbeat's arrival).
    eta_s: float | None = Field(None, ge=0, allow_inf_nan=False)
    invalid: list[InvalidCell] = Field(default_factory=list, max_length=1000)


class HeartbeatRequest(_Request):
    run_id: str | None = Field(None, max_length=64)  # None while idle
    attempt: Attempt | None = None
    progress: Progress | None = None


class HeartbeatResponse(BaseModel):
    cancel: bool  # stop the run after the cell in flight (cancelled, or the attempt was lost)


# --- upload and completion ---------------------------------------------------------------------


class ArtifactReceipt(BaseModel):
    run_id: str
    attempt: int
    name: str
    sha256: str
    bytes: int
    created: bool  # False: the same name and digest were already stored (a retried upload)


class CompleteRequest(_Request):
    attempt: Attempt
    status: RunStatus
    reason: Paragraph | None = Field(None, max_length=MAX_REASON_CHARS)
    # Validated as a Manifest by the API, with its own messages.
    manifest: Annotated[dict[str, Any], MULTILINE]


class CompleteResponse(BaseModel):
    run_id: str
    attempt: int
    state: RunState


# --- errors ------------------------------------------------------------------------------------


class FieldError(BaseModel):
    """One problem of a refused request and the field it concerns, if one."""

    field: str | None = None
    detail: str


class ErrorBody(BaseModel):
    """What every refused request answers: one line, and the field it concerns if one; where
    one pass found several problems (a job spec), `errors` lists each with its field."""

    detail: str
    field: str | None = None
    errors: list[FieldError] | None = None


# `PUT /workers/calibration`: the body is the result `coldbench calibrate` writes to its file,
# so the file and the report cannot drift apart (extra fields refused, like every request).
CalibrationReport: TypeAlias = HostCalibration


class ReproductionAccepted(BaseModel):
    """The API kept an uploaded reproduction of `evidence_id` (`created` False: the same bundle
    was already kept for this host): the host it is shown as, and the hosts' agreement as the
    evidence page now states it (`coldbench compare`'s lines)."""

    evidence_id: str
    reproduction_id: str
    host: str
    created: bool
    lines: list[str]


class CalibrationAccepted(BaseModel):
    """The API kept the report as the host's latest calibration: the host it is stored for
    and the lines /hosts shows for it."""

    host: str
    lines: list[str]
