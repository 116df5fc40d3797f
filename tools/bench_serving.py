#!/usr/bin/env python3
"""Serving benchmark client: streaming /v1/completions load against a running server.

Sends N requests with random token-ID prompts (default 1,024 in, 256 out,
ignore_eos so every request generates exactly max_tokens) at a fixed
concurrency over raw keep-alive HTTP/1.1 connections, parses the SSE stream
and reports output tokens/s, TTFT and inter-token latency percentiles. Last
line: one JSON object.

    python tools/bench_serving.py --url http://127.0.0.1:8000 --model NAME \\
        --requests 256 --concurrency 64 --input-len 1024 --output-len 256 --vocab 128000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from urllib.parse import urlsplit


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, int(round(q / 100 * (len(ordered) - 1)))))
    return ordered[k]


class Result:
    __slots__ = ("ttft", "itl", "tokens", "start", "end", "error")

    def __init__(self):
        self.ttft = None
        self.itl: list[float] = []
        self.tokens = 0
        self.start = self.end = 0.0
        self.error = None


async def one_request(host: str, port: int, path: str, body: bytes, headers: str) -> Result:
    result = Result()
    reader, writer = await asyncio.open_connection(host, port)
    try:
        result.start = time.perf_counter()
        writer.write(f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\n{headers}\r\n".encode() + body)
        await writer.drain()
        status_line = await reader.readline()
        status = int(status_line.split()[1])
        chunked = False
        while True:
            line = await reader.readline()
            if line in (b"\r\n", b""):
                break
            if line.lower().startswith(b"transfer-encoding") and b"chunked" in line.lower():
                chunked = True
        if status != 200:
            result.error = f"HTTP {status}"
            return result
        buffer = b""
        last = None
        done = False
        while not done:
            if chunked:
                size_line = await reader.readline()
                size = int(size_line.strip() or b"0", 16)
                if size == 0:
                    break
                data = await reader.readexactly(size + 2)
                buffer += data[:-2]
            else:
                data = await reader.read(65536)
                if not data:
                    break
                buffer += data
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                if not event.startswith(b"data: "):
                    continue
                payload = event[6:]
                if payload == b"[DONE]":
                    done = True
                    break
                now = time.perf_counter()
                message = json.loads(payload)
                if "error" in message:
                    result.error = message["error"].get("message")
                    done = True
                    break
                usage = message.get("usage")
                if usage:
                    result.tokens = usage.get("completion_tokens", result.tokens)
                choices = message.get("choices") or []
                if choices and (choices[0].get("text") or choices[0].get("finish_reason") is None):
                    if result.ttft is None:
                        result.ttft = now - result.start
                    elif last is not None:
                        result.itl.append(now - last)
                    last = now
        result.end = time.perf_counter()
        return result
    finally:
        writer.close()


async def run(args) -> dict:
    url = urlsplit(args.url)
    host, port = url.hostname, url.port or 80
    rng = random.Random(args.seed)
    headers = f"Authorization: Bearer {args.api_key}\r\n" if args.api_key else ""
    bodies = []
    for _ in range(args.requests):
        prompt = [rng.randrange(args.vocab_low, args.vocab) for _ in range(args.input_len)]
        bodies.append(json.dumps({
            "model": args.model, "prompt": prompt, "max_tokens": args.output_len, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
        }).encode())
    queue: asyncio.Queue = asyncio.Queue()
    for body in bodies:
        queue.put_nowait(body)
    results: list[Result] = []

    async def worker():
        while not queue.empty():
            body = queue.get_nowait()
            results.append(await one_request(host, port, "/v1/completions", body, headers))

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(args.concurrency)))
    wall = time.perf_counter() - start
    ok = [r for r in results if r.error is None]
    ttft = [r.ttft for r in ok if r.ttft is not None]
    itl = [x for r in ok for x in r.itl]
    tokens = sum(r.tokens for r in ok)
    return {
        "requests": len(results), "failed": len(results) - len(ok),
        "errors": sorted({r.error for r in results if r.error})[:5],
        "wall_s": round(wall, 3), "output_tokens": tokens,
        "output_tok_s": round(tokens / wall, 1),
        "ttft_p50_ms": round(percentile(ttft, 50) * 1e3, 1), "ttft_p99_ms": round(percentile(ttft, 99) * 1e3, 1),
        "itl_p50_ms": round(percentile(itl, 50) * 1e3, 2), "itl_p99_ms": round(percentile(itl, 99) * 1e3, 2),
        "itl_mean_ms": round(statistics.fmean(itl) * 1e3, 2) if itl else None,
    }


def add_load_arguments(parser: argparse.ArgumentParser) -> None:
    """The load options (defaults: the issue's serving workload), shared with the tools that
    run this client against a server they start (bench_gpu.py, bench_host.py)."""
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--input-len", type=int, default=1024)
    parser.add_argument("--output-len", type=int, default=256)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", required=True)
    parser.add_argument("--api-key", default=None)
    add_load_arguments(parser)
    parser.add_argument("--vocab", type=int, default=128000, help="prompt token IDs are drawn below this")
    parser.add_argument("--vocab-low", type=int, default=1000, help="and at or above this (skips specials)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    result = asyncio.run(run(args))
    print(f"{result['requests']} requests ({result['failed']} failed) in {result['wall_s']} s: "
          f"{result['output_tok_s']} output tok/s, TTFT p50 {result['ttft_p50_ms']} ms p99 {result['ttft_p99_ms']} ms, "
          f"ITL p50 {result['itl_p50_ms']} ms p99 {result['itl_p99_ms']} ms")
    print(json.dumps(result))
    return 0 if result["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
