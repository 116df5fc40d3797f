"""Acceptance soak: 1,000 hostile requests and 100 concurrent streams with random disconnects.

Against a subprocess server of each engine kind: every request gets a 4xx or a
clean answer, every stream a clean end (finish, or its client leaving, or a
capacity refusal), /health answers within 100 ms throughout (probed from a
process of its own, so the test's own threads do not count), and afterwards
slots, permits, frontend workers and KV pages are back to idle, the log has no
traceback and the server's RSS is within 10% of what it was after warm-up.
"""

from __future__ import annotations

import collections
import concurrent.futures
import http.client
import json
import random

import pytest
from hostile import MALFORMED_HTTP, HealthProbe, hostile_body, send_raw
from server_harness import launch, metrics, wait_idle

HEALTH_LIMIT_S = 0.100
CLIENT_PATIENCE_S = 20.0  # a hostile client waits this long for an answer, then leaves
def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def hostile_request(served, rng: random.Random) -> int | None:
    """One hostile request of any kind; the status it got (None: no reply, the client left)."""
    host_port = served.host_port
    roll = rng.random()
    if roll < 0.12:
        return send_raw(host_port, rng.choice(MALFORMED_HTTP))
    if roll < 0.17:  # a declared body beyond the limit: refused from the head
        return send_raw(host_port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                                   b"\r\nContent-Length: 900000000\r\n\r\n{")
    route, body = hostile_body(rng, served.model)
    conn = http.client.HTTPConnection(*host_port, timeout=CLIENT_PATIENCE_S)
    try:
        conn.request("POST", route, body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        if response.status == 200 and (rng.random() < 0.5 or response.getheader("content-type", "").startswith(
                "text/event-stream")):
            return 200  # leave without reading: a disconnect mid-response
        payload = response.read()
        if response.status >= 400:
            error = json.loads(payload)["error"]
            assert set(error) == {"message", "type", "param", "code"}, error
            if response.status == 503:  # overload: the model's admission queue is full
                assert error["code"] == "capacity_exhausted", error
        return response.status
    except TimeoutError:
        return None  # a long prompt on a busy CPU: this client gives up, which is hostile too
    finally:
        conn.close()


def stream_request(served, rng: random.Random) -> str:
    """A streamed chat read to its end, or left after a random number of events."""
    conn = http.client.HTTPConnection(*served.host_port, timeout=300)
    body = {"model": served.model, "messages": [{"role": "user", "content": f"Tell me about {rng.random()}"}],
            "max_tokens": rng.randrange(2, 24), "stream": True, "temperature": rng.choice([0, 0.7])}
    leave_after = rng.choice([None, None, 0, 1, 3, 8])
    try:
        conn.request("POST", "/v1/chat/completions", body=json.dumps(body),
                     headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        if response.status in (429, 503):
            assert json.loads(response.read())["error"]["code"]
            return "refused"
        assert response.status == 200, response.status
        if leave_after is not None:
            for _ in range(leave_after):
                response.fp.readline()
            return "left"
        events = [e for e in response.read().decode().split("\n\n") if e]
        assert events[-1] == "data: [DONE]", events[-3:]
        assert json.loads(events[-2].removeprefix("data: "))["choices"][0]["finish_reason"] in ("stop", "length")
        return "finished"
    finally:
        conn.close()


@pytest.fixture(scope="module")
def soak_server(engine_kind):
    server = launch(engine_kind, subprocess_mode=True, max_active=8, tokens_per_s=100, queue_capacity=120)
    yield server
    server.stop()


def test_hostile_traffic_and_disconnecting_streams(soak_server):
    served = soak_server
    pid = served.process.pid
    idle_pages = metrics(served).get("flare_pages_reusable")
    rng = random.Random(17)
    with concurrent.futures.ThreadPoolExecutor(16) as pool, concurrent.futures.ThreadPoolExecutor(100) as clients:
        # Warm-up: the first requests fill allocator pools, caches and worker threads.
        list(pool.map(lambda i: hostile_request(served, random.Random(i)), range(60)))
        list(pool.map(lambda i: stream_request(served, random.Random(1000 + i)), range(12)))
        wait_idle(served)
        rss_start = rss_bytes(pid)
        probe = HealthProbe(served.host_port)
        seeds = [rng.randrange(1 << 30) for _ in range(1100)]
        hostile = [pool.submit(hostile_request, served, random.Random(s)) for s in seeds[:1000]]
        streams = [clients.submit(stream_request, served, random.Random(s)) for s in seeds[1000:]]
        statuses = [f.result(timeout=600) for f in hostile]
        outcomes = [f.result(timeout=600) for f in streams]
    worst, count = probe.stop()
    assert count > 50
    assert worst < HEALTH_LIMIT_S, f"/health took {worst * 1e3:.1f} ms"
    # The 5xx a client can earn: 505 for an HTTP/2 preface (RFC 9110 15.6.6), and 503 when
    # the model's admission queue is full (checked to be that in hostile_request).
    assert all(s is None or s < 500 or s in (503, 505) for s in statuses), sorted(set(statuses), key=str)
    assert sum(s is not None and 400 <= s < 500 for s in statuses) > 500
    assert outcomes.count("finished") >= 20 and outcomes.count("left") >= 20, outcomes
    sample = wait_idle(served, timeout=60)
    if idle_pages is not None:
        assert sample["flare_pages_reusable"] + sample["flare_pages_cached"] == idle_pages, sample
    log = "".join(served.stderr_lines)
    assert "Traceback" not in log and " ERROR " not in log, log[-3000:]
    rss_end = rss_bytes(pid)
    print(f"\nsoak[{served.kind}]: /health worst {worst * 1e3:.1f} ms over {count} probes; statuses "
          f"{sorted(collections.Counter(statuses).items(), key=str)}; streams {collections.Counter(outcomes)}; "
          f"RSS {rss_start / 2**20:.0f} -> {rss_end / 2**20:.0f} MiB")
    assert rss_end <= 1.10 * rss_start, (rss_start, rss_end)
