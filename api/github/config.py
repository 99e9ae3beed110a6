"""Per-repository GitHub configuration: a TOML file named by COLDBENCH_GITHUB_CONFIG.

One `[repositories."OWNER/NAME"]` table per pull-request repository the service answers: its
API base URL (GitHub Enterprise: `https://ghe.example.org/api/v3`), credentials (a token, or a
GitHub App's id and private key), the webhook secret, who may ask, the coldbench repository
name the hosts allow-list it under, the defaults of a request and the status policy. Secrets
are `SecretStr`: neither a log line nor a repr shows them.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from coldbench.evidence.contract.schemas import (
    NAME_PATTERN,
    REPOSITORY_ADAPTER,
    AdapterName,
    error_line,
)

# OWNER/NAME as GitHub spells them.
FULL_NAME_PATTERN = r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})/[A-Za-z0-9._-]{1,100}$"
# Who acts in an event: a user, or an App's bot account (`dependabot[bot]`, `renovate[bot]`).
ACTOR_PATTERN = r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})(?:\[bot\])?$"
FullName = Annotated[str, Field(pattern=FULL_NAME_PATTERN)]
Actor = Annotated[str, Field(pattern=ACTOR_PATTERN)]


class GitHubConfigError(ValueError):
    """The configuration file is missing, not TOML or not valid; the message says where."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RequestDefaults(_Strict):
    """What a request that names no option gets (the text a person would type for it)."""

    mode: Literal["ab", "ablation", "sweep", "commits"] = "ab"
    contexts: str = Field("4K", max_length=200)
    rounds: int | None = Field(None, ge=1)
    model: str | None = Field(None, max_length=100)
    labels: str = Field("", max_length=500)
    features: str = Field("", max_length=500)


class StatusPolicy(_Strict):
    """How a finished job's verdicts become the commit status (or check run conclusion).

    failure: some comparison is `slower` by more than `failure_slower_pct` percent;
    success: some comparison is `faster` and none is a failure;
    neutral: everything else (no established change, inconclusive, slower within the limit).
    A commit status has no neutral state: it is posted as `neutral_status`.
    """

    failure_slower_pct: float = Field(0.0, ge=0, le=100)
    neutral_status: Literal["success", "failure"] = "success"


class RepositoryConfig(_Strict):
    """One pull-request repository the service answers."""

    api_url: str = Field("https://api.github.com", pattern=r"^https?://[^\s/?#]+(/[^\s?#]*)?$")
    # Credentials: a token (fine-grained or classic, or an installation's), or a GitHub App.
    token: SecretStr | None = None
    app_id: int | None = Field(None, ge=1)
    private_key_file: Path | None = None
    webhook_secret: SecretStr
    # The repository's name in the hosts' allow-lists (worker.toml `[repositories.NAME]`).
    coldbench_repository: str = Field(pattern=NAME_PATTERN)
    adapter: AdapterName = REPOSITORY_ADAPTER
    # "write": collaborators with write, maintain or admin permission; or the logins allowed.
    askers: Literal["write"] | list[Actor] = "write"
    # Adding this label to a pull request asks for the default request; "" disables labels.
    label: str = Field("coldbench", max_length=50)
    # A push to a pull request starts the default request when its pusher may ask.
    auto_run_on_push: bool = False
    # `coldbench submit --pr` and the form on a fork's pull request: false (the default), the
    # submitter names the head commit they reviewed (`--head SHA`); true, the deployer's
    # choice, any submitter key runs whatever the fork's head is when asked.
    api_runs_fork_heads: bool = False
    # Jobs started for one pull request per rolling hour; more are refused on the PR.
    max_jobs_per_hour: int = Field(4, ge=1, le=1000)
    report: Literal["status", "check-run"] = "status"
    status_context: str = Field("coldbench", min_length=1, max_length=100)
    defaults: RequestDefaults = RequestDefaults()
    policy: StatusPolicy = StatusPolicy()

    @field_validator("webhook_secret")
    @classmethod
    def _secret_long_enough(cls, secret: SecretStr) -> SecretStr:
        if len(secret.get_secret_value()) < 16:
            raise ValueError("webhook_secret needs at least 16 characters")
        return secret

    @model_validator(mode="after")
    def _one_kind_of_credentials(self) -> RepositoryConfig:
        is_app = self.app_id is not None or self.private_key_file is not None
        if self.token is not None and is_app:
            raise ValueError("give a token or app_id and private_key_file, not both")
        if is_app and (self.app_id is None or self.private_key_file is None):
            raise ValueError("a GitHub App needs both app_id and private_key_file")
        if self.token is None and not is_app:
            raise ValueError("give a token, or app_id and private_key_file")
        if self.report == "check-run" and not is_app:
            raise ValueError('report = "check-run" needs a GitHub App (tokens post statuses)')
        return self

    @property
    def api_base(self) -> str:
        return self.api_url.rstrip("/")


class GitHubConfig(_Strict):
    # The service's own address for links in comments and statuses (its pages, /e/<id>).
    service_url: str = Field(pattern=r"^https?://[^\s/?#]+(/[^\s?#]*)?$")
    repositories: dict[FullName, RepositoryConfig] = Field(default_factory=dict)

    def repository(self, full_name: str) -> RepositoryConfig | None:
        """The configuration of OWNER/NAME (GitHub compares names without case)."""
        wanted = full_name.lower()
        for name, config in self.repositories.items():
            if name.lower() == wanted:
                return config
        return None

    def repository_name(self, full_name: str) -> str:
        """OWNER/NAME as this configuration spells it (the key rows are stored under)."""
        wanted = full_name.lower()
        return next((name for name in self.repositories if name.lower() == wanted), full_name)

    def link(self, path: str) -> str:
        return self.service_url.rstrip("/") + path


def load_github_config(path: Path) -> GitHubConfig:
    """The file at `path`, validated; GitHubConfigError in one line otherwise."""
    try:
        raw = tomllib.loads(path.read_text())
    except OSError as error:
        raise GitHubConfigError(f"{path}: cannot read: {error.strerror}") from None
    except tomllib.TOMLDecodeError as error:
        raise GitHubConfigError(f"{path}: not TOML: {error}") from None
    try:
        return GitHubConfig.model_validate(raw)
    except ValidationError as error:
        raise GitHubConfigError(f"{path}: {error_line(error)}") from None
