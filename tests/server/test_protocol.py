"""HttpConnection bytes in, bytes out: no sockets, a fake transport and clock."""

from __future__ import annotations

import asyncio
import re

import pytest

from flare.server.protocol import MAX_PIPELINE, HttpConnection, ProtocolLimits
from flare.server.response import Response


class FakeTransport(asyncio.Transport):
    def __init__(self):
        super().__init__()
        self.out = bytearray()
        self.closing = False
        self.aborted = False
        self.reading = True

    def write(self, data):
        assert not self.closing, "write after close"
        self.out += data

    def close(self):
        self.closing = True

    def abort(self):
        self.closing = True
        self.aborted = True

    def is_closing(self):
        return self.closing

    def pause_reading(self):
        self.reading = False

    def resume_reading(self):
        self.reading = True

    def get_extra_info(self, name, default=None):
        return default


class EchoApp:
    """Echoes method, path and body; some paths reject early or answer later."""

    def __init__(self):
        self.heads = []
        self.gate: asyncio.Event | None = None
        self.released = 0

    def on_request_head(self, request):
        self.heads.append(request.path)
        if request.path == "/reject":
            return Response(429, b"busy", b"text/plain")
        request.permit = self
        return None

    def release(self):
        self.released += 1

    def handle(self, request, conn):
        body = f"{request.method} {request.path} {len(request.body)}:".encode() + request.body
        if request.path == "/later":
            return self._later(body)
        if request.path == "/stream":
            return self._stream(conn)
        return Response(200, body, b"text/plain")

    async def _later(self, body):
        await self.gate.wait()
        return Response(200, body, b"text/plain")

    async def _stream(self, conn):
        conn.start_stream()
        for i in range(3):
            conn.write(b"data: %d\n\n" % i)
            await conn.drain()

    def error_response(self, status, message):
        return Response(status, message.encode(), b"text/plain")


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def _responses(raw: bytes) -> list[tuple[int, dict, bytes]]:
    """Split concatenated fixed-length or chunked responses."""
    out = []
    data = bytes(raw)
    while data:
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split()[1])
        headers = dict(line.split(b": ", 1) for line in lines[1:])
        if b"content-length" in headers:
            n = int(headers[b"content-length"])
            body, data = rest[:n], rest[n:]
        elif headers.get(b"transfer-encoding") == b"chunked":
            body = b""
            while True:
                size_line, _, rest = rest.partition(b"\r\n")
                size = int(size_line, 16)
                body += rest[:size]
                rest = rest[size + 2:]
                if size == 0:
                    break
            data = rest
        else:
            body, data = rest, b""
        out.append((status, headers, body))
    return out


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def _connect(loop, app=None, **limits):
    app = app or EchoApp()
    clock = Clock()
    conn = HttpConnection(app, ProtocolLimits(**limits), loop=loop, clock=clock)
    transport = FakeTransport()
    conn.connection_made(transport)
    return conn, transport, app, clock


def _settle(loop):
    loop.run_until_complete(asyncio.sleep(0.01))


