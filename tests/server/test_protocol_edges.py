"""HttpConnection at the edges of HTTP/1.1, bytes in, bytes out (helpers: protocol_harness.py).

One request gets one verdict however TCP splits it; Host and version rules (RFC 9112
sections 2.3 and 3.2); refusals decided from the head go out before the body; odd input
ends in a status, never in a traceback or a connection left open.
"""

from __future__ import annotations

import asyncio
import logging
import random

import pytest
from protocol_harness import EchoApp, connect, parse_responses, settle

from flare.server.protocol import LINGER_IDLE_S, MAX_CHUNK_LINE_BYTES


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def _padded_head(size: int, *, path: bytes = b"/h", num_fields: int = 40) -> bytes:
    """A GET head of exactly ``size`` bytes, its fields padded to length."""
    fixed = b"GET " + path + b" HTTP/1.1\r\nHost: x\r\n"
    fields = [b"X-Field-%02d: " % i for i in range(num_fields)]
    pad = size - len(fixed) - sum(len(f) + 2 for f in fields) - 2
    assert pad >= num_fields
    values = [b"v" * (pad // num_fields + (i < pad % num_fields)) for i in range(num_fields)]
    head = fixed + b"".join(f + v + b"\r\n" for f, v in zip(fields, values)) + b"\r\n"
    assert len(head) == size
    return head


def _answer(loop, writes, **limits) -> tuple[list[tuple[int, bytes]], bool]:
    """Feed ``writes`` to a fresh connection: ([(status, body)], is the connection done)."""
    conn, transport, _, _ = connect(loop, **limits)
    for data in writes:
        if transport.is_done:
            break
        conn.data_received(data)
    return [(status, body) for status, _, body in parse_responses(transport.out)], transport.is_done


def _splits(raw: bytes, seed: int, count: int) -> list[list[bytes]]:
    """``count`` random splits of ``raw`` into 3 to 12 writes, plus one write per byte."""
    rng = random.Random(seed)
    out = [[raw[i:i + 1] for i in range(len(raw))]]
    for _ in range(count):
        cuts = sorted(rng.sample(range(1, len(raw)), rng.randint(2, 11)))
        out.append([raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)])])
    return out


@pytest.mark.parametrize("over", [0, 1], ids=["at-limit", "one-over"])
def test_head_limit_gives_one_verdict_at_every_split(loop, over):
    """A 3 KB head exactly at the limit is served, one byte more is 431: in one write, split
    at every byte offset into two, in one-byte writes and in random multi-splits."""
    head = _padded_head(3000)
    raw = head.replace(b"GET /h", b"POST /h").replace(b"Host: x\r\n", b"Host: x\r\nContent-Length: 5\r\n") + b"hello"
    limit = len(raw) - 5 - over
    expected = [(431, b"request head exceeds %d bytes" % limit)] if over else [(200, b"POST /h 5:hello")]
    assert _answer(loop, [raw], max_header_bytes=limit) == (expected, bool(over))
    for offset in range(1, len(raw)):
        got = _answer(loop, [raw[:offset], raw[offset:]], max_header_bytes=limit)
        assert got == (expected, bool(over)), offset
    for writes in _splits(raw, seed=over, count=200):
        assert _answer(loop, writes, max_header_bytes=limit) == (expected, bool(over)), [len(w) for w in writes]


def test_pipelined_heads_are_counted_apart_at_every_split(loop):
    """Two heads just under the limit in one stream: neither is charged for the other."""
    first, second = _padded_head(1500, path=b"/a"), _padded_head(1500, path=b"/b")
    raw = first + second
    expected = ([(200, b"GET /a 0:"), (200, b"GET /b 0:")], False)
    for offset in range(1, len(raw)):
        assert _answer(loop, [raw[:offset], raw[offset:]], max_header_bytes=1500) == expected, offset
    for writes in _splits(raw, seed=7, count=50):
        assert _answer(loop, writes, max_header_bytes=1500) == expected


def test_url_over_its_limit_is_414_at_every_split(loop):
    raw = b"GET /" + b"u" * 300 + b" HTTP/1.1\r\nHost: x\r\n\r\n"
    for offset in range(1, len(raw)):
        got = _answer(loop, [raw[:offset], raw[offset:]], max_url_bytes=256, max_header_bytes=1024)
        assert got == ([(414, b"request URL exceeds 256 bytes")], True), offset


