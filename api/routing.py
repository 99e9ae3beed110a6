"""HTTP plumbing every route shares: the door's text rule, strict JSON bodies and the
request-body limit.

- `DoorMiddleware` is the door, before every route of the app whatever its router or route
  class: the request's path, query and headers (cookies are a header) hold no NUL, no query
  value is longer than `MAX_DOOR_TEXT_CHARS`, and a JSON body (`application/json`, `+json`)
  is strict UTF-8 whose strings hold no NUL, no lone surrogate and no more than
  `MAX_DOOR_TEXT_CHARS` characters (`coldbench.evidence.contract.boundary.door_check_json`). A
  refusal is 422 naming the field (`{"detail": "fingerprint.chip: holds the lone surrogate U+D800
  (not UTF-8)", "field": "fingerprint.chip"}`); no schema, service or statement sees the text, so
  no route can forget the rule and nothing stored can fail a later read. Forms are held to the
  same rule field by field where they are parsed (`form_refusal`, on the routes'
  `StrictJSONRoute`); an upload's bytes are its route's (`api/artifacts/router.py`).
- `StrictJSONRoute` parses JSON bodies with
`coldbench.evidence.contract.boundary.strict_json_loads`:
  `Infinity`, `-Infinity`, `NaN` and numbers that overflow a float (`1e999`, which Python's json
  module reads as infinity) are refused (PostgreSQL's JSON type, canonical JSON and the error
  encoder cannot hold them), so such a body is a 422 like any malformed JSON. Every router of the
  app uses it (a test checks).
- `BodyLimitMiddleware` refuses a body larger than the limit before it is parsed: from its
  Content-Length at once, or while it streams, with 413 and a one-line JSON detail.
- `CompressionMiddleware` gzips what a client that accepts gzip is sent (pages, evidence,
  the JSON API), except the answers of the agents' protocol.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Coroutine
from typing import Any
from urllib.parse import parse_qsl

from fastapi import HTTPException, Request, Response
from fastapi.routing import APIRoute
from starlette.datastructures import FormData
from starlette.middleware.gzip import GZipMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from coldbench.evidence.contract.boundary import (
    MAX_DOOR_TEXT_CHARS,
    TextRefused,
    door_check_json,
    door_text_problem,
    strict_json_loads,
)


class DoorRefused(HTTPException):
    """Text the door refuses (coldbench.evidence.contract.boundary's rule): answered 422 with the
    field it names (api/app.py maps it). An HTTPException, so FastAPI's body parsing passes it on as
    it is."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(status_code=422, detail=f"{field}: {problem}")
        self.field = field
        self.problem = problem

    @classmethod
    def of(cls, refused: TextRefused) -> DoorRefused:
        return cls(refused.field, refused.problem)

    def body(self) -> bytes:
        return json.dumps({"detail": self.detail, "field": self.field}).encode()


_NUL = "holds NUL (U+0000)"


def scope_text_refusal(scope: Scope) -> DoorRefused | None:
    """The door's rule on what precedes the body: the path, the query string and the headers
    hold no NUL, and no query value is longer than `MAX_DOOR_TEXT_CHARS`. Nothing else can be
    refused there: the server decodes the path and query as UTF-8 with replacement
    characters, and headers as Latin-1, so they hold no surrogate; the lengths of the path and
    the headers are the HTTP server's to bound."""
    for name, value in scope["headers"]:
        if b"\x00" in value:
            return DoorRefused(f"header {name.decode('latin-1')}", _NUL)
    if "\x00" in scope["path"]:
        return DoorRefused("path", _NUL)
    query: bytes = scope.get("query_string", b"")
    if query and (b"%00" in query or b"\x00" in query or len(query) > MAX_DOOR_TEXT_CHARS):
        for name, param in parse_qsl(query.decode("latin-1"), keep_blank_values=True):
            for text in (name, param):
                if (problem := door_text_problem(text)) is not None:
                    return DoorRefused(f"query parameter {name[:40]!r}", problem)
    return None


def _is_json(scope: Scope) -> bool:
    for name, value in scope["headers"]:
        if name == b"content-type":
            kind = value.split(b";", 1)[0].strip().lower()
            return kind.startswith(b"application/") and (
                kind == b"application/json" or kind.endswith(b"+json")
            )
    return False


class DoorMiddleware:
    """The door (the module docstring): refuses, before the app sees the request, text that
    PostgreSQL's `text` and `jsonb` cannot hold, with 422 naming the field. A JSON body is
    read whole first (BodyLimitMiddleware, outside, bounds it), checked, and handed to the app
    as one message; what the app receives after it (a client's disconnect, which a lease's
    long-poll waits for) comes from the server as before."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    @staticmethod
    async def _refuse(send: Send, refusal: DoorRefused) -> None:
        body = refusal.body()
        await send(
            {
                "type": "http.response.start",
                "status": 422,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = scope_text_refusal(scope)
        if refusal is not None:
            await self._refuse(send, refusal)
            return
        if not _is_json(scope):
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        held: list[Message] = []
        while True:
            message = await receive()
            if message["type"] != "http.request":
                held.append(message)  # the client left: the app sees that as before
                break
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        try:
            door_check_json(body)
        except TextRefused as refused:
            await self._refuse(send, DoorRefused.of(refused))
            return
        replay = [{"type": "http.request", "body": body, "more_body": False}, *held]

        async def replayed() -> Message:
            return replay.pop(0) if replay else await receive()

        await self.app(scope, replayed, send)


def form_refusal(form: FormData) -> DoorRefused | None:
    """The door's rule on each field of a form (names and text values; a file's bytes are
    its route's to judge)."""
    for name, value in form.multi_items():
        for text in (name, value) if isinstance(value, str) else (name,):
            if (problem := door_text_problem(text)) is not None:
                return DoorRefused(f"form field {name[:40]!r}", problem)
    return None


class _StrictJSONRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = strict_json_loads(await self.body())
        return self._json

    async def _get_form(self, **limits: Any) -> FormData:
        form = await super()._get_form(**limits)
        refusal = form_refusal(form)
        if refusal is not None:
            raise refusal
        return form


class StrictJSONRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict_handler(request: Request) -> Response:
            return await handler(_StrictJSONRequest(request.scope, request.receive))

        return strict_handler


def finite_or_text(value: Any) -> Any:
    """A copy of `value` where non-finite floats are strings: safe for a JSON response."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): finite_or_text(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite_or_text(v) for v in value]
    return value


class _TooLarge(Exception):
    pass


def _is_too_large(error: BaseException) -> bool:
    """_TooLarge, also as the only kind inside the group a task group (BaseHTTPMiddleware's
    receive) wraps it in."""
    if isinstance(error, BaseExceptionGroup):
        _, other = error.split(_TooLarge)
        return other is None
    return isinstance(error, _TooLarge)


class BodyLimitMiddleware:
    """413 for a request body over `limit_for(scope)` bytes, before the app parses it."""

    def __init__(self, app: ASGIApp, *, limit_for: Callable[[Scope], int]) -> None:
        self.app = app
        self.limit_for = limit_for

    @staticmethod
    async def _refuse(send: Send, limit: int) -> None:
        body = json.dumps(
            {"detail": f"request body exceeds the limit of {limit} bytes; nothing was read"}
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(scope)
        for name, value in scope["headers"]:
            if name == b"content-length" and (not value.isdigit() or int(value) > limit):
                await self._refuse(send, limit)
                return
        received = 0
        exceeded = False
        answered = False

        async def limited_receive() -> Message:
            nonlocal received, exceeded
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    exceeded = True
                    raise _TooLarge
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal answered
            if not exceeded:
                await send(message)
            elif message["type"] == "http.response.start" and not answered:
                # Whatever the app made of the cut body (a parse error), the answer is 413.
                answered = True
                await self._refuse(send, limit)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except Exception as error:
            if not _is_too_large(error):
                raise
            if not answered:
                answered = True
                await self._refuse(send, limit)


class CompressionMiddleware:
    """Starlette's GZipMiddleware for every response except those of the paths `skip`
    matches (the agents' leases, heartbeats, uploads and completions: small answers, and the
    request cost that the API budgets per agent). A response that already names its encoding
    (plotly.js, compressed once and cached) passes as it is."""

    def __init__(
        self, app: ASGIApp, *, skip: re.Pattern[str], minimum_size: int = 1024, level: int = 6
    ) -> None:
        self.app = app
        self.skip = skip
        self.gzip = GZipMiddleware(app, minimum_size=minimum_size, compresslevel=level)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not self.skip.match(scope["path"]):
            await self.gzip(scope, receive, send)
        else:
            await self.app(scope, receive, send)
