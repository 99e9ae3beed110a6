"""Webhook deliveries: the signature checked before anything is parsed, then the few facts of
an event the service acts on, validated.

A delivery is signed with one repository's webhook secret (`X-Hub-Signature-256`, HMAC-SHA256
of the raw body, compared in constant time by gidgethub); the body is parsed only once a
configured secret matches, and the repository it names must be one whose secret signed it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from gidgethub import BadRequest, ValidationFailure
from gidgethub.sansio import Event, validate_event
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from coldbench.api.errors import Forbidden, Invalid
from coldbench.api.github.commands import MAX_LINE_CHARS, find_command
from coldbench.api.github.config import ACTOR_PATTERN, GitHubConfig

SIGNATURE_HEADER = "x-hub-signature-256"
_DELIVERY_ID = re.compile(r"^[0-9A-Za-z-]{1,64}$")
_EVENT_NAME = re.compile(r"^[a-z_]{1,40}$")
# The external id the service gives its check runs: the pull request, and the job (if any).
CHECK_RUN_EXTERNAL_ID = re.compile(r"^pr-([1-9][0-9]{0,9})(?::([0-9A-Za-z_-]{1,64}))?$")


def check_run_external_id(number: int, job_id: str | None) -> str:
    return f"pr-{number}:{job_id}" if job_id else f"pr-{number}"


@dataclass(frozen=True)
class Delivery:
    """A delivery whose signature matched the webhook secret of `repository` (None: an event
    about no repository, such as a GitHub App's `ping` or `installation`, signed with one of
    the configured secrets)."""

    delivery_id: str
    event: str
    repository: str | None
    data: dict[str, Any]


def verify_delivery(config: GitHubConfig, headers: Mapping[str, str], body: bytes) -> Delivery:
    """The signed delivery, or Forbidden/Invalid with one line; `headers` with lowercase keys."""
    signature = headers.get(SIGNATURE_HEADER, "")
    if not signature.startswith("sha256="):
        raise Forbidden("refused: no X-Hub-Signature-256 (sha256=...) header")
    signed_for = [
        name
        for name, repository in config.repositories.items()
        if _is_signed(body, signature, repository.webhook_secret.get_secret_value())
    ]
    if not signed_for:
        raise Forbidden("refused: X-Hub-Signature-256 matches no configured webhook secret")
    delivery_id = headers.get("x-github-delivery", "")
    event_name = headers.get("x-github-event", "")
    if not _DELIVERY_ID.fullmatch(delivery_id) or not _EVENT_NAME.fullmatch(event_name):
        raise Invalid("X-GitHub-Delivery and X-GitHub-Event must name the delivery and event")
    if headers.get("content-type", "").partition(";")[0].strip() != "application/json":
        raise Invalid("set the webhook's content type to application/json")
    secret = config.repositories[signed_for[0]].webhook_secret.get_secret_value()
    try:
        event = Event.from_http(headers, body, secret=secret)
    except BadRequest:
        raise Invalid("the delivery's body is not JSON") from None
    if not isinstance(event.data, dict):
        raise Invalid("the delivery's body is not a JSON object")
    if event.data.get("repository") is None:
        # A GitHub App's own events (`ping`, `installation.created`, ...) name no repository:
        # answered, never acted on.
        return Delivery(delivery_id, event_name, None, event.data)
    named = (event.data.get("repository") or {}).get("full_name")
    signer = next((name for name in signed_for if name.lower() == str(named).lower()), None)
    if signer is None:
        raise Forbidden("refused: the delivery is not signed with its repository's secret")
    return Delivery(delivery_id, event_name, signer, event.data)


def _is_signed(body: bytes, signature: str, secret: str) -> bool:
    try:
        validate_event(body, signature=signature, secret=secret)
    except ValidationFailure:
        return False
    return True


class Facts(BaseModel):
    """What the service keeps of an event it acts on (validated; nothing else is stored)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["comment", "labeled", "synchronize", "opened", "rerequested"]
    number: int = Field(ge=1, le=2**31 - 1)
    # Who asked: the comment's author, who added the label, who pushed, who clicked Re-run.
    login: str = Field(pattern=ACTOR_PATTERN)
    # The `/coldbench` line (cut just past the longest line read: refused on the pull request).
    command: str | None = Field(None, max_length=MAX_LINE_CHARS + 1)
    label: str | None = Field(None, max_length=100)
    # The head the event is about: the pull request's at the label or push, the re-run check
    # run's commit. A comment's event carries none (its moment is `at`).
    head_sha: str | None = Field(None, pattern=r"^[0-9a-f]{40}$")
    # GitHub's time of the event: a comment's creation, a pull request's last update.
    at: datetime | None = None
    comment_id: int | None = Field(None, ge=1)
    # A re-run check run's job (from its external id), None for a "how to ask" check run.
    job_id: str | None = Field(None, pattern=r"^[0-9A-Za-z_-]{1,64}$")
    installation_id: int | None = Field(None, ge=1)

    @property
    def source_key(self) -> str | None:
        """What the event is about, whatever its delivery id: acted on once."""
        return f"comment:{self.comment_id}" if self.comment_id is not None else None


def event_facts(delivery: Delivery) -> Facts | None:
    """The facts of an event the service acts on; None for every other event (a comment that
    asks nothing, an edited comment, a closed pull request, ...). Invalid when an event the
    service acts on lacks what GitHub always sends."""
    data = delivery.data
    if delivery.repository is None:
        return None
    action = data.get("action")
    installation = (data.get("installation") or {}).get("id")
    try:
        if delivery.event == "issue_comment" and action == "created":
            issue = data["issue"]
            command = find_command(str(data["comment"]["body"] or ""))
            if not issue.get("pull_request") or command is None:
                return None
            return Facts(
                kind="comment",
                number=issue["number"],
                login=data["comment"]["user"]["login"],
                # A line too long to read is kept just past the limit: refused on the PR.
                command=command[: MAX_LINE_CHARS + 1],
                at=data["comment"]["created_at"],
                comment_id=data["comment"]["id"],
                installation_id=installation,
            )
        if delivery.event == "pull_request" and action in (
            "labeled",
            "synchronize",
            "opened",
            "reopened",
        ):
            pull = data["pull_request"]
            return Facts(
                kind="opened" if action == "reopened" else action,
                number=pull["number"],
                login=data["sender"]["login"],
                label=(data.get("label") or {}).get("name"),
                head_sha=pull["head"]["sha"],
                at=pull["updated_at"],
                installation_id=installation,
            )
        if delivery.event == "check_run" and action == "rerequested":
            check_run = data["check_run"]
            found = CHECK_RUN_EXTERNAL_ID.fullmatch(str(check_run.get("external_id") or ""))
            if found is None:
                return None  # another App's check run, or one made before external ids
            return Facts(
                kind="rerequested",
                number=int(found.group(1)),
                login=data["sender"]["login"],
                head_sha=check_run["head_sha"],
                job_id=found.group(2),
                installation_id=installation,
            )
    except (KeyError, TypeError, ValidationError):
        raise Invalid(f"a {delivery.event} event without the fields GitHub sends") from None
    return None
