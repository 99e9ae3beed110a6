"""Calls to GitHub's REST API through gidgethub, only ever to the repository's configured base.

Every URL is built from the configured `api_url` and a path of GitHub's documentation; a URL
found in an event (`comments_url`, `statuses_url`, ...) is never followed. A request hook
refuses any request outside the base anyway, and redirects are not followed.
"""

from __future__ import annotations

import logging
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
from gidgethub import BadRequest, GitHubBroken, HTTPException, RateLimitExceeded
from gidgethub.apps import get_installation_access_token, get_jwt
from gidgethub.httpx import GitHubAPI

from coldbench.api.github.config import RepositoryConfig

log = logging.getLogger(__name__)

REQUESTER = "coldbench"
TIMEOUT_S = 10.0
# The legacy `permission` field of a collaborator: maintainers read as write there.
WRITE_PERMISSIONS = ("admin", "write")


class OutboundRefused(RuntimeError):
    """A request to somewhere other than the configured API base; nothing was sent."""


# GitHub busy, limiting, refusing or unreachable: the work is kept and tried again later.
GITHUB_ERRORS = (HTTPException, httpx.TransportError)
MAX_BACKOFF_S = 3600.0


def retry_delay(error: BaseException, attempts: int) -> float:
    """How long to wait before calling GitHub again after `error` (the `attempts`-th in a
    row), as GitHub's REST docs ask: a primary rate limit until its reset, a secondary one
    for its Retry-After (a minute when it gives none), anything else (5xx, a timeout, 401,
    403) with exponential backoff and jitter, at most an hour."""
    if isinstance(error, RateLimitExceeded):
        wait = (error.rate_limit.reset_datetime - _now()).total_seconds()
        return min(max(wait, 1.0), MAX_BACKOFF_S)
    if isinstance(error, HTTPException):
        headers = error.headers or {}
        retry_after = headers.get("retry-after") or headers.get("Retry-After")
        if retry_after is not None and str(retry_after).isdigit():
            return min(max(float(retry_after), 1.0), MAX_BACKOFF_S)
        if int(error.status_code) in (403, 429) and "rate limit" in str(error).lower():
            return 60.0
    base = min(30.0 * 2 ** min(attempts, 7), MAX_BACKOFF_S)
    return base * random.uniform(0.8, 1.0)


def _now() -> Any:
    from datetime import UTC, datetime

    return datetime.now(UTC)


def describe(error: BaseException) -> str:
    """One line for the log and the delivery's outcome."""
    if isinstance(error, HTTPException):
        return f"GitHub answered {int(error.status_code)}: {error}"[:300]
    return f"GitHub unreachable: {type(error).__name__}"


def is_server_error(error: BaseException) -> bool:
    return isinstance(error, GitHubBroken | httpx.TransportError)


def _only_to(api_base: str) -> Any:
    async def check(request: httpx.Request) -> None:
        url = str(request.url)
        if not (url == api_base or url.startswith(api_base + "/")):
            raise OutboundRefused(f"refused a request outside {api_base}")

    return check


@asynccontextmanager
async def github_api(
    config: RepositoryConfig, *, installation_id: int | None = None, full_name: str | None = None
) -> AsyncIterator[GitHubAPI]:
    """A client for one repository: its token, or an installation token of its App (of the
    installation given, else of the one on `full_name`)."""
    async with httpx.AsyncClient(
        timeout=TIMEOUT_S,
        follow_redirects=False,
        event_hooks={"request": [_only_to(config.api_base)]},
    ) as client:
        if config.token is not None:
            yield GitHubAPI(
                client,
                REQUESTER,
                oauth_token=config.token.get_secret_value(),
                base_url=config.api_base,
            )
            return
        assert config.app_id is not None and config.private_key_file is not None  # validated
        private_key = config.private_key_file.read_bytes()
        app = GitHubAPI(client, REQUESTER, base_url=config.api_base)
        if installation_id is None:
            if full_name is None:
                raise ValueError("a GitHub App needs the installation or the repository")
            installation = await app.getitem(
                "/repos/{owner}/{repo}/installation",
                _owner_repo(full_name),
                jwt=get_jwt(app_id=str(config.app_id), private_key=private_key),
            )
            installation_id = int(installation["id"])
        access = await get_installation_access_token(
            app,
            installation_id=str(installation_id),
            app_id=str(config.app_id),
            private_key=private_key,
        )
        yield GitHubAPI(client, REQUESTER, oauth_token=access["token"], base_url=config.api_base)


def _owner_repo(full_name: str) -> dict[str, str]:
    owner, _, repo = full_name.partition("/")
    return {"owner": owner, "repo": repo}


async def may_write(gh: GitHubAPI, full_name: str, login: str) -> bool:
    """Whether `login` has write (or maintain, admin) permission on the repository."""
    try:
        answer = await gh.getitem(
            "/repos/{owner}/{repo}/collaborators/{username}/permission",
            {**_owner_repo(full_name), "username": login},
        )
    except BadRequest as error:
        if error.status_code == 404:  # not a collaborator
            return False
        raise
    return answer.get("permission") in WRITE_PERMISSIONS


@dataclass(frozen=True)
class PullRequestHeads:
    """A pull request's commits as GitHub says they are now."""

    number: int
    base_sha: str
    head_sha: str
    state: str
    # The head is in another repository (a fork, or a fork since deleted): its commits are
    # someone else's until an allowed asker approves one.
    from_fork: bool = True
    # Where head's line leaves the base branch (asked for mode `commits` only).
    merge_base_sha: str | None = None


