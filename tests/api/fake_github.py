"""A fake GitHub REST API on loopback: the endpoints the integration calls, every call recorded.

Served under `/api/v3` (as GitHub Enterprise serves its API) by uvicorn in a thread of the
test process, so child processes (server, Celery) reach it over HTTP and the test reads what
they sent. Plus builders of signed webhook deliveries.

Written from GitHub's REST docs, it also misbehaves as GitHub does (`Fault`): a 5xx, a write
applied whose answer never comes (a timeout), 401 and 403, the primary rate limit (403 with
`x-ratelimit-remaining: 0` and its reset), the secondary one (403 with `retry-after`), 429;
and a fork pushing while the service asks who may ask (`push_during_permission`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import itertools
import json
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import jwt
import uvicorn
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse

from tests.stack import free_port

API_PREFIX = "/api/v3"
TOKEN = "ghp_fake_token_for_tests"
INSTALLATION_TOKEN = "ghs_fake_installation_token"


@dataclass
class Call:
    method: str
    path: str
    body: Any
    authorization: str


# The fake's own clock for `created_at` and `updated_at`, as GitHub writes them.
def github_time(at: float | None = None) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if at is None else at))


@dataclass
class Fault:
    """GitHub misbehaving on the next `times` calls of `method` whose path has `fragment`.

    kind: "500", "502", "401", "403" (an App lacking a permission), "rate-limit" (primary),
    "secondary" (403 with retry-after), "429", or "timeout" (the call is applied, then the
    answer comes later than the client waits)."""

    method: str
    fragment: str
    kind: str
    times: int = 1
    retry_after: int = 7
    delay_s: float = 1.5


_FAULT_ANSWERS: dict[str, tuple[int, dict[str, str], str]] = {
    "500": (500, {}, "Server Error"),
    "502": (502, {}, "Bad Gateway"),
    "401": (401, {}, "Bad credentials"),
    "403": (403, {}, "Resource not accessible by integration"),
    "429": (429, {"retry-after": "{retry_after}"}, "Too Many Requests"),
    "secondary": (
        403,
        {"retry-after": "{retry_after}"},
        "You have exceeded a secondary rate limit. Please wait a few minutes before you try again.",
    ),
    "rate-limit": (
        403,
        {
            "x-ratelimit-limit": "5000",
            "x-ratelimit-remaining": "0",
            "x-ratelimit-used": "5000",
            "x-ratelimit-reset": "{reset}",
        },
        "API rate limit exceeded for installation ID 77.",
    ),
}


@dataclass
class FakeGitHub:
    """State of one fake repository host: permissions, pull requests, comments, statuses."""

    permissions: dict[str, str] = field(default_factory=dict)
    pulls: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)
    comments: dict[int, dict[str, Any]] = field(default_factory=dict)
    statuses: list[dict[str, Any]] = field(default_factory=list)
    check_runs: dict[int, dict[str, Any]] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)
    tokens: tuple[str, ...] = (TOKEN, INSTALLATION_TOKEN)
    # A GitHub App's public key (PEM): its JWTs are checked against it, as GitHub does.
    app_public_key: bytes | None = None
    app_id: int | None = None
    faults: list[Fault] = field(default_factory=list)
    # The login of the token's user (`GET /user`), and of an App's bot: its comments' author.
    bot_login: str = "coldbench-bot"
    app_slug: str = "coldbench"
    # (repo, number, new head): a push lands while the service asks for a permission.
    push_during_permission: tuple[str, int, str] | None = None
    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1001))
    lock: threading.Lock = field(default_factory=threading.Lock)

    def reset(self) -> None:
        with self.lock:
            for kept in (self.calls, self.comments, self.statuses, self.check_runs, self.faults):
                kept.clear()
            self.push_during_permission = None

    def fail(self, method: str, fragment: str, kind: str, **options: Any) -> None:
        with self.lock:
            self.faults.append(Fault(method, fragment, kind, **options))

    def _take_fault(self, method: str, path: str) -> Fault | None:
        with self.lock:
            for fault in self.faults:
                if fault.method == method and fault.fragment in path and fault.times > 0:
                    fault.times -= 1
                    return fault
        return None

    def marked_comments(self, marker: str) -> list[dict[str, Any]]:
        with self.lock:
            return [c for c in self.comments.values() if c["body"].startswith(marker)]

    def check_runs_on(self, sha: str) -> list[dict[str, Any]]:
        with self.lock:
            return [c for c in self.check_runs.values() if c["head_sha"] == sha]

    def add_pull(
        self,
        repo: str,
        number: int,
        *,
        base: str,
        head: str,
        state: str = "open",
        merge_base: str | None = None,
        fork: str | None = None,
    ) -> None:
        """`fork`: the head's repository (OWNER/NAME) when it is not `repo`; "" a deleted one."""
        self.pulls[(repo, number)] = {
            "base": base,
            "head": head,
            "state": state,
            "fork": fork,
            "updated_at": github_time(),
        }
        if merge_base is not None:
            self.pulls[(repo, number)]["merge_base"] = merge_base

    def called(self, method: str, fragment: str = "") -> list[Call]:
        with self.lock:
            return [c for c in self.calls if c.method == method and fragment in c.path]

    def app(self) -> FastAPI:
        app = FastAPI()
        fake = self

        @app.middleware("http")
        async def record(request: Request, call_next: Any) -> Any:
            raw = await request.body()
            path = request.url.path.removeprefix(API_PREFIX)
            with fake.lock:
                fake.calls.append(
                    Call(
                        request.method,
                        path,
                        json.loads(raw) if raw else None,
                        request.headers.get("authorization", ""),
                    )
                )
            fault = fake._take_fault(request.method, path)
            if fault is None:
                return await call_next(request)
            if fault.kind == "timeout":
                # Applied by GitHub; the answer is lost to the client's timeout.
                answer = await call_next(request)
                await asyncio.sleep(fault.delay_s)
                return answer
            status, headers, message = _FAULT_ANSWERS[fault.kind]
            values = {"retry_after": str(fault.retry_after), "reset": str(int(time.time()) + 5)}
            return JSONResponse(
                {"message": message, "documentation_url": "https://docs.github.com/rest"},
                status_code=status,
                headers={key: value.format(**values) for key, value in headers.items()},
            )

        def authorized(request: Request) -> None:
            scheme, _, token = request.headers.get("authorization", "").partition(" ")
            if scheme.lower() != "token" or token not in fake.tokens:
                raise HTTPException(401, "Bad credentials")

        @app.get(API_PREFIX + "/repos/{owner}/{repo}/collaborators/{login}/permission")
        def permission(owner: str, repo: str, login: str, request: Request) -> dict[str, Any]:
            authorized(request)
            if fake.push_during_permission is not None:
                repo_name, number, new_head = fake.push_during_permission
                fake.pulls[(repo_name, number)].update(head=new_head, updated_at=github_time())
            if login not in fake.permissions:
                raise HTTPException(404, "Not Found")
            return {"permission": fake.permissions[login], "user": {"login": login}}

        @app.get(API_PREFIX + "/user")
        def user(request: Request) -> dict[str, Any]:
            authorized(request)
            if request.headers["authorization"].endswith(INSTALLATION_TOKEN):
                raise HTTPException(403, "Resource not accessible by integration")
            return {"login": fake.bot_login, "type": "User"}

        @app.get(API_PREFIX + "/repos/{owner}/{repo}/pulls/{number}")
        def pull(owner: str, repo: str, number: int, request: Request) -> dict[str, Any]:
            authorized(request)
            found = fake.pulls.get((f"{owner}/{repo}", number))
            if found is None:
                raise HTTPException(404, "Not Found")
            fork = found.get("fork")
            head_repo = None if fork == "" else {"full_name": fork or f"{owner}/{repo}"}
            return {
                "number": number,
                "state": found["state"],
                "title": "<script>alert(1)</script> a title GitHub users wrote",
                "updated_at": found["updated_at"],
                "base": {"sha": found["base"], "ref": "main"},
                "head": {"sha": found["head"], "ref": "feature", "repo": head_repo},
            }

        @app.get(API_PREFIX + "/repos/{owner}/{repo}/compare/{basehead}")
        def compare(owner: str, repo: str, basehead: str, request: Request) -> dict[str, Any]:
            authorized(request)
            base, _, head = basehead.partition("...")
            found = next(
                (p for (name, _), p in fake.pulls.items() if name == f"{owner}/{repo}"), None
            )
            if found is None or (base, head) != (found["base"], found["head"]):
                raise HTTPException(404, "Not Found")
            return {"merge_base_commit": {"sha": found.get("merge_base", base)}}

        @app.post(API_PREFIX + "/repos/{owner}/{repo}/statuses/{sha}", status_code=201)
        async def status(owner: str, repo: str, sha: str, request: Request) -> dict[str, Any]:
            authorized(request)
            body = await request.json()
            with fake.lock:
                fake.statuses.append({"sha": sha, **body})
            return {"id": next(fake._ids), **body}

        @app.post(API_PREFIX + "/repos/{owner}/{repo}/issues/{number}/comments", status_code=201)
        async def comment(owner: str, repo: str, number: int, request: Request) -> dict[str, Any]:
            authorized(request)
            body = await request.json()
            comment_id = next(fake._ids)
            with fake.lock:
                fake.comments[comment_id] = {
                    "number": number,
                    "body": body["body"],
                    "edits": 0,
                    **fake._author(request),
                }
            return {"id": comment_id, **fake.comments[comment_id]}

        @app.get(API_PREFIX + "/repos/{owner}/{repo}/issues/{number}/comments")
        def comments(owner: str, repo: str, number: int, request: Request) -> list[Any]:
            authorized(request)
            with fake.lock:
                return [
                    {"id": comment_id, **comment}
                    for comment_id, comment in sorted(fake.comments.items())
                    if comment["number"] == number
                ]

        @app.patch(API_PREFIX + "/repos/{owner}/{repo}/issues/comments/{comment_id}")
        async def edit(owner: str, repo: str, comment_id: int, request: Request) -> dict[str, Any]:
            authorized(request)
            body = await request.json()
            with fake.lock:
                if comment_id not in fake.comments:
                    raise HTTPException(404, "Not Found")
                fake.comments[comment_id]["body"] = body["body"]
                fake.comments[comment_id]["edits"] += 1
            return {"id": comment_id, "body": body["body"]}

        @app.post(API_PREFIX + "/repos/{owner}/{repo}/check-runs", status_code=201)
        async def create_check(owner: str, repo: str, request: Request) -> dict[str, Any]:
            authorized(request)
            body = await request.json()
            check_id = next(fake._ids)
            with fake.lock:
                fake.check_runs[check_id] = {**body, "updates": []}
            return {"id": check_id, **body}

        @app.get(API_PREFIX + "/repos/{owner}/{repo}/commits/{sha}/check-runs")
        def list_checks(owner: str, repo: str, sha: str, request: Request) -> dict[str, Any]:
            authorized(request)
            name = request.query_params.get("check_name")
            with fake.lock:
                found = [
                    {"id": check_id, **check}
                    for check_id, check in fake.check_runs.items()
                    if check["head_sha"] == sha and name in (None, check["name"])
                ]
            return {"total_count": len(found), "check_runs": found}

        @app.patch(API_PREFIX + "/repos/{owner}/{repo}/check-runs/{check_id}")
        async def update_check(owner: str, repo: str, check_id: int, request: Request) -> Any:
            authorized(request)
            body = await request.json()
            with fake.lock:
                fake.check_runs[check_id]["updates"].append(body)
            return {"id": check_id}

        @app.post(API_PREFIX + "/app/installations/{installation}/access_tokens", status_code=201)
        def access_token(installation: int, request: Request) -> dict[str, str]:
            scheme, _, token = request.headers.get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or fake.app_public_key is None:
                raise HTTPException(401, "A JSON web token is required")
            try:
                claims = jwt.decode(token, fake.app_public_key, algorithms=["RS256"])
            except jwt.InvalidTokenError as error:
                raise HTTPException(401, f"bad JWT: {error}") from None
            if str(claims["iss"]) != str(fake.app_id):
                raise HTTPException(401, "the JWT names another App")
            return {"token": INSTALLATION_TOKEN, "expires_at": "2099-01-01T00:00:00Z"}

        return app

    def _author(self, request: Request) -> dict[str, Any]:
        """Who wrote a comment, as GitHub says: the token's user, or the App's bot."""
        if request.headers.get("authorization", "").endswith(INSTALLATION_TOKEN):
            return {
                "user": {"login": f"{self.app_slug}[bot]", "type": "Bot"},
                "performed_via_github_app": {"id": self.app_id, "slug": self.app_slug},
            }
        return {"user": {"login": self.bot_login, "type": "User"}, "performed_via_github_app": None}


