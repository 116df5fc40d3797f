"""OpenAI's error shape: ``{"error": {"message", "type", "param", "code"}}``.

OpenAI routes answer in it, and so does everything no family owns (unknown
paths, methods, protocol-level errors): it is the server's default
(``app.DEFAULT_ERRORS``).
"""

from __future__ import annotations

from ...response import Response

ERROR_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error",
    405: "invalid_request_error", 408: "timeout_error", 413: "invalid_request_error", 414: "invalid_request_error",
    429: "rate_limit_error", 431: "invalid_request_error", 500: "server_error", 503: "service_unavailable_error",
}


def error_response(status: int, message: str, *, code: str | None = None, param: str | None = None,
                   headers: tuple[tuple[bytes, bytes], ...] = ()) -> Response:
    """OpenAI-style error JSON (an ``app.ErrorRenderer``)."""
    payload = {"error": {"message": message, "type": ERROR_TYPES.get(status, "server_error"), "param": param,
                         "code": code}}
    return Response.json(status, payload, headers)