async def pull_request(gh: GitHubAPI, full_name: str, number: int) -> PullRequestHeads:
    answer = await gh.getitem(
        "/repos/{owner}/{repo}/pulls/{number}", {**_owner_repo(full_name), "number": number}
    )
    head_repo = (answer["head"].get("repo") or {}).get("full_name")
    return PullRequestHeads(
        number=number,
        base_sha=str(answer["base"]["sha"]),
        head_sha=str(answer["head"]["sha"]),
        state=str(answer["state"]),
        from_fork=head_repo is None or str(head_repo).lower() != full_name.lower(),
    )


async def merge_base(gh: GitHubAPI, full_name: str, base: str, head: str) -> str:
    """The merge base of two commits (GitHub's compare)."""
    answer = await gh.getitem(
        "/repos/{owner}/{repo}/compare/{basehead}",
        {**_owner_repo(full_name), "basehead": f"{base}...{head}"},
    )
    return str(answer["merge_base_commit"]["sha"])


async def set_status(
    gh: GitHubAPI,
    full_name: str,
    sha: str,
    *,
    state: str,
    description: str,
    target_url: str,
    context: str,
) -> None:
    await gh.post(
        "/repos/{owner}/{repo}/statuses/{sha}",
        {**_owner_repo(full_name), "sha": sha},
        data={
            "state": state,
            "description": description[:140],
            "target_url": target_url,
            "context": context,
        },
    )


async def create_check_run(
    gh: GitHubAPI,
    full_name: str,
    sha: str,
    *,
    name: str,
    details_url: str,
    title: str,
    external_id: str,
    summary: str | None = None,
    conclusion: str | None = None,
) -> int:
    data: dict[str, Any] = {
        "name": name,
        "head_sha": sha,
        "status": "queued",
        "external_id": external_id,
        "details_url": details_url,
        "output": {"title": title[:200], "summary": (summary or title)[:60_000]},
    }
    if conclusion is not None:
        data.update(status="completed", conclusion=conclusion)
    answer = await gh.post("/repos/{owner}/{repo}/check-runs", _owner_repo(full_name), data=data)
    return int(answer["id"])


async def find_check_run(
    gh: GitHubAPI, full_name: str, sha: str, *, name: str, external_id: str
) -> int | None:
    """The service's check run of `external_id` on `sha`, if an earlier call made it (a
    create whose answer was lost, a timeout after GitHub applied it)."""
    answer = await gh.getitem(
        "/repos/{owner}/{repo}/commits/{sha}/check-runs{?check_name,filter,per_page}",
        {
            **_owner_repo(full_name),
            "sha": sha,
            "check_name": name,
            "filter": "all",
            "per_page": 100,
        },
    )
    for check_run in answer.get("check_runs") or []:
        if check_run.get("external_id") == external_id:
            return int(check_run["id"])
    return None


@dataclass(frozen=True)
class Identity:
    """Who the service is on GitHub, to know its own comments: a token's user, or an App."""

    login: str | None = None
    app_id: int | None = None
    # A token with no user (an installation's, configured as `token`): its comments are a
    # bot's, whichever App it is.
    bot: bool = False

    def wrote(self, comment: dict[str, Any]) -> bool:
        user = comment.get("user") or {}
        if self.app_id is not None:
            app = comment.get("performed_via_github_app") or {}
            return app.get("id") == self.app_id
        if self.bot:
            return user.get("type") == "Bot"
        return user.get("login") == self.login


async def identity(gh: GitHubAPI, config: RepositoryConfig) -> Identity:
    if config.app_id is not None:
        return Identity(app_id=config.app_id)
    try:
        return Identity(login=str((await gh.getitem("/user"))["login"]))
    except BadRequest as error:
        if error.status_code in (403, 404):  # an installation token is no user
            return Identity(bot=True)
        raise


async def find_comment(
    gh: GitHubAPI, full_name: str, number: int, *, marker: str, me: Identity
) -> int | None:
    """The service's own marked comment on the pull request (another's copy of the marker is
    not it): what a create whose answer was lost left there."""
    async for comment in gh.getiter(
        "/repos/{owner}/{repo}/issues/{number}/comments{?per_page}",
        {**_owner_repo(full_name), "number": number, "per_page": 100},
    ):
        if str(comment.get("body") or "").startswith(marker) and me.wrote(comment):
            return int(comment["id"])
    return None


async def update_check_run(
    gh: GitHubAPI,
    full_name: str,
    check_run_id: int,
    *,
    status: str,
    conclusion: str | None,
    details_url: str,
    title: str,
    summary: str,
) -> None:
    data: dict[str, Any] = {
        "status": status,
        "details_url": details_url,
        "output": {"title": title[:200], "summary": summary[:60_000]},
    }
    if conclusion is not None:
        data["conclusion"] = conclusion
    await gh.patch(
        "/repos/{owner}/{repo}/check-runs/{check_run_id}",
        {**_owner_repo(full_name), "check_run_id": check_run_id},
        data=data,
    )


async def create_comment(gh: GitHubAPI, full_name: str, number: int, body: str) -> int:
    answer = await gh.post(
        "/repos/{owner}/{repo}/issues/{number}/comments",
        {**_owner_repo(full_name), "number": number},
        data={"body": body},
    )
    return int(answer["id"])


async def edit_comment(gh: GitHubAPI, full_name: str, comment_id: int, body: str) -> bool:
    """Edit the comment in place; False when it no longer exists (someone deleted it)."""
    try:
        await gh.patch(
            "/repos/{owner}/{repo}/issues/comments/{comment_id}",
            {**_owner_repo(full_name), "comment_id": comment_id},
            data={"body": body},
        )
    except BadRequest as error:
        if error.status_code == 404:
            return False
        raise
    return True
