"""HTTP/1.1 response heads and bodies as bytes.

Pure functions over bytes: no transport, no event loop. The protocol writes
what these return; routes build :class:`Response` objects. The Date header is
cached per second (``refresh_date``) because formatting it per response would
cost more than the rest of a small response's head.
"""

from __future__ import annotations

import json
import time
from email.utils import formatdate
from http import HTTPStatus
from typing import Iterable

JSON = b"application/json"
TEXT = b"text/plain; charset=utf-8"
EVENT_STREAM = b"text/event-stream"
SERVER_HEADER = b"server: flare\r\n"

_REASONS = {status.value: status.phrase.encode("latin-1") for status in HTTPStatus}
_STATUS_LINES: dict[int, bytes] = {}
_date_header = b""
_date_second = -1


def refresh_date(now: float | None = None) -> None:
    """Recompute the cached ``date`` header; called by the server's ticker."""
    global _date_header, _date_second
    now = time.time() if now is None else now
    second = int(now)
    if second != _date_second:
        _date_second = second
        _date_header = b"date: " + formatdate(second, usegmt=True).encode("ascii") + b"\r\n"


def date_header() -> bytes:
    if _date_second < 0:
        refresh_date()
    return _date_header


def status_line(status: int) -> bytes:
    line = _STATUS_LINES.get(status)
    if line is None:
        reason = _REASONS.get(status, b"Unknown")
        line = _STATUS_LINES[status] = b"HTTP/1.1 %d %s\r\n" % (status, reason)
    return line


class Response:
    """A complete response: status, body, content type and extra headers.

    ``headers`` are (name, value) pairs of bytes, lower-case names. ``close``
    asks the protocol to close the connection after writing it.
    """

    __slots__ = ("status", "body", "content_type", "headers", "close")

    def __init__(self, status: int, body: bytes = b"", content_type: bytes = JSON,
                 headers: Iterable[tuple[bytes, bytes]] = (), close: bool = False):
        self.status = status
        self.body = body
        self.content_type = content_type
        self.headers = tuple(headers)
        self.close = close

    @classmethod
    def json(cls, status: int, payload: object, headers: Iterable[tuple[bytes, bytes]] = ()) -> "Response":
        body = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        return cls(status, body, JSON, headers)

    def encode(self, *, keep_alive: bool, head_only: bool = False,
               extra: tuple[tuple[bytes, bytes], ...] = ()) -> bytes:
        """Serialize head and body; ``head_only`` for HEAD requests; ``extra``: headers the
        connection adds for this request (CORS)."""
        parts = [status_line(self.status), SERVER_HEADER, date_header()]
        if self.status != 204:  # RFC 9110 section 8.6: no content-length (nor body) in a 204
            parts += [b"content-type: ", self.content_type, b"\r\ncontent-length: %d\r\n" % len(self.body)]
        for name, value in self.headers:
            parts.append(name + b": " + value + b"\r\n")
        for name, value in extra:
            parts.append(name + b": " + value + b"\r\n")
        if not keep_alive:
            parts.append(b"connection: close\r\n")
        parts.append(b"\r\n")
        if not head_only:
            parts.append(self.body)
        return b"".join(parts)


def stream_head(status: int, content_type: bytes, headers: Iterable[tuple[bytes, bytes]], *,
                chunked: bool, keep_alive: bool) -> bytes:
    """The head of a streamed response (SSE): chunked for HTTP/1.1 clients."""
    parts = [status_line(status), SERVER_HEADER, date_header(), b"content-type: ", content_type,
             b"\r\ncache-control: no-cache\r\n"]
    for name, value in headers:
        parts.append(name + b": " + value + b"\r\n")
    if chunked:
        parts.append(b"transfer-encoding: chunked\r\n")
    if not keep_alive:
        parts.append(b"connection: close\r\n")
    parts.append(b"\r\n")
    return b"".join(parts)


LAST_CHUNK = b"0\r\n\r\n"  # ends a chunked body; chunks are written by HttpConnection.write
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
