"""Auth, capacity (429/503), disconnects and many concurrent streams, through sockets."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import httpx
import pytest
from server_harness import assert_error, get_json, metric, post_json, request

CHAT = {"messages": [{"role": "user", "content": "Tell me a long story"}]}


def _wait_for(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError("condition not reached in time")


def _open_stream(served, body: dict, *, wait: bool = True) -> socket.socket:
    """Start a streaming request on a raw socket and (``wait``) read its first event."""
    host, port = served.host_port
    sock = socket.create_connection((host, port))
    data = json.dumps({"model": served.model, "stream": True, **body}).encode()
    auth = f"Authorization: Bearer {served.api_key}\r\n" if served.api_key else ""
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 + auth.encode() + b"Content-Length: %d\r\n\r\n" % len(data) + data)
    received = b""
    while wait and b"data: " not in received:
        chunk = sock.recv(65536)
        assert chunk, received
        received += chunk
    assert not wait or received.startswith(b"HTTP/1.1 200"), received
    return sock


def test_bearer_auth(launcher):
    served = launcher(api_key="s3cret-key")
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret-key"},
                    {"Authorization": "Bearer s3cret-key-and-more"}):
        status, response_headers, body = request(served, "GET", "/v1/models", headers=headers, auth=False)
        assert_error(status, json.loads(body), 401, "bearer")
        assert response_headers["www-authenticate"] == "Bearer"
        status, _, body = request(served, "POST", "/v1/chat/completions", CHAT, headers=headers, auth=False)
        assert status == 401
    assert request(served, "GET", "/health", auth=False)[0] == 200
    assert request(served, "GET", "/metrics", auth=False)[0] == 200
    assert get_json(served, "/v1/models")[0] == 200
    assert post_json(served, "/v1/chat/completions", {**CHAT, "max_tokens": 4})[0] == 200


def test_no_auth_when_api_key_unset(server):
    status, _, _ = request(server, "GET", "/v1/models", headers={"Authorization": "Bearer anything"})
    assert status == 200


def test_http_capacity_429_then_recovers(launcher):
    served = launcher(max_active=1, queue_capacity=1, capacity_hint="raise --queue-capacity", tokens_per_s=50)
    body = {**CHAT, "max_tokens": 200, "ignore_eos": True}
    # 1 active + 1 waiting for the model slot = the HTTP capacity.
    held = [_open_stream(served, body), _open_stream(served, body, wait=False)]
    _wait_for(lambda: metric(served, "flare_http_admitted") == 2)
    status, headers, raw = request(served, "POST", "/v1/chat/completions", {**CHAT, "max_tokens": 2})
    error = assert_error(status, json.loads(raw), 429, "HTTP admission capacity", "raise --queue-capacity")
    assert error["code"] == "http_capacity_exhausted" and headers["retry-after"] == "1"
    assert metric(served, "flare_http_rejected_total") >= 1
    for sock in held:
        sock.close()
    _wait_for(lambda: metric(served, "flare_http_admitted") == 0)
    assert post_json(served, "/v1/chat/completions", {**CHAT, "max_tokens": 2})[0] == 200


def _slow_body(served, declared: int, sent: bytes) -> socket.socket:
    """A generation request whose head and first body bytes arrive, then nothing more."""
    sock = socket.create_connection(served.host_port)
    auth = f"Authorization: Bearer {served.api_key}\r\n" if served.api_key else ""
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 + auth.encode() + b"Content-Length: %d\r\n\r\n" % declared + sent)
    return sock


def test_slow_bodies_hold_bytes_not_admission_permits(launcher):
    """Clients that send their bodies slowly (more of them than the HTTP capacity) leave every
    permit free; the bodies count against the body budget, which refuses past it (503)."""
    served = launcher(max_active=1, queue_capacity=1, max_body_bytes=4096)  # capacity 2, budget 8,192 bytes
    assert metric(served, "flare_http_body_budget") == 2 * 4096
    slow = [_slow_body(served, 100, b'{"mes') for _ in range(5)]
    _wait_for(lambda: metric(served, "flare_http_body_bytes") == 5 * 5)
    assert metric(served, "flare_http_admitted") == 0
    status, payload = post_json(served, "/v1/chat/completions", {**CHAT, "max_tokens": 2})
    assert status == 200, payload
    # Bodies near the budget: the next body byte past it is refused, and the budget comes back.
    big = [_slow_body(served, 4096, b"x" * 4060), _slow_body(served, 4096, b"x" * 4060)]  # 47 bytes left
    _wait_for(lambda: metric(served, "flare_http_body_bytes") == 5 * 5 + 8120)
    status, _, raw = request(served, "POST", "/v1/chat/completions", {**CHAT, "max_tokens": 2})
    assert_error(status, json.loads(raw), 503, "request bodies")
    assert metric(served, "flare_http_body_refused_total") >= 1
    for sock in slow + big:
        sock.close()
    _wait_for(lambda: metric(served, "flare_http_body_bytes") == 0)
    assert post_json(served, "/v1/chat/completions", {**CHAT, "max_tokens": 2})[0] == 200
    assert metric(served, "flare_http_admitted") == 0


@pytest.mark.fake_only("the model queue is sized by the fake's --model-queue; the runtime's queue is the core's")
def test_model_capacity_503_with_hint(launcher, fake_only):
    # HTTP capacity (1 + 4) exceeds what the fake model admits (1 slot + 1 waiting).
    served = launcher(max_active=1, queue_capacity=4, model_queue=1, capacity_hint="see --max-active",
                      tokens_per_s=50)
    body = {**CHAT, "max_tokens": 200, "ignore_eos": True}
    held = [_open_stream(served, body), _open_stream(served, body, wait=False)]
    _wait_for(lambda: metric(served, "flare_requests_pending") == 1)
    status, headers, raw = request(served, "POST", "/v1/chat/completions", {**CHAT, "max_tokens": 2})
    error = assert_error(status, json.loads(raw), 503, "model admission capacity", "see --max-active")
    assert error["code"] == "capacity_exhausted" and headers["retry-after"] == "1"
    for sock in held:
        sock.close()


def test_disconnect_mid_stream_cancels_and_frees_the_slot(launcher):
    served = launcher(max_active=2, tokens_per_s=50)
    before = metric(served, "flare_requests_cancelled_total")
    sock = _open_stream(served, {**CHAT, "max_tokens": 500, "ignore_eos": True})
    _wait_for(lambda: metric(served, "flare_slots_live") == 1)
    sock.close()
    _wait_for(lambda: metric(served, "flare_requests_cancelled_total") == before + 1)
    _wait_for(lambda: metric(served, "flare_slots_live") == 0 and metric(served, "flare_http_admitted") == 0)
    assert metric(served, "flare_http_disconnects_total") >= 1


def test_disconnect_non_streaming_also_cancels(launcher):
    served = launcher(max_active=2, tokens_per_s=50)
    host, port = served.host_port
    sock = socket.create_connection((host, port))
    data = json.dumps({**CHAT, "max_tokens": 500, "ignore_eos": True}).encode()
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(data) + data)
    _wait_for(lambda: metric(served, "flare_slots_live") == 1)
    sock.close()
    _wait_for(lambda: metric(served, "flare_requests_cancelled_total") == 1)
    _wait_for(lambda: metric(served, "flare_http_admitted") == 0)


@pytest.mark.fake_only("pause/resume is the embedding API of an in-process session")
def test_pause_and_resume_admission(launcher, fake_only):
    served = launcher(tokens_per_s=100)
    session = served.session
    sock = _open_stream(served, {**CHAT, "max_tokens": 30, "ignore_eos": True})
    session.pause_admission()
    status, _, raw = request(served, "POST", "/v1/chat/completions", {**CHAT, "max_tokens": 2})
    assert_error(status, json.loads(raw), 503, "paused")
    assert request(served, "GET", "/v1/models")[0] == 200  # discovery stays open
    snap = session.snapshot()
    assert snap.is_admission_paused and snap.http_admitted == 1 and snap.session_id == session.session_id
    assert session.wait_for_requests(10.0)  # the admitted stream finishes by itself
    assert sock.recv(65536) or True
    sock.close()
    session.resume_admission()
    assert post_json(served, "/v1/chat/completions", {**CHAT, "max_tokens": 2})[0] == 200


def test_200_concurrent_streams_see_only_200_and_429(launcher):
    served = launcher(max_active=8, queue_capacity=24, tokens_per_s=200)
    body = {"model": served.model, "messages": CHAT["messages"], "max_tokens": 16, "stream": True,
            "ignore_eos": True}

    async def one(client: httpx.AsyncClient) -> tuple[int, bool]:
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            payload = b"".join([part async for part in response.aiter_bytes()])
            return response.status_code, payload.endswith(b"data: [DONE]\n\n")

    async def run() -> list[tuple[int, bool]]:
        limits = httpx.Limits(max_connections=250, max_keepalive_connections=250)
        async with httpx.AsyncClient(base_url=served.base_url, limits=limits, timeout=60) as client:
            return await asyncio.gather(*(one(client) for _ in range(200)))

    results = asyncio.run(run())
    statuses = [status for status, _ in results]
    assert set(statuses) <= {200, 429}, statuses
    assert statuses.count(429) > 0 and statuses.count(200) >= 32
    assert all(done for status, done in results if status == 200)
    _wait_for(lambda: metric(served, "flare_http_admitted") == 0)
    assert metric(served, 'flare_http_responses_total{code="429"}') == statuses.count(429)


@pytest.mark.fake_only("needs ~40 MB of events in seconds, beyond a CPU model's speed")
def test_paused_reader_keeps_its_response(launcher, fake_only):
    """A client that stops reading gets its whole response later; the model slot is freed meanwhile."""
    served = launcher(max_active=2, tokens_per_s=0, context_len=32768)
    host, port = served.host_port
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, port))
    # ~40 MB of events: more than the kernel's socket buffers hold.
    body = json.dumps({**CHAT, "max_tokens": 20000, "ignore_eos": True, "stream": True, "logprobs": True,
                       "top_logprobs": 20}).encode()
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    # Generation finishes while almost nothing has been read: the slot is free, the permit is held.
    _wait_for(lambda: metric(served, "flare_requests_completed_total") == 1, timeout=30)
    assert metric(served, "flare_slots_live") == 0 and metric(served, "flare_http_admitted") == 1
    received = bytearray()
    sock.settimeout(30)
    while not received.endswith(b"0\r\n\r\n"):
        chunk = sock.recv(1 << 20)
        assert chunk
        received += chunk
    sock.close()
    text = bytes(received).decode()
    assert text.count('"logprobs":{"content":[') == 20000  # one event per fake token
    assert text.count("data: [DONE]") == 1
    _wait_for(lambda: metric(served, "flare_http_admitted") == 0)
