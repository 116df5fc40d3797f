"""Hostile request material shared by the fault suite: raw JSON fragments and HTTP bytes.

JSON bodies are built as text, so they can hold what no Python value serializes
to: lone surrogate escapes, integers beyond Python's 4,300-digit limit, NaN,
nesting ten thousand deep.
"""

from __future__ import annotations

import json
import random
import socket
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Raw:
    """A JSON text fragment inserted as it is."""

    text: str


def dump(value: Any) -> str:
    """JSON text of ``value``, with Raw fragments inserted verbatim."""
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, dict):
        return "{" + ",".join(f"{dump(k) if isinstance(k, Raw) else json.dumps(k)}:{dump(v)}"
                              for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(dump(v) for v in value) + "]"
    return json.dumps(value)


def _nested(depth: int, inner: str = "1") -> str:
    return "[" * depth + inner + "]" * depth


FRAGMENTS: tuple[Raw, ...] = tuple(Raw(t) for t in (
    '"\\ud800"', '"a\\udfffb"', '"\\ud83d"', '"\\udc00\\ud800"', '"\\ud83d\\ude00"', '"\\u0000"', '"\\u202e"',
    "1" + "0" * 5000, "-" + "9" * 50, "9223372036854775808", "18446744073709551616", "-9223372036854775809",
    "2147483648", "4294967296", "1e999", "-1e400", "1e-400", "NaN", "Infinity", "-Infinity", "0", "-0", "1.5",
    "-1", "true", "false", "null", '""', '" "', "[]", "{}", '"日本語"', '"' + "x" * 100_000 + '"',
    _nested(100), _nested(10_000), '{"a":' * 5000 + "1" + "}" * 5000, _nested(63), '[' + '"\\ud800"' + ']',
    '{"\\ud800": 1}', '{"' + "k" * 5000 + '": 1}', '[1, "a", null, {"b": []}]', '{"type": "text"}',
    '[{"type": "text", "text": "\\udfff"}]', '[{"type": "image_url", "image_url": {"url": "data:,x"}}]',
    '{"role": "user"}', '[' + ",".join(["1"] * 5000) + ']', '"' + "\\u00e9" * 2000 + '"',
))


def lifts_the_output_limit(path: tuple) -> bool:
    """Whether a hostile value at ``path`` may be a valid output limit: a large max_tokens, or
    null (the rest of the context), generates for minutes on a CPU, so such a body is streamed
    and the client leaves after the head (the server must then cancel it)."""
    return bool(path) and path[-1] in ("max_tokens", "max_completion_tokens")


def chat_body(model: str) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "temperature": 0}


def completion_body(model: str) -> dict:
    return {"model": model, "prompt": "Hi", "max_tokens": 1, "temperature": 0}


# Paths into a body where a hostile value goes (a key path; "*" appends an unknown key).
CHAT_PATHS = (
    (), ("model",), ("messages",), ("messages", 0), ("messages", 0, "role"), ("messages", 0, "content"),
    ("messages", 0, "name"), ("messages", 0, "tool_call_id"), ("messages", 0, "tool_calls"),
    ("messages", 0, "reasoning_content"), ("messages", 0, "*"), ("temperature",), ("top_p",), ("top_k",),
    ("min_p",), ("presence_penalty",), ("frequency_penalty",), ("repetition_penalty",), ("seed",), ("stop",),
    ("stop_token_ids",), ("max_tokens",), ("max_completion_tokens",), ("n",), ("logprobs",), ("top_logprobs",),
    ("ignore_eos",), ("stream",), ("stream_options",), ("user",), ("logit_bias",), ("tools",), ("tool_choice",),
    ("parallel_tool_calls",), ("chat_template_kwargs",), ("chat_template_kwargs", "enable_thinking"),
    ("add_generation_prompt",), ("response_format",), ("store",), ("*",),
)
COMPLETION_PATHS = (
    (), ("model",), ("prompt",), ("echo",), ("best_of",), ("suffix",), ("logprobs",), ("max_tokens",),
    ("seed",), ("stop",), ("stop_token_ids",), ("temperature",), ("stream",), ("stream_options",), ("*",),
)
TOOL_CALL_MESSAGE = {"role": "assistant", "content": None,
                     "tool_calls": [{"id": "call_1", "type": "function",
                                     "function": {"name": "f", "arguments": "{}"}}]}
