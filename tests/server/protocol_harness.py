"""HttpConnection without sockets: a fake transport and clock, an echo app, a response splitter.

Shared by test_protocol.py and test_protocol_edges.py (bytes in, bytes out).
"""

from __future__ import annotations

import asyncio

from flare.server.protocol import HttpConnection, ProtocolLimits
from flare.server.response import Response


class FakeTransport(asyncio.Transport):
    def __init__(self):
        super().__init__()
        self.out = bytearray()
        self.closing = False
        self.aborted = False
        self.eof_written = False
        self.reading = True

    def write(self, data):
        assert not self.closing and not self.eof_written, "write after close"
        self.out += data

    def can_write_eof(self):
        return True

    def write_eof(self):
        self.eof_written = True

    def close(self):
        self.closing = True

    def abort(self):
        self.closing = True
        self.aborted = True

    def is_closing(self):
        return self.closing

    @property
    def is_done(self) -> bool:
        """Closed, or half-closed for a lingering close: no more responses on it."""
        return self.closing or self.eof_written

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
        if request.path == "/bug":
            raise RuntimeError("a bug in the app")
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

    def error_response(self, status, message, target=None):
        return Response(status, message.encode(), b"text/plain")


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def parse_responses(raw: bytes) -> list[tuple[int, dict, bytes]]:
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


def connect(loop, app=None, **limits):
    """A connection on a fake transport: (conn, transport, app, clock)."""
    app = app or EchoApp()
    clock = Clock()
    conn = HttpConnection(app, ProtocolLimits(**limits), loop=loop, clock=clock)
    transport = FakeTransport()
    conn.connection_made(transport)
    return conn, transport, app, clock


def settle(loop):
    loop.run_until_complete(asyncio.sleep(0.01))
