"""A fake GitHub REST API on loopback: the endpoints the integration calls, every call recorded.

Served under `/api/v3` (as GitHub Enterprise serves its API) by uvicorn in a thread of the
test process, so child processes (server, Celery) reach it over HTTP and the test reads what
they sent. Plus builders of signed webhook deliveries.
"""

from __future__ import annotations

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
    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1001))
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add_pull(
        self,
        repo: str,
        number: int,
        *,
        base: str,
        head: str,
        state: str = "open",
        merge_base: str | None = None,
    ) -> None:
        self.pulls[(repo, number)] = {"base": base, "head": head, "state": state}
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
            with fake.lock:
                fake.calls.append(
                    Call(
                        request.method,
                        request.url.path.removeprefix(API_PREFIX),
                        json.loads(raw) if raw else None,
                        request.headers.get("authorization", ""),
                    )
                )
            return await call_next(request)

        def authorized(request: Request) -> None:
            scheme, _, token = request.headers.get("authorization", "").partition(" ")
            if scheme.lower() != "token" or token not in fake.tokens:
                raise HTTPException(401, "Bad credentials")

        @app.get(API_PREFIX + "/repos/{owner}/{repo}/collaborators/{login}/permission")
        def permission(owner: str, repo: str, login: str, request: Request) -> dict[str, Any]:
            authorized(request)
            if login not in fake.permissions:
                raise HTTPException(404, "Not Found")
            return {"permission": fake.permissions[login], "user": {"login": login}}

        @app.get(API_PREFIX + "/repos/{owner}/{repo}/pulls/{number}")
        def pull(owner: str, repo: str, number: int, request: Request) -> dict[str, Any]:
            authorized(request)
            found = fake.pulls.get((f"{owner}/{repo}", number))
            if found is None:
                raise HTTPException(404, "Not Found")
            return {
                "number": number,
                "state": found["state"],
                "title": "<script>alert(1)</script> a title GitHub users wrote",
                "base": {"sha": found["base"], "ref": "main"},
                "head": {"sha": found["head"], "ref": "feature"},
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
                fake.comments[comment_id] = {"number": number, "body": body["body"], "edits": 0}
            return {"id": comment_id, "body": body["body"]}

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
            return {"id": check_id}

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


def comment_event(
    repo: str, number: int, login: str, body: str, *, installation: int | None = None
) -> dict[str, Any]:
    event: dict[str, Any] = {
        "action": "created",
        "issue": {
            "number": number,
            "title": "<img src=x onerror=alert(1)>",
            "pull_request": {"url": f"https://evil.example/repos/{repo}/pulls/{number}"},
        },
        "comment": {
            "id": 1,
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
    repo: str, number: int, action: str, login: str, *, head: str, label: str | None = None
) -> dict[str, Any]:
    event: dict[str, Any] = {
        "action": action,
        "number": number,
        "pull_request": {"number": number, "head": {"sha": head}, "base": {"sha": "0" * 40}},
        "repository": {"full_name": repo},
        "sender": {"login": login},
    }
    if label is not None:
        event["label"] = {"name": label}
    return event
