"""Ollama's error shape: ``{"error": "..."}`` with the HTTP status.

Ollama answers every failure with one message under ``error``; the official
SDK raises it as ``ResponseError`` carrying the status. A stream that fails
after it started ends with the same object as its last line (format.py).
"""

from __future__ import annotations

from ...response import Response


def error_response(status: int, message: str, *, code: str | None = None, param: str | None = None,
                   headers: tuple[tuple[bytes, bytes], ...] = ()) -> Response:
    """Ollama-style error JSON (an ``app.ErrorRenderer``); ``code`` and ``param`` have no place in it."""
    return Response.json(status, {"error": message}, headers)
