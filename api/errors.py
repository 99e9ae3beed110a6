"""Errors a service raises for a client to read; the app maps each to its HTTP status.

Each carries one line of `message` and, where it is about one field of the request (a JobSpec
path such as `contexts` or `variants.1.flags`), that `field`: the JSON error body has it, and
the form puts the message beside that field. An error found with others in one pass carries
them all (`problems`: the body's `errors`, each beside its field on the form).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Self

from pydantic import ValidationError

from coldbench.evidence.contract.schemas import error_field, error_line


class ServiceError(Exception):
    status_code = 400

    def __init__(
        self,
        message: str,
        *,
        field: str | None = None,
        problems: Sequence[tuple[str | None, str]] = (),
    ) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        # Every (field, message) found in one pass; the error's own are the first's.
        self.problems = list(problems) or [(field, message)]

    @classmethod
    def of(cls, problems: Sequence[tuple[str | None, str]], *, prefix: str = "") -> Self:
        """One error carrying every problem: its message names each one's field, in one line."""
        message = "; ".join(f"{field}: {text}" if field else text for field, text in problems)
        return cls(prefix + message, field=problems[0][0], problems=problems)


class NotAuthenticated(ServiceError):
    status_code = 401


class Forbidden(ServiceError):
    status_code = 403


class NotFound(ServiceError):
    status_code = 404


class Conflict(ServiceError):
    status_code = 409


class TooLarge(ServiceError):
    status_code = 413


class Invalid(ServiceError):
    status_code = 422


class TooManyRequests(ServiceError):
    status_code = 429


class DatabaseUnavailable(ServiceError):
    """The database did not serve the request in time (a lock, a statement past its timeout,
    no connection free or none to be made): answered 503 with Retry-After; retry later."""

    status_code = 503


class StoreFull(ServiceError):
    """The artifact store has no room: nothing of the request was kept; retry later."""

    status_code = 507


def validation_message(what: str, error: ValidationError) -> str:
    """`invalid job spec: contexts: must be positive; rounds: ...` in one line."""
    return f"invalid {what}: {error_line(error, every=True)}"


def invalid(what: str, error: ValidationError) -> Invalid:
    """The one-line Invalid of a pydantic error, about the field of its first problem."""
    return Invalid(validation_message(what, error), field=error_field(error))
