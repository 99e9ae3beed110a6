"""HTTP plumbing every route shares: strict JSON bodies and the request-body limit.

- `StrictJSONRoute` parses JSON bodies with `evidence.boundary.strict_json_loads`: `Infinity`,
  `-Infinity`, `NaN` and numbers that overflow a float (`1e999`, which Python's json module
  reads as infinity) are refused (PostgreSQL's JSON type, canonical JSON and the error encoder
  cannot hold them), so such a body is a 422 like any malformed JSON. Every router of the app
  uses it (a test checks).
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

from fastapi import Request, Response
from fastapi.routing import APIRoute
from starlette.middleware.gzip import GZipMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from evidence.boundary import strict_json_loads


class _StrictJSONRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = strict_json_loads(await self.body())
        return self._json


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