TOOL_PATHS = (("messages", 0, "tool_calls", 0, "id"), ("messages", 0, "tool_calls", 0, "function", "name"),
              ("messages", 0, "tool_calls", 0, "function", "arguments"), ("messages", 0, "tool_calls", 0),
              ("tools", 0, "function", "parameters"), ("tools", 0, "function", "name"), ("tools", 0))


def place(body: dict, path: tuple, value: Any) -> Any:
    """``body`` with ``value`` at ``path`` (the whole body for ())."""
    if not path:
        return value
    out: Any = json.loads(json.dumps(body))
    node = out
    for key in path[:-1]:
        if isinstance(node, dict) and key not in node:
            node[key] = {}
        node = node[key]
    last = path[-1]
    if last == "*":
        node[Raw('"zz_unknown_\\u00e9"')] = value
    else:
        node[last] = value
    return out


def hostile_body(rng: random.Random, model: str) -> tuple[str, bytes]:
    """(route, body bytes) of one hostile generation request."""
    kind = rng.randrange(3)
    if kind == 0:
        route, body, path = "/v1/chat/completions", chat_body(model), rng.choice(CHAT_PATHS)
    elif kind == 1:
        route, body, path = "/v1/completions", completion_body(model), rng.choice(COMPLETION_PATHS)
    else:
        route, body = "/v1/chat/completions", chat_body(model)
        body["messages"] = [TOOL_CALL_MESSAGE, {"role": "user", "content": "Hi"}]
        body["tools"] = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
        path = rng.choice(TOOL_PATHS)
    value = rng.choice(FRAGMENTS)
    if rng.random() < 0.2:
        value = [value, rng.choice(FRAGMENTS)]
    body = place(body, path, value)
    if isinstance(body, dict) and path != ("stream",):
        body["stream"] = lifts_the_output_limit(path) or rng.random() < 0.5
    return route, dump(body).encode("utf-8", "surrogatepass")


MALFORMED_HTTP: tuple[bytes, ...] = (
    b"garbage\r\n\r\n",
    b"GET\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nbad header line\r\n\r\n",
    b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"X-Long: " + b"a" * 70_000 + b"\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n0\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 999999999999\r\n\r\n",
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    b"GET /" + b"a" * 20_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /\x00 HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET / HTTP/1.1\r\nHo\x01st: x\r\n\r\n",
    b"GET /health HTTP/1.1\r\n\r\n",
    b"GET /health HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
    b"\xff\xfe\xfd\r\n\r\n",
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n{\"a\"",  # then close
    b"GET /health HTTP/1.1\r\nHost: x\r\n",  # head never completed, then close
    b"DELETE /v1/models HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /v1/models/%ED%A0%80 HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /v1/models/" + b"%FF" * 100 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
)


def send_raw(host_port: tuple[str, int], data: bytes, *, timeout: float = 10.0) -> int | None:
    """Send bytes, half-close, read the reply; its status (None if the server sent nothing)."""
    with socket.create_connection(host_port, timeout=timeout) as sock:
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the server refused early and closed: read what it said
        chunks = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except (ConnectionResetError, socket.timeout):
                break
            if not chunk:
                break
            chunks.append(chunk)
    reply = b"".join(chunks)
    if not reply:
        return None
    assert reply.startswith(b"HTTP/1."), reply[:100]
    return int(reply.split(b" ", 2)[1])


_PROBE = textwrap.dedent("""
    import http.client, signal, sys, time
    stop = []
    signal.signal(signal.SIGTERM, lambda *args: stop.append(True))
    worst, count = 0.0, 0
    conn = http.client.HTTPConnection(sys.argv[1], int(sys.argv[2]), timeout=10)
    while not stop:
        start = time.monotonic()
        conn.request("GET", "/health")
        response = conn.getresponse()
        response.read()
        assert response.status == 200, response.status
        worst = max(worst, time.monotonic() - start)
        count += 1
        time.sleep(0.01)
    print(worst, count, flush=True)
""")


class HealthProbe:
    """GET /health every 10 ms from a process of its own (the test's own threads do not
    delay it) until :meth:`stop`, which returns the worst latency and the probe count."""

    def __init__(self, host_port: tuple[str, int]):
        self._process = subprocess.Popen([sys.executable, "-c", _PROBE, *map(str, host_port)],
                                         stdout=subprocess.PIPE, text=True)
        time.sleep(0.3)  # connected and measuring before the load starts

    def stop(self) -> tuple[float, int]:
        self._process.terminate()  # the probe stops at SIGTERM and prints its figures
        worst, count = self._process.communicate(timeout=30)[0].split()
        return float(worst), int(count)
