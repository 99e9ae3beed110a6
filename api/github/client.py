"""Calls to GitHub's REST API through gidgethub, only ever to the repository's configured base.

Every URL is built from the configured `api_url` and a path of GitHub's documentation; a URL
found in an event (`comments_url`, `statuses_url`, ...) is never followed. A request hook
refuses any request outside the base anyway, and redirects are not followed.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
from gidgethub import BadRequest
from gidgethub.apps import get_installation_access_token, get_jwt
from gidgethub.httpx import GitHubAPI

from api.github.config import RepositoryConfig

log = logging.getLogger(__name__)

REQUESTER = "coldbench"
TIMEOUT_S = 10.0
# The legacy `permission` field of a collaborator: maintainers read as write there.
WRITE_PERMISSIONS = ("admin", "write")


class OutboundRefused(RuntimeError):
    """A request to somewhere other than the configured API base; nothing was sent."""


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
    # Where head's line leaves the base branch (asked for mode `commits` only).
    merge_base_sha: str | None = None


async def pull_request(gh: GitHubAPI, full_name: str, number: int) -> PullRequestHeads:
    answer = await gh.getitem(
        "/repos/{owner}/{repo}/pulls/{number}", {**_owner_repo(full_name), "number": number}
    )
    return PullRequestHeads(
        number=number,
        base_sha=str(answer["base"]["sha"]),
        head_sha=str(answer["head"]["sha"]),
        state=str(answer["state"]),
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
    gh: GitHubAPI, full_name: str, sha: str, *, name: str, details_url: str, title: str
) -> int:
    answer = await gh.post(
        "/repos/{owner}/{repo}/check-runs",
        _owner_repo(full_name),
        data={
            "name": name,
            "head_sha": sha,
            "status": "queued",
            "details_url": details_url,
            "output": {"title": title, "summary": title},
        },
    )
    return int(answer["id"])


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
