"""The HTTP/1.1 connection: httptools parser callbacks and response writing.

One :class:`HttpConnection` per TCP connection. It knows nothing about routes,
JSON or the model: parser callbacks fill a per-request :class:`HttpRequest`,
the :class:`HttpApp` decides at the end of the head (admission, auth, 404)
and produces the response once the body is complete. Requests on one
connection are answered strictly in order (keep-alive and pipelining); a
pipelined request waits in ``_pipeline`` until the previous response ends.

Limits are enforced as bytes arrive, never after buffering: URL (414) and
head (431) sizes, ``Content-Length`` against the body limit before any body
byte is read, and chunked bodies as they grow (413). The head is measured by
what the parser reports (request line, each field as ``name: value`` CRLF),
so it gets one verdict however TCP splits it; bytes read while the parser
reports nothing (a field still arriving) count too, so an unfinished head
cannot outgrow the limit. Malformed input is answered 400 (505 for versions
other than 1.0 and 1.1; 400 for a missing or repeated Host, RFC 9112 section
3.2) after any responses still owed, and the connection closed. A refusal the
app decides from the head (404, 401, 429, ...) is sent as soon as the head is
read, not after a declared body: with ``connection: close``, followed by a
lingering close (RFC 9112 section 9.6) so a client still sending does not
lose it to a reset. Deadlines are checked by
:meth:`HttpConnection.on_tick`, driven by one server-wide timer (or by tests
with a fake clock): a request must arrive whole within ``request_timeout_s``
(408), an idle keep-alive connection closes after ``keepalive_timeout_s``.

Tests drive this class with a fake transport: bytes in, bytes out.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Protocol

import httptools

from .response import CONTINUE, EVENT_STREAM, LAST_CHUNK, Response, stream_head

log = logging.getLogger("flare.server")

# A request that waits in the pipeline holds memory; past this depth the
# connection stops reading until responses catch up.
MAX_PIPELINE = 32
# A lingering close ends when the client has sent nothing for LINGER_IDLE_S, or
# after LINGER_MAX_S in all (nginx's lingering_timeout and lingering_time).
LINGER_IDLE_S = 2.0
LINGER_MAX_S = 30.0
# Bytes a chunk-size line (with extensions) or trailer line may take across
# reads before the parser reports it: 413 beyond (Node answers the same).
MAX_CHUNK_LINE_BYTES = 16 * 1024
# The fixed part of a request line and head: two spaces, "HTTP/1.1", CRLF, the
# final CRLF. Each field line adds its name, value and ": " CRLF.
REQUEST_LINE_OVERHEAD = 14
FIELD_LINE_OVERHEAD = 4
# llhttp failures that mean a protocol version we do not speak (RFC 9110 15.6.6).
VERSION_ERRORS = frozenset({"Invalid HTTP version", "Pause on PRI/Upgrade"})


@dataclass(frozen=True)
class ProtocolLimits:
    """Per-connection limits (from ServerConfig; see docs/serving.md)."""

    max_header_bytes: int = 64 * 1024  # the whole head: request line and fields (and trailers); 431
    max_url_bytes: int = 8 * 1024  # the request target; 414 (capped so a URL fits in the head)
    max_body_bytes: int = 1 << 20
    request_timeout_s: float = 60.0
    keepalive_timeout_s: float = 75.0


class HttpRequest:
    """One parsed request. ``headers`` keep arrival order with lower-case names."""

    __slots__ = ("method", "path", "query", "headers", "host", "body", "http_version", "keep_alive",
                 "content_length", "received_at", "early_response", "permit", "budget", "route", "params",
                 "origin", "response_headers", "_url", "_body_parts", "_body_len")

    def __init__(self, received_at: float):
        self.method = ""
        self.path = ""
        self.query = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.host: bytes | None = None  # the Host field's value
        self.origin: bytes | None = None  # the first Origin field's value (a web page's request)
        self.body = b""
        self.http_version = "1.1"
        self.keep_alive = True
        self.content_length: int | None = None
        self.received_at = received_at
        self.early_response: Response | None = None  # answered without reading the body
        self.permit: Any = None  # an admission permit (anything with release()), set by the app
        # the body's share of the app's budget (take(num_bytes) -> bool, release()), set by the app
        self.budget: Any = None
        self.route: Any = None  # the app's resolved route
        self.params: dict[str, str] | None = None
        self.response_headers: tuple[tuple[bytes, bytes], ...] = ()  # the app's, on every response (CORS)
        self._url = b""
        self._body_parts: list[bytes] = []
        self._body_len = 0

    def header(self, name: bytes) -> bytes | None:
        """The first value of a header (``name`` lower-case), or None."""
        for key, value in self.headers:
            if key == name:
                return value
        return None

    def release(self) -> None:
        """Give back what the app reserved for this request (idempotent)."""
        permit, self.permit = self.permit, None
        if permit is not None:
            permit.release()
        budget, self.budget = self.budget, None
        if budget is not None:
            budget.release()


class HttpApp(Protocol):
    """What a connection needs from the application."""

    def on_request_head(self, request: HttpRequest) -> Response | None:
        """Decide after the head: None to read the body, or an early response."""

    def handle(self, request: HttpRequest, conn: "HttpConnection") -> "Response | Awaitable[Response | None]":
        """Answer a complete request: a Response now, or a coroutine that returns
        one (or streams through ``conn`` and returns None)."""

    def error_response(self, status: int, message: str, target: tuple[str, str] | None = None) -> Response:
        """The body for protocol-level failures (400, 408, 413, 414, 431, 500); ``target`` is the
        request's (method, path) when the failure came after its request line was read."""


