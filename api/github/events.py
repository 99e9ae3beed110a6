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
from typing import Any, Literal

from gidgethub import BadRequest, ValidationFailure
from gidgethub.sansio import Event, validate_event
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from api.errors import Forbidden, Invalid
from api.github.commands import find_command
from api.github.config import LOGIN_PATTERN, GitHubConfig

SIGNATURE_HEADER = "x-hub-signature-256"
_DELIVERY_ID = re.compile(r"^[0-9A-Za-z-]{1,64}$")
_EVENT_NAME = re.compile(r"^[a-z_]{1,40}$")


@dataclass(frozen=True)
class Delivery:
    """A delivery whose signature matched the webhook secret of `repository`."""

    delivery_id: str
    event: str
    repository: str
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

    kind: Literal["comment", "labeled", "synchronize"]
    number: int = Field(ge=1, le=2**31 - 1)
    # Who asked: the comment's author, who added the label, or who pushed.
    login: str = Field(pattern=LOGIN_PATTERN)
    command: str | None = Field(None, max_length=2000)
    label: str | None = Field(None, max_length=100)
    head_sha: str | None = Field(None, pattern=r"^[0-9a-f]{40}$")
    installation_id: int | None = Field(None, ge=1)


def event_facts(delivery: Delivery) -> Facts | None:
    """The facts of an event the service acts on; None for every other event (a comment that
    asks nothing, an edited comment, a closed pull request, ...). Invalid when an event the
    service acts on lacks what GitHub always sends."""
    data = delivery.data
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
                command=command,
                installation_id=installation,
            )
        if delivery.event == "pull_request" and action in ("labeled", "synchronize"):
            pull = data["pull_request"]
            return Facts(
                kind=action,
                number=pull["number"],
                login=data["sender"]["login"],
                label=(data.get("label") or {}).get("name"),
                head_sha=pull["head"]["sha"],
                installation_id=installation,
            )
    except (KeyError, TypeError, ValidationError):
        raise Invalid(f"a {delivery.event} event without the fields GitHub sends") from None
    return None