def test_head_that_never_ends_is_431_once_past_the_limit(loop):
    conn, transport, _, _ = connect(loop, max_header_bytes=1024)
    conn.data_received(b"GET / HTTP/1.1\r\nHost: x\r\nX-Endless: ")
    for _ in range(1024):
        if transport.is_done:
            break
        conn.data_received(b"y")
    [(status, _, _)] = parse_responses(transport.out)
    assert status == 431 and transport.is_done


# -- Host and version ----------------------------------------------------------

@pytest.mark.parametrize("raw, status", [
    (b"GET /a HTTP/1.1\r\n\r\n", 400),
    (b"GET /a HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n", 400),
    (b"GET /a HTTP/1.1\r\nHost: x\r\nhost: x\r\n\r\n", 400),
    (b"GET /a HTTP/1.0\r\nHost: x\r\nHost: x\r\n\r\n", 400),
    (b"GET /a HTTP/1.1\r\nHost: a b\r\n\r\n", 400),
    (b"GET /a HTTP/1.1\r\nHost: x/y\r\n\r\n", 400),
    (b"GET /a HTTP/1.1\r\nHost: \xc3\xa9\r\n\r\n", 400),
    (b"GET /a HTTP/1.0\r\n\r\n", 200),
    (b"GET /a HTTP/1.1\r\nHost:\r\n\r\n", 200),  # empty: allowed (RFC 9112 section 3.2)
    (b"GET /a HTTP/1.1\r\nHost: [::1]:8000\r\n\r\n", 200),
    (b"GET /a HTTP/1.1\r\nHost: example.com:80  \r\n\r\n", 200),
])
def test_host_rules(loop, raw, status):
    [(got, _)], _ = _answer(loop, [raw])
    assert got == status


@pytest.mark.parametrize("raw, status", [
    (b"GET / HTTP/2.0\r\nHost: x\r\n\r\n", 505),
    (b"GET / HTTP/1.2\r\nHost: x\r\n\r\n", 505),
    (b"GET / HTTP/9.9\r\n\r\n", 505),
    (b"GET /\r\n\r\n", 505),  # HTTP/0.9
    (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 505),  # HTTP/2 with prior knowledge
    (b"GET / HTTP/x.1\r\n\r\n", 400),
    (b"GET / HTTX/1.1\r\n\r\n", 400),
])
def test_versions_other_than_1_0_and_1_1(loop, raw, status):
    [(got, _)], is_done = _answer(loop, [raw])
    assert got == status and is_done


def test_absolute_form_target_without_path_is_root(loop):
    assert _answer(loop, [b"GET http://x HTTP/1.1\r\nHost: x\r\n\r\n"]) == ([(200, b"GET / 0:")], False)


# -- refusals decided from the head ------------------------------------------

