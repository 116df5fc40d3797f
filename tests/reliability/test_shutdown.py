"""SIGTERM/SIGINT under load: every stream ends with a terminal event, queued requests get 503."""

from __future__ import annotations

import http.client
import json
import signal
import threading
import time

import pytest
from server_harness import launch

HINT = "raise --max-active"


def _chat(served, max_tokens: int, *, stream: bool, result: dict) -> None:
    """One chat request read to its end into ``result`` (run on a thread)."""
    host, port = served.host_port
    conn = http.client.HTTPConnection(host, port, timeout=120)
    body = json.dumps({"model": served.model, "messages": [{"role": "user", "content": "Talk for a while."}],
                       "max_tokens": max_tokens, "stream": stream, "ignore_eos": True})
    try:
        conn.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        result["status"] = response.status
        result["at"] = time.monotonic()
        result["body"] = response.read()
        result["clean"] = True
    except (http.client.IncompleteRead, ConnectionError) as exc:
        result["clean"] = False
        result["error"] = repr(exc)
    finally:
        result["done"] = time.monotonic()


def _events(body: bytes) -> list[str]:
    return [e for e in body.decode().split("\n\n") if e]


def assert_stream_ended(result: dict) -> str:
    """A 200 stream whose last event is a finish ([DONE]) or a shutdown error event."""
    assert result.get("clean"), result
    assert result["status"] == 200, result
    events = _events(result["body"])
    last = events[-1]
    if last == "data: [DONE]":
        finish = json.loads(events[-2].removeprefix("data: "))
        assert finish["choices"][0]["finish_reason"] in ("stop", "length")
        return "finished"
    assert last.startswith("event: error\ndata: "), events[-3:]
    error = json.loads(last.split("data: ", 1)[1])["error"]
    assert error["code"] == "shutting_down" and "shutting down" in error["message"], error
    return "ended"


def _start(served, count: int, max_tokens: int, *, stream: bool = True) -> list[tuple[threading.Thread, dict]]:
    out = []
    for _ in range(count):
        result: dict = {}
        thread = threading.Thread(target=_chat, args=(served, max_tokens), kwargs={"stream": stream, "result": result},
                                  daemon=True)
        thread.start()
        out.append((thread, result))
    return out


def _wait_started(running: list[tuple[threading.Thread, dict]], timeout: float = 60.0) -> None:
    """Until every response has started (its head is sent with the first token)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all("status" in result for _, result in running):
            assert all(result["status"] == 200 for _, result in running)
            return
        time.sleep(0.02)
    raise AssertionError("requests did not start")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_under_load_ends_streams_and_answers_queued_requests(engine_kind, signum):
    served = launch(engine_kind, subprocess_mode=True, max_active=2, tokens_per_s=20, shutdown_grace_s=1.0,
                    capacity_hint=HINT)
    max_tokens = 3000 if engine_kind == "fake" else 1000
    running = _start(served, 2, max_tokens)
    _wait_started(running)
    queued = _start(served, 2, 8, stream=True) + _start(served, 1, 8, stream=False)
    time.sleep(0.5)  # the queued ones reach the model's queue
    signalled = time.monotonic()
    served.process.send_signal(signum)
    assert served.process.wait(30) == 0
    for thread, _ in running + queued:
        thread.join(10)
    for _, result in queued:
        assert result.get("clean") and result["status"] == 503, result
        error = json.loads(result["body"])["error"]
        assert error["code"] == "shutting_down" and HINT in error["message"], error
        assert result["at"] - signalled < 0.9, "queued requests are answered at the signal, not after the grace"
    assert [assert_stream_ended(result) for _, result in running] == ["ended", "ended"]
    log = "".join(served.stderr_lines)
    assert "Traceback" not in log, log


def test_second_signal_shortens_the_grace_and_still_ends_streams(engine_kind):
    served = launch(engine_kind, subprocess_mode=True, max_active=2, tokens_per_s=20, shutdown_grace_s=60.0)
    running = _start(served, 2, 3000 if engine_kind == "fake" else 1000)
    _wait_started(running)
    started = time.monotonic()
    served.process.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    served.process.send_signal(signal.SIGINT)
    assert served.process.wait(30) == 0
    assert time.monotonic() - started < 15, "the second signal must end the 60 s grace period"
    for thread, result in running:
        thread.join(10)
        assert assert_stream_ended(result) == "ended"
    assert "Traceback" not in "".join(served.stderr_lines)


def test_responses_inside_the_grace_finish_normally(engine_kind):
    served = launch(engine_kind, subprocess_mode=True, max_active=2, tokens_per_s=50, shutdown_grace_s=20.0)
    running = _start(served, 2, 12)
    _wait_started(running)
    served.process.send_signal(signal.SIGTERM)
    assert served.process.wait(60) == 0
    for thread, result in running:
        thread.join(10)
        assert assert_stream_ended(result) == "finished"


def test_closing_an_embedded_session_returns_to_idle():
    """Server.start + close() under load: streams end, and nothing is held afterwards."""
    served = launch("fake", max_active=2, tokens_per_s=20, shutdown_grace_s=0.3)
    running = _start(served, 2, 3000)
    _wait_started(running)
    served.stop()
    for thread, result in running:
        thread.join(10)
        assert assert_stream_ended(result) == "ended"
    snapshot = served.session.snapshot()
    assert snapshot.http_admitted == 0 and snapshot.slots_live == 0
