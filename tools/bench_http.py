"""HTTP server benchmark: Flare's server next to uvicorn in the same run.

Both servers run as subprocesses on this machine with the same load source
(flare.testing.flood_engine.FloodEngine: FakeEngine's prompts, token events as fast as
one thread makes them, so the engine is never what is measured) behind the same Engine
interface; the reference is uvicorn with httptools + uvloop serving a raw ASGI
app that answers the same routes with the same bytes (the ASGI app streams
one ``http.response.body`` message per SSE event, as ASGI frameworks do, and
renders the prompt inline where Flare uses its frontend worker pool).

Figures, for each server:
- requests/s for GET /health and GET /v1/models over 64 keep-alive connections;
- SSE events/s: concurrent streaming chat completions (ignore_eos, fixed
  max_tokens), counting ``data:`` events received by the client.

The load generators are uvloop processes with raw protocols (no HTTP client
library). The server is pinned to one CPU and the load generators to the
others, and each figure is also given per CPU-second of the server process
(``*_per_cpu_s``, from /proc), which stays meaningful when the machine is
shared and the wall-clock rate is limited by the client or by neighbours. The
last line printed is one JSON object.

    python tools/bench_http.py [--seconds 3] [--connections 64] [--streams 32]
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import uvloop

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

LISTEN = re.compile(rb"(?:Flare listening on|Uvicorn running on) http://([\d.]+):(\d+)")
CHAT_BODY = {"model": "flare-test/fake-model", "messages": [{"role": "user", "content": "benchmark"}],
             "stream": True, "ignore_eos": True}


# -- the reference: uvicorn + a raw ASGI app over the same fake engine ----------------------

def uvicorn_main(port: int) -> None:
    """Serve the reference ASGI app (runs in the reference subprocess)."""
    import uvicorn

    from flare.request import ErrorEvent, FinishEvent, TokenEvent
    from flare.server.api.openai.schema import parse_chat
    from flare.server.stream import EventDispatcher, EventStream
    from flare.testing.fake_engine import FakeEngineConfig
    from flare.testing.flood_engine import FloodEngine

    engine = FloodEngine(FakeEngineConfig(max_active=64, max_pending=1024))
    card = {"id": engine.card.id, "object": "model", "created": engine.card.created, "owned_by": "flare",
            "root": engine.card.identifier, "parent": None, "max_model_len": engine.card.max_model_len,
            "capabilities": list(engine.card.capabilities), "aliases": []}
    models_body = json.dumps({"object": "list", "data": [card]}, separators=(",", ":")).encode()
    health_body = b'{"status":"ok"}'
    json_headers = [(b"content-type", b"application/json")]
    dispatcher = None

    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        path = scope["path"]
        if path in ("/health", "/v1/models"):
            body = health_body if path == "/health" else models_body
            await send({"type": "http.response.start", "status": 200,
                        "headers": json_headers + [(b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        gen = parse_chat(json.loads(b"".join(chunks)), engine.generation_defaults)
        prompt = engine.prepare_chat(gen.messages, tools=gen.tools, options=gen.chat_options)
        params = gen.sampling_params(len(prompt), engine.context_len)
        nonlocal dispatcher
        if dispatcher is None:
            dispatcher = EventDispatcher(asyncio.get_running_loop())
        stream = EventStream(dispatcher)
        ticket = engine.submit(prompt, params, stream.sink)
        head = (b'data: {"id":"chatcmpl-ref","object":"chat.completion.chunk","created":%d,"model":"%s",'
                % (int(time.time()), engine.card.id.encode()))
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]})
        await send({"type": "http.response.body", "more_body": True,
                    "body": head + b'"choices":[{"index":0,"delta":{"role":"assistant","content":""},'
                                   b'"logprobs":null,"finish_reason":null}]}\n\n'})
        try:
            while True:
                batch = await stream.next_batch()
                for event in batch:
                    if isinstance(event, TokenEvent):
                        body = (head + b'"choices":[{"index":0,"delta":{"content":'
                                + json.encoder.encode_basestring(event.text).encode()
                                + b'},"logprobs":null,"finish_reason":null}]}\n\n')
                        await send({"type": "http.response.body", "body": body, "more_body": True})
                    elif isinstance(event, (FinishEvent, ErrorEvent)):
                        reason = event.reason if isinstance(event, FinishEvent) else "error"
                        await send({"type": "http.response.body", "more_body": False,
                                    "body": head + b'"choices":[{"index":0,"delta":{},"logprobs":null,'
                                                   b'"finish_reason":"%s"}]}\n\ndata: [DONE]\n\n' % reason.encode()})
                        return
        finally:
            if not stream.is_terminal_received:
                ticket.cancel()

    uvicorn.run(app, host="127.0.0.1", port=port, loop="uvloop", http="httptools", log_level="info",
                access_log=False, lifespan="on", backlog=4096, timeout_keep_alive=75)


# -- load generation -------------------------------------------------------------------------

class _RequestLoop(asyncio.Protocol):
    """Sends one request, waits for its response, repeats (keep-alive, no pipelining)."""

    def __init__(self, request: bytes, counts: list[int]):
        self.request = request
        self.counts = counts

    def connection_made(self, transport):
        self.transport = transport
        transport.write(self.request)

    def data_received(self, data):
        # Responses here fit in one read; a status line marks each one.
        n = data.count(b"HTTP/1.1 ")
        if n:
            self.counts[0] += n
            self.transport.write(self.request)


class _StreamLoop(asyncio.Protocol):
    """Repeats one streaming request, counting SSE data events."""

    def __init__(self, request: bytes, counts: list[int]):
        self.request = request
        self.counts = counts
        self.tail = b""

    def connection_made(self, transport):
        self.transport = transport
        transport.write(self.request)

    def data_received(self, data):
        data = self.tail + data
        self.counts[0] += data.count(b"data: ")
        self.tail = data[-12:] if not data.endswith(b"\n") else b""
        if self.tail:
            self.counts[0] -= self.tail.count(b"data: ")  # counted again with the next read
        if b"data: [DONE]" in data:
            self.counts[1] += 1
            self.tail = b""
            self.transport.write(self.request)


async def _measure(host: str, port: int, protocol_factory, num_connections: int, seconds: float,
                   warmup: float) -> tuple[float, int]:
    """(events/s in the window after warmup, events over the whole run)."""
    loop = asyncio.get_running_loop()
    counts = [0, 0]
    transports = []
    for _ in range(num_connections):
        transport, _ = await loop.create_connection(lambda: protocol_factory(counts), host, port)
        transports.append(transport)
    await asyncio.sleep(warmup)
    start_count, start = counts[0], time.perf_counter()
    await asyncio.sleep(seconds)
    rate = (counts[0] - start_count) / (time.perf_counter() - start)
    total = counts[0]
    for transport in transports:
        transport.close()
    await asyncio.sleep(0.2)
    return rate, total


def _get(path: str, host: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()


def _post_stream(host: str, max_tokens: int) -> bytes:
    body = json.dumps({**CHAT_BODY, "max_tokens": max_tokens}).encode()
    return (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def _client_job(job: tuple[str, int, str, int, int, float, float]) -> tuple[float, int]:
    """One load-generator process: its share of the connections, its own loop."""
    host, port, kind, num_connections, tokens, seconds, warmup = job
    if kind == "sse":
        request = _post_stream(host, tokens)
        factory = lambda counts: _StreamLoop(request, counts)  # noqa: E731
    else:
        request = _get(kind, host)
        factory = lambda counts: _RequestLoop(request, counts)  # noqa: E731
    return uvloop.run(_measure(host, port, factory, num_connections, seconds, warmup))


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux /proc), threads included."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _probe(host: str, port: int, kind: str, tokens: int) -> None:
    """One request of ``kind`` first: a server that answers it with an error would be timed
    at its error rate (or, for streams, at 0 events/s: the loops wait for a [DONE])."""
    import http.client

    conn = http.client.HTTPConnection(host, port, timeout=30)
    if kind == "sse":
        conn.request("POST", "/v1/chat/completions", body=json.dumps({**CHAT_BODY, "max_tokens": tokens}),
                     headers={"Content-Type": "application/json"})
    else:
        conn.request("GET", kind)
    response = conn.getresponse()
    body = response.read()
    conn.close()
    if response.status != 200 or (kind == "sse" and b"data: [DONE]" not in body):
        raise SystemExit(f"bench_http: {kind} answered {response.status}, not a benchmark figure: {body[:500]!r}")


def _bench_server(host: str, port: int, pid: int, args, pool) -> dict[str, float]:
    """Each figure as events/s of wall time and per CPU-second of the server process."""
    results = {}
    for name, kind, total in (("health_rps", "/health", args.connections),
                              ("models_rps", "/v1/models", args.connections),
                              ("sse_events_per_s", "sse", args.streams)):
        _probe(host, port, kind, args.tokens)
        shares = [total // args.clients + (i < total % args.clients) for i in range(args.clients)]
        jobs = [(host, port, kind, n, args.tokens, args.seconds, args.warmup) for n in shares if n]
        cpu_before = _cpu_seconds(pid)
        outcomes = list(pool.map(_client_job, jobs))
        cpu = _cpu_seconds(pid) - cpu_before
        results[name] = sum(rate for rate, _ in outcomes)
        results[name.replace("_per_s", "").replace("_rps", "") + "_per_cpu_s"] = sum(n for _, n in outcomes) / cpu
    return results


def _server_cpus() -> set[int]:
    """The server gets the first CPU; load generators the rest (one core each side at least)."""
    cpus = sorted(os.sched_getaffinity(0))
    return {cpus[0]} if len(cpus) > 1 else set(cpus)


def _client_cpus() -> set[int]:
    cpus = sorted(os.sched_getaffinity(0))
    return set(cpus[1:]) if len(cpus) > 1 else set(cpus)


def _pin_clients() -> None:
    os.sched_setaffinity(0, _client_cpus())


def _start(argv: list[str]) -> tuple[subprocess.Popen, str, int]:
    cpus = _server_cpus()
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            preexec_fn=lambda: os.sched_setaffinity(0, cpus))
    seen = b""
    while True:
        line = proc.stderr.readline()
        if not line:
            raise RuntimeError(f"server failed to start: {' '.join(argv)}\n{seen.decode(errors='replace')}")
        seen += line
        match = LISTEN.search(line)
        if match:
            # Keep reading stderr so the server never blocks on a full pipe.
            import threading
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
            return proc, match.group(1).decode(), int(match.group(2))


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


def _free_port() -> int:
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="measurement window per figure")
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--connections", type=int, default=64, help="keep-alive connections for requests/s")
    parser.add_argument("--streams", type=int, default=32, help="concurrent SSE streams")
    parser.add_argument("--tokens", type=int, default=256, help="max_tokens of each streamed request")
    parser.add_argument("--clients", type=int, default=max(1, min(4, (os.cpu_count() or 2) // 2)),
                        help="load-generator processes (the connections are split among them)")
    parser.add_argument("--uvicorn-app", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.uvicorn_app is not None:
        uvicorn_main(args.uvicorn_app)
        return

    servers = {
        "flare": [sys.executable, "-m", "flare.testing.flood_engine", "--port", "0",
                  "--model-slots", "64", "--model-queue", "1024", "--queue-capacity", "1024",
                  "--log-level", "warning"],
        "uvicorn": [sys.executable, str(Path(__file__).resolve()), "--uvicorn-app", str(_free_port())],
    }
    env_note = (f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs; server pinned to CPU "
                f"{sorted(_server_cpus())}, {args.clients} client process(es) on {sorted(_client_cpus())}")
    figures: dict[str, dict[str, float]] = {}
    with concurrent.futures.ProcessPoolExecutor(args.clients, initializer=_pin_clients) as pool:
        for name, argv in servers.items():
            proc, host, port = _start(argv)
            try:
                figures[name] = _bench_server(host, port, proc.pid, args, pool)
            finally:
                _stop(proc)
    ours, ref = figures["flare"], figures["uvicorn"]
    print(f"# {env_note}; {args.connections} keep-alive connections, {args.streams} SSE streams x "
          f"{args.tokens} tokens, {args.seconds:g} s windows")
    keys = ("health_rps", "models_rps", "sse_events_per_s", "health_per_cpu_s", "models_per_cpu_s",
            "sse_events_per_cpu_s")
    print(f"{'figure':<24}{'flare':>14}{'uvicorn':>14}{'ratio':>9}")
    for key in keys:
        print(f"{key:<24}{ours[key]:>14,.0f}{ref[key]:>14,.0f}{ours[key] / ref[key]:>8.2f}x")
    result = {}
    for key in keys:
        result[key] = round(ours[key], 1)
        result[f"{key}_uvicorn"] = round(ref[key], 1)
        result[f"{key}_ratio"] = round(ours[key] / ref[key], 3)
    print(json.dumps(result))

if __name__ == "__main__":
    main()
