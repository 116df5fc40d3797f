"""HttpConnection bytes in, bytes out: no sockets, a fake transport and clock."""

from __future__ import annotations

import asyncio
import re

import pytest
from protocol_harness import connect, parse_responses, settle

from flare.server.protocol import MAX_PIPELINE


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def test_keep_alive_serves_sequential_requests(loop):
    conn, transport, app, _ = connect(loop)
    conn.data_received(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
    conn.data_received(b"GET /b HTTP/1.1\r\nHost: x\r\n\r\n")
    got = parse_responses(transport.out)
    assert [(s, b) for s, _, b in got] == [(200, b"GET /a 0:"), (200, b"GET /b 0:")]
    assert all(b"connection" not in h for _, h, _ in got)
    assert not transport.closing
    assert app.released == 2


def test_pipelined_requests_answer_in_order(loop):
    conn, transport, app, _ = connect(loop)
    app.gate = asyncio.Event()
    conn.data_received(b"GET /later HTTP/1.1\r\nHost: x\r\n\r\n"
                       b"POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc"
                       b"GET /c HTTP/1.1\r\nHost: x\r\n\r\n")
    assert transport.out == b""  # /later holds the line; nothing may overtake it
    app.gate.set()
    settle(loop)
    got = parse_responses(transport.out)
    assert [b for _, _, b in got] == [b"GET /later 0:", b"POST /p 3:abc", b"GET /c 0:"]


def test_pipeline_depth_pauses_reading(loop):
    conn, transport, app, _ = connect(loop)
    app.gate = asyncio.Event()
    conn.data_received(b"GET /later HTTP/1.1\r\nHost: x\r\n\r\n" + b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n" * MAX_PIPELINE)
    assert not transport.reading
    app.gate.set()
    settle(loop)
    assert transport.reading
    assert len(parse_responses(transport.out)) == MAX_PIPELINE + 1


def test_chunked_request_body_is_reassembled(loop):
    conn, transport, _, _ = connect(loop)
    conn.data_received(b"POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
    conn.data_received(b"6\r\n world\r\n0\r\n\r\n")
    [(status, _, body)] = parse_responses(transport.out)
    assert (status, body) == (200, b"POST /c 11:hello world")


def test_content_length_over_limit_is_413_before_body(loop):
    conn, transport, app, _ = connect(loop, max_body_bytes=10)
    conn.data_received(b"POST /big HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\n\r\n")
    [(status, headers, body)] = parse_responses(transport.out)
    assert status == 413 and b"11 bytes" in body
    assert headers[b"connection"] == b"close" and transport.is_done
    assert app.heads == []  # the app never saw it


def test_chunked_body_over_limit_is_413(loop):
    conn, transport, _, _ = connect(loop, max_body_bytes=8)
    conn.data_received(b"POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
    assert transport.out == b""
    conn.data_received(b"5\r\nworld\r\n")
    [(status, _, _)] = parse_responses(transport.out)
    assert status == 413 and transport.is_done


def test_early_response_discards_body_and_keeps_connection(loop):
    conn, transport, app, _ = connect(loop)
    conn.data_received(b"POST /reject HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nbody")
    conn.data_received(b"GET /next HTTP/1.1\r\nHost: x\r\n\r\n")
    got = parse_responses(transport.out)
    assert [(s, b) for s, _, b in got] == [(429, b"busy"), (200, b"GET /next 0:")]
    assert not transport.closing


@pytest.mark.parametrize("raw", [
    b"GARBAGE\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    # Both framings at once: the request-smuggling shape.
    b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nX: a\x00b\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nX: a\r\n folded\r\n\r\n",
    b"GET /\x01 HTTP/1.1\r\nHost: x\r\n\r\n",
])
def test_malformed_requests_get_400_and_close(loop, raw):
    conn, transport, _, _ = connect(loop)
    conn.data_received(raw)
    [(status, headers, _)] = parse_responses(transport.out)
    assert status == 400 and headers[b"connection"] == b"close" and transport.is_done


def test_malformed_after_good_request_still_answers_first(loop):
    conn, transport, _, _ = connect(loop)
    conn.data_received(b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\nNOT HTTP AT ALL\r\n\r\n")
    got = parse_responses(transport.out)
    assert [s for s, _, _ in got] == [200, 400]
    assert transport.is_done


def test_url_limit_is_414(loop):
    conn, transport, _, _ = connect(loop, max_url_bytes=32)
    conn.data_received(b"GET /" + b"a" * 40 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    [(status, _, _)] = parse_responses(transport.out)
    assert status == 414 and transport.is_done


def test_header_limit_is_431_even_when_trickled(loop):
    conn, transport, _, _ = connect(loop, max_header_bytes=256, max_url_bytes=64)
    conn.data_received(b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: ")
    for _ in range(40):
        if transport.is_done:
            break
        conn.data_received(b"y" * 16)  # one header value that never ends
    [(status, _, _)] = parse_responses(transport.out)
    assert status == 431 and transport.is_done


def test_many_headers_over_limit_is_431(loop):
    conn, transport, _, _ = connect(loop, max_header_bytes=256)
    conn.data_received(b"GET / HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-H%d: v\r\n" % i for i in range(40)) + b"\r\n")
    [(status, _, _)] = parse_responses(transport.out)
    assert status == 431


def test_slow_client_gets_408(loop):
    conn, transport, app, clock = connect(loop, request_timeout_s=5.0)
    conn.data_received(b"POST /slow HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nab")
    clock.now += 4.0
    conn.on_tick(clock.now)
    assert transport.out == b""
    clock.now += 1.5
    conn.on_tick(clock.now)
    [(status, _, _)] = parse_responses(transport.out)
    assert status == 408 and transport.closing
    conn.connection_lost(None)
    assert app.released == 1  # the partly read request gave its permit back


def test_idle_keep_alive_connection_closes_silently(loop):
    conn, transport, _, clock = connect(loop, keepalive_timeout_s=2.0)
    conn.data_received(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
    n = len(transport.out)
    clock.now += 1.0
    conn.on_tick(clock.now)
    assert not transport.closing
    clock.now += 1.5
    conn.on_tick(clock.now)
    assert transport.closing and len(transport.out) == n


def test_connection_that_never_sends_times_out(loop):
    conn, transport, _, clock = connect(loop, request_timeout_s=3.0)
    clock.now += 3.5
    conn.on_tick(clock.now)
    assert transport.closing and transport.out == b""


def test_http10_closes_after_response(loop):
    conn, transport, _, _ = connect(loop)
    conn.data_received(b"GET /a HTTP/1.0\r\n\r\n")
    [(status, headers, _)] = parse_responses(transport.out)
    assert status == 200 and headers[b"connection"] == b"close" and transport.closing


def test_connection_close_header_is_honoured(loop):
    conn, transport, _, _ = connect(loop)
    conn.data_received(b"GET /a HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert transport.closing


def test_expect_continue(loop):
    conn, transport, _, _ = connect(loop)
    conn.data_received(b"POST /e HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n")
    assert transport.out == b"HTTP/1.1 100 Continue\r\n\r\n"
    conn.data_received(b"hi")
    assert transport.out.endswith(b"POST /e 2:hi")


def test_stream_is_chunked_and_connection_reusable(loop):
    conn, transport, _, _ = connect(loop)
    conn.data_received(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\nGET /after HTTP/1.1\r\nHost: x\r\n\r\n")
    settle(loop)
    got = parse_responses(transport.out)
    assert got[0][0] == 200 and got[0][1][b"content-type"] == b"text/event-stream"
    assert got[0][2] == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"
    assert got[1][2] == b"GET /after 0:"


def test_stream_waits_for_slow_reader(loop):
    conn, transport, _, _ = connect(loop)
    conn.pause_writing()
    conn.data_received(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
    settle(loop)
    assert transport.out.count(b"data:") == 1  # wrote one event, then waited
    conn.resume_writing()
    settle(loop)
    assert parse_responses(transport.out)[0][2].count(b"data:") == 3


def test_disconnect_mid_request_runs_callbacks_and_releases(loop):
    conn, transport, app, _ = connect(loop)
    app.gate = asyncio.Event()
    called = []
    conn.data_received(b"GET /later HTTP/1.1\r\nHost: x\r\n\r\nGET /queued HTTP/1.1\r\nHost: x\r\n\r\n")
    conn.add_disconnect_callback(lambda: called.append(1))
    conn.connection_lost(None)
    assert called == [1]
    assert app.released == 1  # the queued request; the active one releases when its task ends
    app.gate.set()
    settle(loop)
    assert app.released == 2


def test_head_request_has_no_body(loop):
    conn, transport, _, _ = connect(loop)
    conn.data_received(b"HEAD /h HTTP/1.1\r\nHost: x\r\n\r\n")
    head = bytes(transport.out)
    assert head.endswith(b"\r\n\r\n") and re.search(rb"content-length: \d+", head)


def test_shutdown_closes_idle_and_finishes_active(loop):
    conn, transport, app, _ = connect(loop)
    app.gate = asyncio.Event()
    conn.data_received(b"GET /later HTTP/1.1\r\nHost: x\r\n\r\n")
    conn.shutdown()
    assert not transport.closing
    app.gate.set()
    settle(loop)
    [(status, headers, _)] = parse_responses(transport.out)
    assert status == 200 and headers[b"connection"] == b"close" and transport.closing
