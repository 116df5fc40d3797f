#!/usr/bin/env python3
"""Serving benchmark client: streaming /v1/completions load against a running server.

Sends N requests with random token-ID prompts (default 1,024 in, 256 out,
ignore_eos so every request generates exactly max_tokens) at a fixed
concurrency over raw keep-alive HTTP/1.1 connections, parses the SSE stream
and reports output tokens/s, TTFT and inter-token latency percentiles. Last
line: one JSON object.

Workloads (--workload):
- ``fixed``: every request --input-len in, --output-len out (issue 23's (a) and (b));
- ``mixed``: prompt and output lengths log-uniform in [--min-input, --max-input] and
  [--min-output, --max-output] ((c): 50-2,000 in, 20-1,000 out);
- ``chat``: multi-turn chats on /v1/chat/completions sharing one system prompt of
  --system-len tokens; each turn sends the whole conversation so far (the replies the
  server streamed back included) plus a new user message of --input-len tokens ((d)).
  A first request warms the system prompt; the report adds the cached-token share and the
  ideal share (each first turn reuses the system message, each later turn its previous
  turn's whole prompt), both from the server's usage counts and /tokenize.

    python tools/bench_serving.py --url http://127.0.0.1:8000 --model NAME \\
        --requests 256 --concurrency 64 --input-len 1024 --output-len 256 --vocab 128000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
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
    __slots__ = ("ttft", "itl", "tokens", "start", "end", "error", "prompt_tokens", "cached_tokens", "text")

    def __init__(self):
        self.ttft = None
        self.itl: list[float] = []
        self.tokens = 0
        self.start = self.end = 0.0
        self.error = None
        self.prompt_tokens = self.cached_tokens = 0
        self.text: list[str] = []


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
                    result.prompt_tokens = usage.get("prompt_tokens", 0)
                    result.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
                choices = message.get("choices") or []
                if choices:
                    piece = choices[0].get("text") or (choices[0].get("delta") or {}).get("content") or ""
                    result.text.append(piece)
                if choices and (piece or choices[0].get("finish_reason") is None):
                    if result.ttft is None:
                        result.ttft = now - result.start
                    elif last is not None:
                        result.itl.append(now - last)
                    last = now
        result.end = time.perf_counter()
        return result
    finally:
        writer.close()


def log_uniform(rng: random.Random, low: int, high: int) -> int:
    return int(round(math.exp(rng.uniform(math.log(low), math.log(high)))))


WORDS = ("time person year way day thing man world life hand part child eye woman place work week case "
         "point government company number group problem fact").split()


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


async def post_json(host: str, port: int, path: str, payload: dict, headers: str) -> dict:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        body = json.dumps(payload).encode()
        writer.write(f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\nConnection: close\r\n{headers}\r\n".encode() + body)
        await writer.drain()
        raw = await reader.read()
        return json.loads(raw.split(b"\r\n\r\n", 1)[1])
    finally:
        writer.close()


def stream_body(args, max_tokens: int, **inputs) -> bytes:
    """A streaming request body generating exactly max_tokens at --temperature (greedy by
    default): ``prompt=`` (token IDs, /v1/completions) or ``messages=`` (/v1/chat/completions)."""
    return json.dumps({"model": args.model, **inputs, "max_tokens": max_tokens, "temperature": args.temperature,
                       "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}).encode()


async def run_chat(args, host: str, port: int, headers: str, rng: random.Random) -> tuple[list[Result], dict]:
    """The chat workload: concurrent conversations of --turns turns over one system prompt."""
    system = {"role": "system", "content": words(rng, args.system_len)}
    boundary = len((await post_json(host, port, "/tokenize", {"model": args.model, "messages": [system],
                                                               "add_generation_prompt": False}, headers))["tokens"])
    for greeting in ("hello", "hello again"):  # the second runs on measured step costs, so it checkpoints the system
        await one_request(host, port, "/v1/chat/completions",
                          stream_body(args, 1, messages=[system, {"role": "user", "content": greeting}]), headers)
    conversations = max(1, args.requests // args.turns)
    results: list[tuple[int, Result]] = []  # (turn, result), turns in order within a conversation
    ideal = [0]

    async def conversation(c: int):
        messages = [system]
        previous_prompt = 0
        for turn in range(args.turns):
            messages.append({"role": "user", "content": words(rng, args.input_len)})
            result = await one_request(host, port, "/v1/chat/completions",
                                       stream_body(args, args.output_len, messages=messages), headers)
            results.append((turn, result))
            ideal[0] += previous_prompt if turn else boundary
            previous_prompt = result.prompt_tokens
            messages.append({"role": "assistant", "content": "".join(result.text)})

    slots = asyncio.Semaphore(args.concurrency)

    async def limited(c: int):
        async with slots:
            await conversation(c)

    await asyncio.gather(*(limited(c) for c in range(conversations)))
    prompt = sum(r.prompt_tokens for _, r in results)
    cached = sum(r.cached_tokens for _, r in results)
    return [r for _, r in results], {
        "prompt_tokens": prompt, "cached_tokens": cached, "system_tokens": boundary,
        "cached_share": round(cached / prompt, 4) if prompt else None,
        "ideal_cached_share": round(ideal[0] / prompt, 4) if prompt else None,
    }


async def run(args) -> dict:
    url = urlsplit(args.url)
    host, port = url.hostname, url.port or 80
    rng = random.Random(args.seed)
    headers = f"Authorization: Bearer {args.api_key}\r\n" if args.api_key else ""
    results: list[Result] = []
    extra: dict = {}
    start = time.perf_counter()
    if args.workload == "chat":
        results, extra = await run_chat(args, host, port, headers, rng)
    else:
        bodies = []
        for _ in range(args.requests):
            if args.workload == "mixed":
                n, out = log_uniform(rng, args.min_input, args.max_input), log_uniform(rng, args.min_output,
                                                                                      args.max_output)
            else:
                n, out = args.input_len, args.output_len
            bodies.append(stream_body(args, out, prompt=[rng.randrange(args.vocab_low, args.vocab) for _ in range(n)]))
            extra["prompt_tokens"] = extra.get("prompt_tokens", 0) + n
        queue: asyncio.Queue = asyncio.Queue()
        for body in bodies:
            queue.put_nowait(body)

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
        "workload": args.workload, "concurrency": args.concurrency,
        "requests": len(results), "failed": len(results) - len(ok),
        "errors": sorted({r.error for r in results if r.error})[:5],
        "wall_s": round(wall, 3), "output_tokens": tokens,
        "output_tok_s": round(tokens / wall, 1),
        "total_tok_s": round((tokens + extra.get("prompt_tokens", 0)) / wall, 1),
        **extra,
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
    parser.add_argument("--workload", choices=("fixed", "mixed", "chat"), default="fixed")
    parser.add_argument("--min-input", type=int, default=50)
    parser.add_argument("--max-input", type=int, default=2000)
    parser.add_argument("--min-output", type=int, default=20)
    parser.add_argument("--max-output", type=int, default=1000)
    parser.add_argument("--system-len", type=int, default=2000, help="chat: system prompt words (about a token each)")
    parser.add_argument("--turns", type=int, default=4, help="chat: turns per conversation")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", required=True)
    parser.add_argument("--api-key", default=None)
    add_load_arguments(parser)
    parser.add_argument("--vocab", type=int, default=128000, help="prompt token IDs are drawn below this")
    parser.add_argument("--vocab-low", type=int, default=1000, help="and at or above this (skips specials)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="every request's temperature (0: greedy, the decode graphs' greedy variant)")
    args = parser.parse_args()
    result = asyncio.run(run(args))
    print(f"{result['requests']} requests ({result['failed']} failed) in {result['wall_s']} s: "
          f"{result['output_tok_s']} output tok/s, TTFT p50 {result['ttft_p50_ms']} ms p99 {result['ttft_p99_ms']} ms, "
          f"ITL p50 {result['itl_p50_ms']} ms p99 {result['itl_p99_ms']} ms")
    print(json.dumps(result))
    return 0 if result["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
