"""Anthropic's error shape: ``{"type": "error", "error": {"type", "message"}}``.

The status is the one every family answers with, but one: a model that is out
of admission capacity (code ``capacity_exhausted``, a 503 on the OpenAI routes)
answers 529, Anthropic's "overloaded" status, so that the SDK raises
``OverloadedError`` and clients that back off on 529 do. The other 503s
(shutting down, admission paused, worker unavailable) stay 503 with type
``overloaded_error`` (the SDK's ``ServiceUnavailableError``): a balancer that
moves a 503 to another upstream still does. Both carry ``Retry-After`` and the
configured hints. The error type follows the status, as in Anthropic's API;
our code and param are not part of that shape (the message names the field).
"""

from __future__ import annotations

from ...response import Response

OVERLOADED = 529  # Anthropic's status for "overloaded"

ERROR_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error",
    405: "invalid_request_error", 408: "timeout_error", 413: "request_too_large", 414: "invalid_request_error",
    429: "rate_limit_error", 431: "invalid_request_error", 500: "api_error", 503: "overloaded_error",
    OVERLOADED: "overloaded_error",
}


def error_body(status: int, message: str) -> dict:
    return {"type": "error", "error": {"type": ERROR_TYPES.get(status, "api_error"), "message": message}}


def error_response(status: int, message: str, *, code: str | None = None, param: str | None = None,
                   headers: tuple[tuple[bytes, bytes], ...] = ()) -> Response:
    """Anthropic-style error JSON (an ``app.ErrorRenderer``)."""
    if code == "capacity_exhausted":
        status = OVERLOADED
    return Response.json(status, error_body(status, message), headers)
