"""HTTP edges over real sockets, on every engine kind (conftest.py's ``engine_kind``).

Bearer auth per RFC 9110 section 11.4, refusals sent from the head before a declared
body, Host per RFC 9112 section 3.2, one header-limit verdict however TCP splits a
head, and odd input: each gets its status, the connection ends, the server still
answers /health, and nothing logs a traceback. The server here has an api key, a
4 KiB header limit and a 1 s request timeout, so limits and 408 are quick to reach.
"""

from __future__ import annotations

import json
import logging
import os
import random
import socket
import time

import pytest
from protocol_harness import parse_responses
from server_harness import FLARE_SERVE, Served, request, start_subprocess

from flare.config import ServerConfig
from flare.server.protocol import LINGER_IDLE_S, MAX_CHUNK_LINE_BYTES
from flare.server.session import Server
from flare.testing.fake_engine import FakeEngine, FakeEngineConfig

KEY = "edge-secret"
HEADER_LIMIT = 4096
REQUEST_TIMEOUT_S = 1.0


class _Tracebacks(logging.Handler):
    """Log records that carry an exception (the in-process server's)."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        if record.exc_info:
            self.records.append(record)


@pytest.fixture(scope="module")
def edge_server(engine_kind):
    if engine_kind == "fake":
        config = ServerConfig(host="127.0.0.1", port=0, api_key=KEY, max_header_bytes=HEADER_LIMIT,
                              request_timeout_s=REQUEST_TIMEOUT_S)
        tracebacks = _Tracebacks()
        logger = logging.getLogger("flare")
        logger.addHandler(tracebacks)
        session = Server.start(FakeEngine(FakeEngineConfig()), config)
        served = Served("fake", session.base_url, KEY, model=session.engine.card.id, session=session)
        served.tracebacks = tracebacks.records
        yield served
        served.stop()
        logger.removeHandler(tracebacks)
        return
    core = [os.environ["FLARE_E2E_CORE"]] if engine_kind == "core" else []
    argv = [*FLARE_SERVE, *core, "--host", "127.0.0.1", "--port", "0", "--api-key", KEY,
            "--request-timeout", str(REQUEST_TIMEOUT_S)]
    served = start_subprocess(argv, kind=engine_kind, api_key=KEY,
                              env={"FLARE_MAX_HEADER_BYTES": str(HEADER_LIMIT)})
    yield served
    served.stop()


def _exchange(served: Served, *writes: bytes, pause_s: float = 0.0,
              timeout_s: float = 10.0) -> tuple[list[tuple[int, dict, bytes]], bool]:
    """Send ``writes`` on a new connection and read until the server closes it (or the
    timeout): (responses, whether the server closed)."""
    with socket.create_connection(served.host_port, timeout=timeout_s) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for data in writes:
            try:
                sock.sendall(data)
            except (BrokenPipeError, ConnectionResetError):
                break  # refused already; what was sent is answered below
            if pause_s:
                time.sleep(pause_s)
        received, closed = _read_to_eof(sock, timeout_s)
    return parse_responses(received), closed


def _read_to_eof(sock: socket.socket, timeout_s: float) -> tuple[bytes, bool]:
    received = bytearray()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            break
        except ConnectionResetError:
            return bytes(received), True
        if not chunk:
            return bytes(received), True
        received += chunk
    return bytes(received), False


def _statuses(served: Served, *writes: bytes, **kwargs) -> tuple[list[int], bool]:
    responses, closed = _exchange(served, *writes, **kwargs)
    return [status for status, _, _ in responses], closed


def _assert_healthy(served: Served) -> None:
    assert request(served, "GET", "/health", auth=False, timeout=10)[0] == 200


def _get(path: bytes, *fields: bytes) -> bytes:
    """A GET head that asks the server to close after answering (so reads end at EOF)."""
    lines = [b"GET " + path + b" HTTP/1.1", b"Host: t", b"Connection: close", *fields]
    return b"".join(line + b"\r\n" for line in lines) + b"\r\n"


# -- auth -----------------------------------------------------------------------

@pytest.mark.parametrize("value", [b"Bearer KEY", b"bearer KEY", b"BEARER KEY", b"Bearer  KEY", b"bEaReR KEY",
                                   b"Bearer KEY  "])
def test_bearer_scheme_is_case_insensitive(edge_server, value):
    value = value.replace(b"KEY", KEY.encode())
    assert _statuses(edge_server, _get(b"/v1/models", b"Authorization: " + value)) == ([200], True)


@pytest.mark.parametrize("fields", [
    (), (b"Authorization: Bearer wrong",), (b"Authorization: Basic KEY",), (b"Authorization: BearerKEY",),
    (b"Authorization: Bearer",), (b"Authorization: Bearer\tKEY",), (b"Authorization: Bearer KEYKEY",),
    (b"Authorization: Bearer KEY", b"Authorization: Bearer KEY"),
], ids=["missing", "wrong", "basic", "no-space", "no-token", "tab", "longer", "twice"])
def test_bad_credentials_are_401(edge_server, fields):
    fields = tuple(f.replace(b"KEY", KEY.encode()) for f in fields)
    [(status, headers, body)], closed = _exchange(edge_server, _get(b"/v1/models", *fields))
    assert status == 401 and closed and headers[b"www-authenticate"] == b"Bearer"
    assert json.loads(body)["error"]["code"] == "invalid_api_key"


@pytest.mark.parametrize("head, status", [
    (b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
     b"Content-Length: 100000\r\n\r\n", 401),
    (b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n", 401),
    (b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer nope\r\n"
     b"Content-Length: 100000\r\nExpect: 100-continue\r\n\r\n", 401),
    (b"POST /no/such/route HTTP/1.1\r\nHost: t\r\nContent-Length: 100000\r\n\r\n", 404),
    (b"POST /v1/models HTTP/1.1\r\nHost: t\r\nContent-Length: 100000\r\n\r\n", 405),
], ids=["401-length", "401-chunked", "401-expect", "404", "405"])
def test_refusal_comes_before_the_declared_body(edge_server, head, status):
    with socket.create_connection(edge_server.host_port, timeout=10) as sock:
        started = time.monotonic()
        sock.sendall(head)
        sock.settimeout(0.5)
        first = sock.recv(65536)  # raises TimeoutError if the server waits for the body
        assert time.monotonic() - started < 0.5
        rest, closed = _read_to_eof(sock, LINGER_IDLE_S + 3)
        [(got, headers, _)] = parse_responses(first + rest)
        assert got == status and headers[b"connection"] == b"close" and closed
    _assert_healthy(edge_server)


def test_body_sent_after_a_refusal_is_read_and_dropped(edge_server):
    """The lingering close: a client that sends its body anyway is not reset mid-upload.
    (Should the body arrive with the head, the refusal follows it: also fine.)"""
    body = b"x" * 100000
    with socket.create_connection(edge_server.host_port, timeout=10) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nConnection: close\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body))
        sock.sendall(body)  # no BrokenPipeError / ConnectionResetError
        received, closed = _read_to_eof(sock, LINGER_IDLE_S + 3)
    [(status, _, _)] = parse_responses(received)
    assert status == 401 and closed
    _assert_healthy(edge_server)


# -- Host --------------------------------------------------------------------------

@pytest.mark.parametrize("raw, status", [
    (b"GET /health HTTP/1.1\r\nConnection: close\r\n\r\n", 400),
    (b"GET /health HTTP/1.1\r\nHost: a\r\nHost: b\r\nConnection: close\r\n\r\n", 400),
    (b"GET /health HTTP/1.1\r\nHost: a b\r\nConnection: close\r\n\r\n", 400),
    (b"GET /health HTTP/1.0\r\n\r\n", 200),
    (b"GET /health HTTP/1.0\r\nHost: a\r\nHost: a\r\n\r\n", 400),
], ids=["1.1-none", "two", "invalid", "1.0-none", "1.0-two"])
def test_host_rules(edge_server, raw, status):
    assert _statuses(edge_server, raw) == ([status], True)
    _assert_healthy(edge_server)


# -- one header-limit verdict however TCP splits the head ---------------------

def _head_of(size: int) -> bytes:
    fixed = _get(b"/health", b"X-Pad: ")
    head = fixed.replace(b"X-Pad: ", b"X-Pad: " + b"p" * (size - len(fixed)))
    assert len(head) == size
    return head


@pytest.mark.parametrize("size, status", [(HEADER_LIMIT, 200), (HEADER_LIMIT + 1, 431)], ids=["at", "over"])
def test_header_limit_verdict_does_not_depend_on_segmentation(edge_server, size, status):
    raw = _head_of(size)
    rng = random.Random(size)
    assert _statuses(edge_server, raw) == ([status], True)
    offsets = sorted({*range(1, 64), *range(64, size, 61), *range(size - 64, size)})
    for offset in offsets:
        assert _statuses(edge_server, raw[:offset], raw[offset:]) == ([status], True), offset
    for _ in range(6):
        cuts = sorted(rng.sample(range(1, size), rng.randint(3, 9)))
        writes = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, size])]
        assert _statuses(edge_server, *writes, pause_s=0.005) == ([status], True), cuts


# -- odd input -------------------------------------------------------------------

def _chat_chunked(*chunks: bytes) -> bytes:
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer " + KEY.encode() + b"\r\nTransfer-Encoding: chunked\r\n\r\n" + b"".join(chunks))


def _chat_body(model: str) -> bytes:
    return json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}).encode()


@pytest.mark.parametrize("raw, status", [
    (b"GET /health HTTP/1.1\r\nHost: t\r\nX\xff: 1\r\n\r\n", 400),
    (b"GET /health HTTP/1.1\r\nHost: t\r\nX: a\x00b\r\n\r\n", 400),
    (b"GET /caf\xc3\xa9 HTTP/1.1\r\nHost: t\r\n\r\n", 400),
    (b"GET /health HTTP/2.0\r\nHost: t\r\n\r\n", 505),
    (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 505),
    (b"GET /health HTTP/1.1\r\nHost: t\r\nContent-Length: 99999999999999999999999\r\n\r\n", 400),
    (b"POST /v1/models HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n" + b"f" * 40 + b"\r\n", 400),
    (b"GET /" + b"u" * 8000 + b" HTTP/1.1\r\nHost: t\r\n\r\n", 414),
], ids=["field-name-byte", "nul-in-value", "non-ascii-url", "http2", "h2-preface", "length-overflow",
        "chunk-size-overflow", "long-url"])
def test_odd_input_gets_its_status_and_the_connection_ends(edge_server, raw, status):
    assert _statuses(edge_server, raw) == ([status], True)
    _assert_healthy(edge_server)


def test_overlong_chunk_size_line_is_413(edge_server):
    head = _chat_chunked()
    zeros = [b"0" * 1024] * (MAX_CHUNK_LINE_BYTES // 1024 + 2)
    assert _statuses(edge_server, head, *zeros, pause_s=0.002) == ([413], True)
    _assert_healthy(edge_server)


def test_chunk_extension_is_accepted(edge_server):
    body = _chat_body(edge_server.model)
    raw = _chat_chunked(b"%x;name=value;flag\r\n" % len(body), body, b"\r\n0\r\n\r\n")
    [(status, _, payload)], closed = _exchange(edge_server, raw, timeout_s=60)
    assert status == 200 and closed, payload
    assert json.loads(payload)["object"] == "chat.completion"


def test_garbage_pipelined_after_a_valid_request(edge_server):
    raw = b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n\x16\x03\x01 not http\r\n\r\n"
    assert _statuses(edge_server, raw) == ([200, 400], True)
    _assert_healthy(edge_server)


def test_upgrade_is_declined_and_the_request_served(edge_server):
    raw = (b"GET /health HTTP/1.1\r\nHost: t\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
           b"HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n" + _get(b"/health"))
    assert _statuses(edge_server, raw) == ([200, 200], True)


def test_head_that_never_completes_is_408(edge_server):
    started = time.monotonic()
    statuses = _statuses(edge_server, b"GET /health HTTP/1.1\r\nHost: t\r\nX-Slow: ab", timeout_s=REQUEST_TIMEOUT_S + 5)
    assert statuses == ([408], True) and time.monotonic() - started < REQUEST_TIMEOUT_S + 3
    _assert_healthy(edge_server)


def test_nothing_logged_a_traceback(edge_server):
    """Runs last in this module: every odd input above was answered without one."""
    _assert_healthy(edge_server)
    if edge_server.session is not None:
        assert [r.getMessage() for r in edge_server.tracebacks] == []
    else:
        logged = "".join(edge_server.stderr_lines)
        assert "Traceback" not in logged, logged