class _Reject(Exception):
    """Raised inside parser callbacks to stop parsing with a status."""

    def __init__(self, status: int, message: str, target: tuple[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.target = target  # (method, path) of the request it refuses, when known


# RFC 9112 section 3.2: Host = uri-host [ ":" port ], possibly empty (RFC 3986's host grammar).
_is_valid_host = re.compile(rb"(?:\[[0-9A-Za-z:.]+\]|[A-Za-z0-9\-._~%!$&'()*+,;=]*)(?::[0-9]*)?").fullmatch


class HttpConnection(asyncio.Protocol):
    """One HTTP/1.1 connection (see the module docstring)."""

    def __init__(self, app: HttpApp, limits: ProtocolLimits, *, loop: asyncio.AbstractEventLoop | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 on_close: Callable[["HttpConnection"], None] | None = None):
        self.app = app
        self.limits = limits
        self.loop = loop
        self.clock = clock
        self._on_close = on_close
        # The URL fits in the head, so a URL over its own limit is 414 before the head can be 431.
        self._url_limit = min(limits.max_url_bytes, limits.max_header_bytes - REQUEST_LINE_OVERHEAD)
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpRequestParser(self)
        self._current: HttpRequest | None = None  # being parsed
        self._in_head = False  # _current's head is not complete yet
        self._head_bytes = 0  # _current's request line, fields and trailers, as the parser reported them
        self._num_events = 0  # messages, body pieces and chunk boundaries parsed (with _head_bytes: progress)
        self._quiet_bytes = 0  # bytes of _current read since the parser last reported anything
        self._reject: _Reject | None = None
        self._failure: _Reject | None = None  # the parser failed; answered after the responses owed
        self._pipeline: deque[HttpRequest] = deque()
        self._active: HttpRequest | None = None  # being answered
        self._task: asyncio.Task | None = None
        self._streaming = False  # a streamed response head was written, its end not yet
        self._responded = False  # the active request's response has started
        self._chunked = False
        self._reading_paused = False
        self._write_paused = False
        self._lingering = False  # answered and half-closed: reads are dropped until the client closes
        self._linger_until = 0.0
        self._drain_waiters: list[asyncio.Future] = []
        self._disconnect_callbacks: list[Callable[[], None]] = []
        self.is_lost = False
        self.is_shutting_down = False
        self.deadline = 0.0  # 0 = none
        self._deadline_is_idle = False

    # -- transport callbacks -------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if self.loop is None:
            self.loop = asyncio.get_running_loop()
        self._set_deadline(self.limits.request_timeout_s, idle=True)

    def connection_lost(self, exc: Exception | None) -> None:
        self.is_lost = True
        for request in (self._current, *self._pipeline):
            if request is not None:
                request.release()
        self._pipeline.clear()
        self._current = None
        callbacks, self._disconnect_callbacks = self._disconnect_callbacks, []
        for callback in callbacks:
            try:
                callback()
            except Exception:  # a failing callback must not keep others from running
                log.exception("disconnect callback failed")
        self._wake_drain_waiters()
        if self._on_close is not None:
            self._on_close(self)

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            self.deadline = min(self._linger_until, self.clock() + LINGER_IDLE_S)
            return
        if not self.is_open or self._failure is not None:
            return  # closing, or the parser has failed and its error waits for earlier responses
        num_events, head_bytes = self._num_events, self._head_bytes
        try:
            self._feed(data)
        except httptools.HttpParserError as exc:
            reject, self._reject = self._reject, None
            if reject is None:
                if isinstance(exc, httptools.HttpParserCallbackError):  # a bug here, not bad input
                    log.error("HTTP parser callback failed", exc_info=exc.__context__ or exc)
                    reject = _Reject(500, "internal error while reading the request")
                elif str(exc) in VERSION_ERRORS:
                    reject = _Reject(505, "only HTTP/1.0 and HTTP/1.1 are supported")
                else:
                    reject = _Reject(400, f"malformed HTTP request: {exc}")
            self._fail(reject.status, reject.message)
            return
        request = self._current
        if request is None or not self.is_open:
            self._quiet_bytes = 0
            return
        if self._num_events != num_events or self._head_bytes != head_bytes:
            self._quiet_bytes = 0
        else:
            self._quiet_bytes += len(data)
        if self._in_head:
            if self._head_bytes + self._quiet_bytes > self.limits.max_header_bytes:
                self._fail(431, f"request head exceeds {self.limits.max_header_bytes} bytes")
        elif self._quiet_bytes > MAX_CHUNK_LINE_BYTES:
            self._fail(413, f"a chunk line or trailer exceeds {MAX_CHUNK_LINE_BYTES} bytes")
        elif request.early_response is not None and self._active is None and not self._pipeline:
            self._answer_early(request)

    def _feed(self, data: bytes) -> None:
        while True:
            try:
                self._parser.feed_data(data)
                return
            except httptools.HttpParserUpgrade as exc:
                # llhttp pauses after a request that asks to switch protocols (Upgrade,
                # CONNECT). It was answered in HTTP/1.1 (RFC 9110 section 7.8 lets a server
                # ignore Upgrade), so what follows it is the next request.
                offset = exc.args[0]
                if offset >= len(data) or not self.is_open:
                    return
                data = memoryview(data)[offset:]

    def eof_received(self) -> bool | None:
        # NOTE: a client that half-closes is treated as gone: detecting disconnects
        # (and cancelling their generation) matters more than half-open clients.
        return None

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        self._wake_drain_waiters()

    # -- parser callbacks ----------------------------------------------------

    def on_message_begin(self) -> None:
        self._num_events += 1
        if self.transport.is_closing():  # a request after one that closed the connection: stop parsing
            raise self._stop(400, "request after the connection closed")
        self._current = HttpRequest(self.clock())
        self._head_bytes = 0
        self._in_head = True
        self._set_deadline(self.limits.request_timeout_s, idle=False)

    def on_url(self, url: bytes) -> None:
        request = self._current
        request._url += url
        self._head_bytes += len(url)
        if len(request._url) > self._url_limit:
            raise self._stop(414, f"request URL exceeds {self._url_limit} bytes")

    def on_header(self, name: bytes, value: bytes) -> None:
        head_bytes = self._head_bytes = self._head_bytes + len(name) + len(value) + FIELD_LINE_OVERHEAD
        if head_bytes > self.limits.max_header_bytes:
            raise self._stop(431, f"request head exceeds {self.limits.max_header_bytes} bytes")
        if self._in_head:  # else a trailer field (after a chunked body): counted, not kept
            name = name.lower()
            value = value.rstrip(b" \t")  # llhttp drops the whitespace before a value, not after it
            request = self._current
            if name == b"host":
                self._on_host(value)
            elif name == b"origin" and request.origin is None:
                request.origin = value
            request.headers.append((name, value))

    def _on_host(self, value: bytes) -> None:
        request = self._current
        if request.host is not None:  # RFC 9112 section 3.2
            raise self._stop(400, "more than one Host header")
        request.host = value

    def on_headers_complete(self) -> None:
        request = self._current
        parser = self._parser
        self._in_head = False
        method = parser.get_method()
        self._head_bytes += len(method) + REQUEST_LINE_OVERHEAD
        if self._head_bytes > self.limits.max_header_bytes:
            raise self._stop(431, f"request head exceeds {self.limits.max_header_bytes} bytes")
        request.method = method.decode("ascii", "replace")
        request.http_version = version = parser.get_http_version()
        if version != "1.1" and version != "1.0":
            raise self._stop(505, "only HTTP/1.0 and HTTP/1.1 are supported")
        request.keep_alive = parser.should_keep_alive()
        if request.host is None:
            if version == "1.1":  # RFC 9112 section 3.2 (HTTP/1.0 may leave it out)
                raise self._stop(400, "an HTTP/1.1 request needs a Host header")
        elif _is_valid_host(request.host) is None:
            raise self._stop(400, "invalid Host header")
        try:
            url = httptools.parse_url(request._url)
        except httptools.HttpParserInvalidURLError:
            raise self._stop(400, "malformed request URL") from None
        try:
            # An absolute-form target without a path ("GET http://host HTTP/1.1") means "/".
            request.path = url.path.decode("utf-8") if url.path is not None else "/"
        except UnicodeDecodeError:
            raise self._stop(400, "request path is not UTF-8") from None
        request.query = url.query or b""
        length = request.header(b"content-length")
        if length is not None:
            # llhttp has already rejected non-numeric and conflicting lengths.
            request.content_length = int(length)
            if request.content_length > self.limits.max_body_bytes:
                raise self._stop(413, f"request body of {request.content_length} bytes exceeds the "
                                      f"limit of {self.limits.max_body_bytes} bytes")
        if (request.content_length or request.header(b"transfer-encoding")) and parser.should_upgrade():
            # llhttp would hand the body over as the new protocol's bytes; we do not switch.
            raise self._stop(400, "a request asking to upgrade the protocol cannot carry a body")
        early = self.app.on_request_head(request)
        if early is not None:
            request.early_response = early  # sent once the head's read ends (data_received)
        elif (request.header(b"expect") or b"").lower() == b"100-continue" and self._can_write_interim():
            self.transport.write(CONTINUE)

    def on_body(self, body: bytes) -> None:
        self._num_events += 1
        request = self._current
        request._body_len += len(body)
        if request._body_len > self.limits.max_body_bytes:
            raise self._stop(413, f"request body exceeds the limit of {self.limits.max_body_bytes} bytes")
        if request.early_response is None:  # else read and dropped, so the connection stays usable
            if request.budget is not None and not request.budget.take(len(body)):
                raise self._stop(503, "the server holds as many request bodies as it can; try again shortly")
            request._body_parts.append(body)

    def on_chunk_header(self) -> None:
        self._num_events += 1

    def on_chunk_complete(self) -> None:
        self._num_events += 1

    def on_message_complete(self) -> None:
        request, self._current = self._current, None
        parts = request._body_parts
        request.body = parts[0] if len(parts) == 1 else b"".join(parts)
        request._body_parts = []
        self.deadline = 0.0
        self._pipeline.append(request)
        if self._active is None:
            self._run_next()
        elif len(self._pipeline) >= MAX_PIPELINE and not self._reading_paused:
            self._reading_paused = True
            self.transport.pause_reading()

    # -- request cycle -------------------------------------------------------

    def _run_next(self) -> None:
        while self._pipeline and self._active is None and self.is_open:
            request = self._pipeline.popleft()
            if self._reading_paused and len(self._pipeline) < MAX_PIPELINE // 2:
                self._reading_paused = False
                self.transport.resume_reading()
            if request.early_response is not None:
                request.release()
                self._write_response(request, request.early_response)
                continue
            self._active = request
            self._responded = False
            try:
                result = self.app.handle(request, self)
            except Exception as exc:  # the app failed before producing anything
                log.exception("request handler failed")
                result = self.app.error_response(500, f"internal error: {exc}")
            if isinstance(result, Response):
                self._finish(request, result)
            else:
                self._task = self.loop.create_task(self._await_handler(request, result))
                return
        if self._active is None and not self._pipeline and self.is_open:
            current = self._current
            if self._failure is not None:
                failure, self._failure = self._failure, None
                self._fail(failure.status, failure.message, failure.target)
            elif current is not None:
                if current.early_response is not None and not self._in_head:
                    self._answer_early(current)
            elif self.is_shutting_down:
                self.transport.close()
            else:
                self._set_deadline(self.limits.keepalive_timeout_s, idle=True)

    async def _await_handler(self, request: HttpRequest, coro: Awaitable[Response | None]) -> None:
        try:
            response = await coro
        except asyncio.CancelledError:
            response = None
            if not self.is_lost:
                self.abort()
        except Exception as exc:
            log.exception("request handler failed")
            if self._streaming:
                response = None
                self.abort()
            else:
                response = self.app.error_response(500, f"internal error: {exc}")
        self._task = None
        self._finish(request, response)
        if self._active is None:
            self._run_next()

    def _finish(self, request: HttpRequest, response: Response | None) -> None:
        request.release()
        self._disconnect_callbacks.clear()
        if self._streaming:
            self.end_stream()
        elif not self._responded:
            if response is not None:
                self._write_response(request, response)
            else:
                self.abort()  # the handler gave up without answering
        self._active = None

    def _answer_early(self, request: HttpRequest) -> None:
        """Send the refusal the app decided from ``request``'s head while its body is still due."""
        self._current = None
        request.release()
        # NOTE: the client may stop sending the body (it was refused) or go on; either way the
        # connection's framing is unknown from here, so it closes after a lingering read.
        self.transport.write(request.early_response.encode(keep_alive=False, head_only=request.method == "HEAD",
                                                           extra=request.response_headers))
        self._close_after_write(linger=True)

    def _write_response(self, request: HttpRequest, response: Response) -> None:
        if not self.is_open:
            return
        keep_alive = request.keep_alive and not response.close and not self.is_shutting_down
        self.transport.write(response.encode(keep_alive=keep_alive, head_only=request.method == "HEAD",
                                             extra=request.response_headers))
        if not keep_alive:
            self._close_after_write()

    # -- the API handlers use ------------------------------------------------

    def add_disconnect_callback(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (once) if the client goes away before the response ends."""
        if self.is_lost:
            callback()
        else:
            self._disconnect_callbacks.append(callback)

    def start_stream(self, status: int = 200, content_type: bytes = EVENT_STREAM,
                     headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
        """Write the head of a streamed response; then ``write`` and ``end_stream``."""
        request = self._active
        self._streaming = True
        self._responded = True
        self._chunked = request.http_version == "1.1"
        keep_alive = request.keep_alive and self._chunked and not self.is_shutting_down
        request.keep_alive = keep_alive
        if self.is_open:
            self.transport.write(stream_head(status, content_type, (*headers, *request.response_headers),
                                             chunked=self._chunked, keep_alive=keep_alive))

    def write(self, data: bytes) -> None:
        """Write part of a streamed body (buffered by the transport)."""
        if data and not self.is_lost:
            transport = self.transport
            if not transport.is_closing():
                transport.write(b"%x\r\n%s\r\n" % (len(data), data) if self._chunked else data)

    @property
    def is_write_paused(self) -> bool:
        return self._write_paused and not self.is_lost

    async def drain(self) -> None:
        """Wait while the client reads slower than we write (backpressure)."""
        while self._write_paused and not self.is_lost:
            waiter = self.loop.create_future()
            self._drain_waiters.append(waiter)
            await waiter

    def end_stream(self) -> None:
        if not self._streaming:
            return
        self._streaming = False
        request = self._active
        if not self.is_open:
            return
        if self._chunked:
            self.transport.write(LAST_CHUNK)
        if not request.keep_alive:
            self._close_after_write()

    def abort(self) -> None:
        """Drop the connection now (a response that cannot be completed)."""
        if self.transport is not None and not self.is_lost:
            self.transport.abort()

    # -- lifecycle -----------------------------------------------------------

    @property
    def is_open(self) -> bool:
        """Still reading requests and writing responses."""
        return (not self.is_lost and self.transport is not None and not self.transport.is_closing()
                and not self._lingering)

    @property
    def is_idle(self) -> bool:
        return self._active is None and not self._pipeline and self._current is None

    def shutdown(self) -> None:
        """Stop taking requests: close now if idle, else after the current response."""
        self.is_shutting_down = True
        transport = self.transport
        if self.is_idle and not self.is_lost and transport is not None and not transport.is_closing():
            transport.close()  # lingering ones too

    def on_tick(self, now: float) -> None:
        """Enforce the request and keep-alive deadlines (called about once a second)."""
        if self.deadline == 0.0 or now < self.deadline or self.is_lost:
            return
        self.deadline = 0.0
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if self._lingering or (self._deadline_is_idle and self._current is None):
            transport.close()
        else:
            self._fail(408, f"request not received within {self.limits.request_timeout_s:g} s")

    # -- internals -----------------------------------------------------------

    def _set_deadline(self, seconds: float, *, idle: bool) -> None:
        self.deadline = self.clock() + seconds if seconds > 0 else 0.0
        self._deadline_is_idle = idle

    def _stop(self, status: int, message: str) -> _Reject:
        self._reject = _Reject(status, message)
        return self._reject

    def _can_write_interim(self) -> bool:
        return self._active is None and not self._pipeline and not self.is_lost

    def _fail(self, status: int, message: str, target: tuple[str, str] | None = None) -> None:
        """Answer a protocol error after the responses already owed, and close."""
        self._reject = None
        request, self._current = self._current, None
        if request is not None:
            if target is None and request.path:  # the route's family renders it
                target = (request.method, request.path)
            request.release()
        self._in_head = False
        self.deadline = 0.0
        if not self.is_open:
            return
        if self._active is None and not self._pipeline:
            response = self.app.error_response(status, message, target)
            self.transport.write(response.encode(keep_alive=False))
            # A client too slow to send its request gets no lingering read.
            self._close_after_write(linger=status != 408)
        else:
            # Responses are sent in request order: this one waits for _run_next, and
            # nothing more is parsed (the parser cannot resume after an error).
            self._failure = _Reject(status, message, target)

    def _close_after_write(self, *, linger: bool = False) -> None:
        """Close once the written bytes are flushed (asyncio transports flush first).

        ``linger``: the client may still be sending. Closing a socket with unread input
        makes the kernel send a reset, which can destroy the response before the client
        reads it; so half-close instead and drop what arrives until the client closes,
        sends nothing for LINGER_IDLE_S, or LINGER_MAX_S has passed (RFC 9112 section 9.6).
        """
        transport = self.transport
        if not linger or not transport.can_write_eof():
            self.deadline = 0.0
            transport.close()
            return
        transport.write_eof()
        self._lingering = True
        now = self.clock()
        self._linger_until = now + LINGER_MAX_S
        self.deadline = now + LINGER_IDLE_S
        self._deadline_is_idle = True
        if self._reading_paused:
            self._reading_paused = False
            transport.resume_reading()

    def _wake_drain_waiters(self) -> None:
        waiters, self._drain_waiters = self._drain_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)