@contextlib.contextmanager
def serve(fake: FakeGitHub) -> Iterator[str]:
    """The fake on a free loopback port; yields its API base URL (with `/api/v3`)."""
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(fake.app(), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the fake GitHub did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}{API_PREFIX}"
    finally:
        server.should_exit = True
        thread.join(10)


# --- webhook deliveries ----------------------------------------------------------------------


def signed(payload: dict[str, Any], secret: str, event: str) -> tuple[bytes, dict[str, str]]:
    """(body, headers) of a delivery as GitHub sends it, signed with `secret`."""
    body = json.dumps(payload).encode()
    digest = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return body, {
        "Content-Type": "application/json",
        "X-GitHub-Event": event,
        "X-GitHub-Delivery": str(uuid.uuid4()),
        "X-Hub-Signature-256": f"sha256={digest}",
    }


_comment_ids = itertools.count(9_000_001)


def comment_event(
    repo: str,
    number: int,
    login: str,
    body: str,
    *,
    installation: int | None = None,
    comment_id: int | None = None,
    at: float | None = None,
) -> dict[str, Any]:
    comment_id = next(_comment_ids) if comment_id is None else comment_id
    event: dict[str, Any] = {
        "action": "created",
        "issue": {
            "number": number,
            "title": "<img src=x onerror=alert(1)>",
            "pull_request": {"url": f"https://evil.example/repos/{repo}/pulls/{number}"},
        },
        "comment": {
            "id": comment_id,
            "created_at": github_time(at),
            "body": body,
            "user": {"login": login},
            # Never followed: the service builds every URL from its configured base.
            "url": "https://evil.example/comments/1",
        },
        "repository": {"full_name": repo},
        "sender": {"login": login},
    }
    if installation is not None:
        event["installation"] = {"id": installation}
    return event


def pull_request_event(
    repo: str,
    number: int,
    action: str,
    login: str,
    *,
    head: str,
    label: str | None = None,
    at: float | None = None,
) -> dict[str, Any]:
    event: dict[str, Any] = {
        "action": action,
        "number": number,
        "pull_request": {
            "number": number,
            # By default an old push: the head before any comment a test makes.
            "updated_at": github_time(time.time() - 3600 if at is None else at),
            "head": {"sha": head},
            "base": {"sha": "0" * 40},
        },
        "repository": {"full_name": repo},
        "sender": {"login": login},
    }
    if label is not None:
        event["label"] = {"name": label}
    return event
