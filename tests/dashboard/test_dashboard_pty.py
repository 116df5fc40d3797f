"""flare-serve on the demo core under a pseudo-terminal: the dashboard starts after loading,
request rows appear under streaming traffic, Tab and the arrows switch panes and scroll, and
Ctrl-C is the normal shutdown (the streaming response finishes in the grace period, exit 0).
With --no-dashboard the same terminal gets plain logs."""

from __future__ import annotations

import os
import re
import shutil
import sys
import threading
import time

import httpx
import pytest

pexpect = pytest.importorskip("pexpect")

pytestmark = pytest.mark.skipif(os.environ.get("FLARE_E2E_DEMO", "1") == "0",
                                reason="the demo engine is off (FLARE_E2E_DEMO=0)")

FLARE_SERVE = shutil.which("flare-serve") or sys.executable
PREFIX = [] if shutil.which("flare-serve") else ["-c", "import sys; from flare.cli import serve_main; "
                                                       "sys.exit(serve_main())"]
ALT_SCREEN = "\x1b[?1049h"
GRACE_S = 20.0  # room for the tail response on a loaded machine (steps of 300 ms were seen)


def spawn(*flags: str, rows: int = 14, cols: int = 100):
    env = {**os.environ, "TERM": "xterm-256color"}
    child = pexpect.spawn(FLARE_SERVE, [*PREFIX, "--host", "127.0.0.1", "--port", "0",
                                        "--kv-memory-bytes", str(512 << 20), *flags],
                          env=env, dimensions=(rows, cols), encoding="utf-8", codec_errors="replace", timeout=300)
    child.expect(r"Flare listening on (http://[0-9.]+:\d+)")
    return child, child.match.group(1)


def stream_chat(url: str, model: str, max_tokens: int, finishes: list, streaming=None) -> None:
    body = {"model": model, "messages": [{"role": "user", "content": "Count from one to fifty."}],
            "max_tokens": max_tokens, "temperature": 0, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=120) as r:
        lines = []
        for line in r.iter_lines():
            if line:
                lines.append(line)
                if streaming is not None and len(lines) == 2:  # a token arrived: it is decoding
                    streaming.set()
    finishes.append(r.status_code == 200 and lines[-1] == "data: [DONE]"
                    and any(re.search(r'"finish_reason":"length"', line) for line in lines))


def model_id(url: str) -> str:
    return httpx.get(url + "/v1/models", timeout=30).json()["data"][0]["id"]


def test_dashboard_under_a_terminal():
    child, url = spawn("--shutdown-grace", str(GRACE_S))
    try:
        child.expect_exact(ALT_SCREEN, timeout=30)  # it starts after loading
        child.expect("prefill tok/s", timeout=30)
        model = model_id(url)
        finishes: list = []
        # more requests than the scheduler pane has rows for at this height, whatever its graph
        # table holds (a loaded machine runs fewer graph shapes, which leaves up to five rows)
        streams = [threading.Thread(target=stream_chat, args=(url, model, 40, finishes)) for _ in range(8)]
        for t in streams:
            t.start()
        child.expect(r"\d+\.\d+ +(?:prefilling|decoding|initializing)", timeout=60)  # request rows appear
        child.send("\t")
        child.expect("Mean ms", timeout=10)  # the scheduler pane
        child.expect(r"(?:decode|prefill) b\d+ t\d+", timeout=10)  # a graph's row
        child.send("\x1b[D")  # Left: back to the overview
        child.expect("generation tok/s", timeout=10)
        child.send("\x1b[C")  # Right: the scheduler pane again
        child.expect("Mean ms", timeout=10)
        child.expect(r"requests 1-[1-7] of 8", timeout=30)  # every request has a row; some are hidden
        child.send("\x1b[B")  # Down: the request rows scroll
        child.expect(r"requests 2-\d of 8", timeout=10)
        child.send("\x1b[A")
        child.expect(r"requests 1-\d of 8", timeout=10)
        for t in streams:
            t.join(120)
        assert finishes == [True] * 8
        # a response still streaming when Ctrl-C arrives finishes inside the grace period
        last: list = []
        streaming = threading.Event()
        tail = threading.Thread(target=stream_chat, args=(url, model, 30, last, streaming))
        tail.start()
        assert streaming.wait(60)
        started = time.monotonic()
        child.sendintr()
        child.expect(pexpect.EOF, timeout=GRACE_S + 25)
        took = time.monotonic() - started
        tail.join(30)
        child.close()
        assert child.exitstatus == 0, child.before
        assert took < GRACE_S + 5, took
        assert last == [True]
        assert "drained; exiting" in child.before  # logs are plain again once the dashboard stops
    finally:
        if child.isalive():
            child.terminate(force=True)


def test_no_dashboard_gives_plain_logs_on_a_terminal():
    child, url = spawn("--no-dashboard")
    try:
        finishes: list = []
        stream_chat(url, model_id(url), 2, finishes)
        assert finishes == [True]
        child.sendintr()
        child.expect(pexpect.EOF, timeout=30)
        child.close()
        assert child.exitstatus == 0
        assert ALT_SCREEN not in child.before and "drained; exiting" in child.before
    finally:
        if child.isalive():
            child.terminate(force=True)


def test_keys_parse_into_pane_and_scroll_steps():
    from flare.dashboard.app import parse_keys

    assert parse_keys(b"\t\x1b[C\x1b[D\x1b[Z") == [(1, 0), (1, 0), (-1, 0), (-1, 0)]
    assert parse_keys(b"\x1b[A\x1b[Bx\x1b[6~\x1bOA") == [(0, -1), (0, 1), (0, 10), (0, -1)]