def test_keep_alive_serves_sequential_requests(loop):
    conn, transport, app, _ = _connect(loop)
    conn.data_received(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
    conn.data_received(b"GET /b HTTP/1.1\r\nHost: x\r\n\r\n")
    got = _responses(transport.out)
    assert [(s, b) for s, _, b in got] == [(200, b"GET /a 0:"), (200, b"GET /b 0:")]
    assert all(b"connection" not in h for _, h, _ in got)
    assert not transport.closing
    assert app.released == 2


def test_pipelined_requests_answer_in_order(loop):
    conn, transport, app, _ = _connect(loop)
    app.gate = asyncio.Event()
    conn.data_received(b"GET /later HTTP/1.1\r\n\r\nPOST /p HTTP/1.1\r\nContent-Length: 3\r\n\r\nabcGET /c HTTP/1.1\r\n\r\n")
    assert transport.out == b""  # /later holds the line; nothing may overtake it
    app.gate.set()
    _settle(loop)
    got = _responses(transport.out)
    assert [b for _, _, b in got] == [b"GET /later 0:", b"POST /p 3:abc", b"GET /c 0:"]


def test_pipeline_depth_pauses_reading(loop):
    conn, transport, app, _ = _connect(loop)
    app.gate = asyncio.Event()
    conn.data_received(b"GET /later HTTP/1.1\r\n\r\n" + b"GET /x HTTP/1.1\r\n\r\n" * MAX_PIPELINE)
    assert not transport.reading
    app.gate.set()
    _settle(loop)
    assert transport.reading
    assert len(_responses(transport.out)) == MAX_PIPELINE + 1


def test_chunked_request_body_is_reassembled(loop):
    conn, transport, _, _ = _connect(loop)
    conn.data_received(b"POST /c HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
    conn.data_received(b"6\r\n world\r\n0\r\n\r\n")
    [(status, _, body)] = _responses(transport.out)
    assert (status, body) == (200, b"POST /c 11:hello world")


def test_content_length_over_limit_is_413_before_body(loop):
    conn, transport, app, _ = _connect(loop, max_body_bytes=10)
    conn.data_received(b"POST /big HTTP/1.1\r\nContent-Length: 11\r\n\r\n")
    [(status, headers, body)] = _responses(transport.out)
    assert status == 413 and b"11 bytes" in body
    assert headers[b"connection"] == b"close" and transport.closing
    assert app.heads == []  # the app never saw it


def test_chunked_body_over_limit_is_413(loop):
    conn, transport, _, _ = _connect(loop, max_body_bytes=8)
    conn.data_received(b"POST /c HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
    assert transport.out == b""
    conn.data_received(b"5\r\nworld\r\n")
    [(status, _, _)] = _responses(transport.out)
    assert status == 413 and transport.closing


def test_early_response_discards_body_and_keeps_connection(loop):
    conn, transport, app, _ = _connect(loop)
    conn.data_received(b"POST /reject HTTP/1.1\r\nContent-Length: 4\r\n\r\nbody")
    conn.data_received(b"GET /next HTTP/1.1\r\n\r\n")
    got = _responses(transport.out)
    assert [(s, b) for s, _, b in got] == [(429, b"busy"), (200, b"GET /next 0:")]
    assert not transport.closing


@pytest.mark.parametrize("raw", [
    b"GARBAGE\r\n\r\n",
    b"GET / HTTP/9.9\r\n\r\n",
    b"GET / HTTP/1.1\r\nBad Header\r\n\r\n",
    b"GET / HTTP/1.1\r\nContent-Length: abc\r\n\r\n",
    b"GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
    b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    # Both framings at once: the request-smuggling shape.
    b"POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    b"GET / HTTP/1.1\r\nX: a\x00b\r\n\r\n",
    b"GET / HTTP/1.1\r\nX: a\r\n folded\r\n\r\n",
    b"GET /\x01 HTTP/1.1\r\n\r\n",
])
def test_malformed_requests_get_400_and_close(loop, raw):
    conn, transport, _, _ = _connect(loop)
    conn.data_received(raw)
    [(status, headers, _)] = _responses(transport.out)
    assert status == 400 and headers[b"connection"] == b"close" and transport.closing


def test_malformed_after_good_request_still_answers_first(loop):
    conn, transport, _, _ = _connect(loop)
    conn.data_received(b"GET /ok HTTP/1.1\r\n\r\nNOT HTTP AT ALL\r\n\r\n")
    got = _responses(transport.out)
    assert [s for s, _, _ in got] == [200, 400]
    assert transport.closing


def test_url_limit_is_414(loop):
    conn, transport, _, _ = _connect(loop, max_url_bytes=32)
    conn.data_received(b"GET /" + b"a" * 40 + b" HTTP/1.1\r\n\r\n")
    [(status, _, _)] = _responses(transport.out)
    assert status == 414 and transport.closing


def test_header_limit_is_431_even_when_trickled(loop):
    conn, transport, _, _ = _connect(loop, max_header_bytes=256, max_url_bytes=64)
    conn.data_received(b"GET / HTTP/1.1\r\nX-Big: ")
    for _ in range(40):
        if transport.closing:
            break
        conn.data_received(b"y" * 16)  # one header value that never ends
    [(status, _, _)] = _responses(transport.out)
    assert status == 431 and transport.closing


def test_many_headers_over_limit_is_431(loop):
    conn, transport, _, _ = _connect(loop, max_header_bytes=256)
    conn.data_received(b"GET / HTTP/1.1\r\n" + b"".join(b"X-H%d: v\r\n" % i for i in range(40)) + b"\r\n")
    [(status, _, _)] = _responses(transport.out)
    assert status == 431


def test_slow_client_gets_408(loop):
    conn, transport, app, clock = _connect(loop, request_timeout_s=5.0)
    conn.data_received(b"POST /slow HTTP/1.1\r\nContent-Length: 10\r\n\r\nab")
    clock.now += 4.0
    conn.on_tick(clock.now)
    assert transport.out == b""
    clock.now += 1.5
    conn.on_tick(clock.now)
    [(status, _, _)] = _responses(transport.out)
    assert status == 408 and transport.closing
    conn.connection_lost(None)
    assert app.released == 1  # the partly read request gave its permit back


def test_idle_keep_alive_connection_closes_silently(loop):
    conn, transport, _, clock = _connect(loop, keepalive_timeout_s=2.0)
    conn.data_received(b"GET /a HTTP/1.1\r\n\r\n")
    n = len(transport.out)
    clock.now += 1.0
    conn.on_tick(clock.now)
    assert not transport.closing
    clock.now += 1.5
    conn.on_tick(clock.now)
    assert transport.closing and len(transport.out) == n


def test_connection_that_never_sends_times_out(loop):
    conn, transport, _, clock = _connect(loop, request_timeout_s=3.0)
    clock.now += 3.5
    conn.on_tick(clock.now)
    assert transport.closing and transport.out == b""


def test_http10_closes_after_response(loop):
    conn, transport, _, _ = _connect(loop)
    conn.data_received(b"GET /a HTTP/1.0\r\n\r\n")
    [(status, headers, _)] = _responses(transport.out)
    assert status == 200 and headers[b"connection"] == b"close" and transport.closing


def test_connection_close_header_is_honoured(loop):
    conn, transport, _, _ = _connect(loop)
    conn.data_received(b"GET /a HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert transport.closing


def test_expect_continue(loop):
    conn, transport, _, _ = _connect(loop)
    conn.data_received(b"POST /e HTTP/1.1\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n")
    assert transport.out == b"HTTP/1.1 100 Continue\r\n\r\n"
    conn.data_received(b"hi")
    assert transport.out.endswith(b"POST /e 2:hi")


def test_stream_is_chunked_and_connection_reusable(loop):
    conn, transport, _, _ = _connect(loop)
    conn.data_received(b"GET /stream HTTP/1.1\r\n\r\nGET /after HTTP/1.1\r\n\r\n")
    _settle(loop)
    got = _responses(transport.out)
    assert got[0][0] == 200 and got[0][1][b"content-type"] == b"text/event-stream"
    assert got[0][2] == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"
    assert got[1][2] == b"GET /after 0:"


def test_stream_waits_for_slow_reader(loop):
    conn, transport, _, _ = _connect(loop)
    conn.pause_writing()
    conn.data_received(b"GET /stream HTTP/1.1\r\n\r\n")
    _settle(loop)
    assert transport.out.count(b"data:") == 1  # wrote one event, then waited
    conn.resume_writing()
    _settle(loop)
    assert _responses(transport.out)[0][2].count(b"data:") == 3


def test_disconnect_mid_request_runs_callbacks_and_releases(loop):
    conn, transport, app, _ = _connect(loop)
    app.gate = asyncio.Event()
    called = []
    conn.data_received(b"GET /later HTTP/1.1\r\n\r\nGET /queued HTTP/1.1\r\n\r\n")
    conn.add_disconnect_callback(lambda: called.append(1))
    conn.connection_lost(None)
    assert called == [1]
    assert app.released == 1  # the queued request; the active one releases when its task ends
    app.gate.set()
    _settle(loop)
    assert app.released == 2


def test_head_request_has_no_body(loop):
    conn, transport, _, _ = _connect(loop)
    conn.data_received(b"HEAD /h HTTP/1.1\r\n\r\n")
    head = bytes(transport.out)
    assert head.endswith(b"\r\n\r\n") and re.search(rb"content-length: \d+", head)


def test_shutdown_closes_idle_and_finishes_active(loop):
    conn, transport, app, _ = _connect(loop)
    app.gate = asyncio.Event()
    conn.data_received(b"GET /later HTTP/1.1\r\n\r\n")
    conn.shutdown()
    assert not transport.closing
    app.gate.set()
    _settle(loop)
    [(status, headers, _)] = _responses(transport.out)
    assert status == 200 and headers[b"connection"] == b"close" and transport.closing