def test_refusal_is_sent_before_the_declared_body(loop):
    conn, transport, app, clock = connect(loop)
    conn.data_received(b"POST /reject HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n")
    [(status, headers, body)] = parse_responses(transport.out)
    assert (status, body) == (429, b"busy") and headers[b"connection"] == b"close"
    assert transport.eof_written and not transport.closing  # half-closed: lingering
    n = len(transport.out)
    conn.data_received(b"x" * 50000)  # the body, dropped
    conn.data_received(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n")  # not parsed: framing is lost
    assert len(transport.out) == n and app.heads == ["/reject"]
    clock.now += LINGER_IDLE_S + 0.1
    conn.on_tick(clock.now)
    assert transport.closing


@pytest.mark.parametrize("rest", [b"", b"5\r\nhel"], ids=["no-chunk", "part-chunk"])
def test_refusal_of_chunked_request_is_sent_before_its_body(loop, rest):
    conn, transport, _, _ = connect(loop)
    conn.data_received(b"POST /reject HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + rest)
    [(status, headers, _)] = parse_responses(transport.out)
    assert status == 429 and headers[b"connection"] == b"close" and transport.eof_written


def test_refusal_waits_for_the_response_ahead_of_it(loop):
    conn, transport, app, _ = connect(loop)
    app.gate = asyncio.Event()
    conn.data_received(b"GET /later HTTP/1.1\r\nHost: x\r\n\r\n"
                       b"POST /reject HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n")
    assert transport.out == b""
    app.gate.set()
    settle(loop)
    got = parse_responses(transport.out)
    assert [s for s, _, _ in got] == [200, 429] and transport.eof_written


def test_lingering_close_ends_when_the_client_closes(loop):
    conn, transport, _, _ = connect(loop)
    conn.data_received(b"POST /reject HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n")
    assert conn.eof_received() is None  # asyncio then closes the transport
    conn.connection_lost(None)
    assert conn.is_lost


# -- protocol upgrades are declined ------------------------------------------

def test_upgrade_request_is_answered_in_http11_and_parsing_goes_on(loop):
    raw = (b"GET /a HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
           b"HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\n")
    assert _answer(loop, [raw]) == ([(200, b"GET /a 0:"), (200, b"GET /b 0:")], False)


def test_upgrade_request_with_a_body_is_400(loop):
    raw = b"POST /a HTTP/1.1\r\nHost: x\r\nConnection: upgrade\r\nUpgrade: h2c\r\nContent-Length: 3\r\n\r\nabc"
    [(status, _)], is_done = _answer(loop, [raw])
    assert status == 400 and is_done


# -- odd input -----------------------------------------------------------------

@pytest.mark.parametrize("raw, status", [
    (b"GET / HTTP/1.1\r\nHost: x\r\nX\xff: 1\r\n\r\n", 400),  # invalid byte in a field name
    (b"GET / HTTP/1.1\r\nHost: x\r\nX: \x7f\r\n\r\n", 400),  # DEL in a field value
    (b"GET /caf\xc3\xa9 HTTP/1.1\r\nHost: x\r\n\r\n", 400),  # raw non-ASCII in the target
    (b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999999\r\n\r\n", 400),
    (b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + b"f" * 40 + b"\r\n", 400),
    (b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", 400),  # not chunked last
    (b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloXX0\r\n\r\n", 400),
])
def test_odd_input_is_refused_and_closed(loop, raw, status):
    [(got, _)], is_done = _answer(loop, [raw])
    assert got == status and is_done


def test_chunk_extension_is_ignored(loop):
    raw = b"POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5;name=value;x\r\nhello\r\n0\r\n\r\n"
    assert _answer(loop, [raw]) == ([(200, b"POST /c 5:hello")], False)


def test_trailer_fields_are_not_request_headers(loop):
    conn, transport, app, _ = connect(loop)
    seen = []
    app.handle = lambda request, conn: seen.append(request.headers) or app.error_response(200, "ok")
    conn.data_received(b"POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                       b"1\r\na\r\n0\r\nX-Trailer: t\r\n\r\n")
    assert [name for name, _ in seen[0]] == [b"host", b"transfer-encoding"]


def test_overlong_chunk_size_line_is_413(loop):
    conn, transport, _, _ = connect(loop)
    conn.data_received(b"POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
    for _ in range(MAX_CHUNK_LINE_BYTES // 1024 + 1):
        if transport.is_done:
            break
        conn.data_received(b"0" * 1024)  # leading zeros: a chunk-size line that never ends
    [(status, _, _)] = parse_responses(transport.out)
    assert status == 413 and transport.is_done


def test_head_that_never_completes_is_408(loop):
    conn, transport, _, clock = connect(loop, request_timeout_s=3.0)
    conn.data_received(b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: abc")
    clock.now += 3.5
    conn.on_tick(clock.now)
    [(status, headers, _)] = parse_responses(transport.out)
    assert status == 408 and headers[b"connection"] == b"close" and transport.closing


def test_garbage_after_a_pending_response_is_answered_after_it(loop):
    conn, transport, app, _ = connect(loop)
    app.gate = asyncio.Event()
    conn.data_received(b"GET /later HTTP/1.1\r\nHost: x\r\n\r\n\x00\x01 NOT HTTP\r\n\r\n")
    conn.data_received(b"more garbage")  # ignored: the parser has failed
    assert transport.out == b"" and not transport.is_done
    app.gate.set()
    settle(loop)
    got = parse_responses(transport.out)
    assert [s for s, _, _ in got] == [200, 400] and transport.is_done


def test_no_traceback_for_odd_input_but_one_for_a_bug(loop, caplog):
    caplog.set_level(logging.DEBUG, logger="flare.server")
    odd = [b"GET /\x01 HTTP/1.1\r\n\r\n", b"GET / HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n",
           b"GET http://x HTTP/1.1\r\nHost: x\r\n\r\n", b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n",
           b"CONNECT x:443 HTTP/1.1\r\nHost: x:443\r\n\r\n", b"\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n"]
    for raw in odd:
        _answer(loop, [raw])
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records]
    [(status, _)], is_done = _answer(loop, [b"GET /bug HTTP/1.1\r\nHost: x\r\n\r\n"], app=EchoApp())
    assert status == 500 and is_done
    assert [r.getMessage() for r in caplog.records if r.exc_info] == ["HTTP parser callback failed"]
