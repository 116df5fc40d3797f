#!/usr/bin/env python3
"""Host-pipeline benchmark: can the host keep a GPU busy? Measured without one.

The real HTTP server, frontend, runtime loop and scheduler serve
tools/bench_serving.py's load (random prompts, streaming, concurrency 64), but the
executor is FakeExecutor with a simulated device: each graph occupies it for the
time a cost model gives (defaults: the H200 Llama-3-8B figures in
docs/benchmarks.md), back to back in submission order. Whenever the host is late
to submit, the simulated device idles, so

    busy fraction (all slots live) = simulated device time / wall time

is the share of a real GPU's time the host pipeline would keep filled. Tokens are
toy IDs detokenized by a real Llama 3 tokenizer (the test fixture), so streaming
and detokenization cost what they cost in serving.

    python tools/bench_host.py [--requests 256] [--concurrency 64]

To see where the host's time goes, run it under a sampling profiler that sees
every thread (`py-spy record --threads -f raw -- python tools/bench_host.py`).

Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_serving import add_load_arguments  # noqa: E402
from busy import serve_and_measure  # noqa: E402


def cost_model(args):
    """Seconds a graph occupies the device: decode interpolated between the batch-1 and
    batch-64 step times (and on past 64), prefill the weight pass plus compute per token, a
    mixed step a fixed part plus compute per prompt-capacity token and per decode row (its
    graph runs its whole capacity, padding included). Defaults: the H200 Llama-3-8B graph
    estimates of docs/benchmarks.md ("Serving under load"). With ``--gemm-tile T`` a mixed
    step's flat stream (p + w rows) is charged whole tiles of T rows: the rows past the last
    tile boundary cost a tile at the prompt-token rate (docs/benchmarks.md, "2026-12-05: what 64
    riding decoders cost": p1024 w64 30.3 ms against p960 w64 27.9 on the H200; T = 128 charges
    2.9 ms for the 64 prompt tokens between them)."""
    from flare.contract import GraphKind

    def device_time(graph) -> float:
        if graph.kind == GraphKind.DECODE:
            ms = args.decode_ms + (args.decode_ms_64 - args.decode_ms) * (graph.batch - 1) / 63
        elif graph.kind == GraphKind.MIXED:
            stream = graph.tokens + graph.width
            padding = -stream % args.gemm_tile
            ms = (args.mixed_ms + args.prefill_ms_per_token * (graph.tokens + padding)
                  + args.mixed_ms_per_row * graph.width)
        elif graph.kind == GraphKind.PREFILL:
            ms = args.decode_ms + args.prefill_ms_per_token * graph.batch * graph.tokens
        else:  # initialize / snapshot / restore / resume: small copies and a sample
            ms = args.small_ms
        return ms * 1e-3

    return device_time


def build_engine(args):
    from flare import fixtures
    from flare.contract import PreparedContract
    from flare.core.format import load_core
    from flare.engine.model import NativeModel, core_identity
    from flare.engine.native import NativeEngine, load_frontend
    from flare.engine.runtime import ModelRuntime
    from flare.scheduler.scheduler import RequestScheduler
    from flare.testing.fake_executor import FakeExecutor

    core_dir = fixtures.cache_dir() / "bench-host-core"
    if not (core_dir / "core.json").exists():
        # A one-layer random core: only its tokenizer, template and identity are used.
        subprocess.run([sys.executable, str(Path(__file__).parent / "make_test_core.py"),
                        "--tokenizer", str(fixtures.llama3_tokenizer_json()), "--output", str(core_dir),
                        "--dtype", "float32", "--layers", "1", "--hidden", "128", "--context", str(args.context),
                        "--max-active", "64", "--prefill-chunk", str(args.prefill_chunk)], check=True)
    core = load_core(core_dir)
    frontend = load_frontend(core)
    pages_per_request = -(-args.context // 64)
    contract = PreparedContract.build(
        max_active=args.concurrency, context=args.context, prefill_chunk_size=args.prefill_chunk,
        num_pages=args.concurrency * pages_per_request + 64, num_snapshot_rows=2 * args.concurrency,
        vocab_size=core.recipe.vocab_size, hidden_size=core.recipe.hidden_size, mixed_prefill=args.mixed)
    executor = FakeExecutor(contract, read_history=False, device_time=cost_model(args))
    scheduler = RequestScheduler(contract, core_identity(core), eos_token_ids=core.recipe.eos_token_ids)
    runtime = ModelRuntime(scheduler, executor, decoder_factory=frontend.incremental_decoder,
                           capacity=args.requests + args.concurrency)
    model = NativeModel(core, SimpleNamespace(contract=contract, device="simulated"), executor, runtime, tokenizer=None)
    return NativeEngine(model, frontend, ("bench",)), contract


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_load_arguments(parser)
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--prefill-chunk", type=int, default=512)
    parser.add_argument("--decode-ms", type=float, default=3.73, help="simulated batch-1 decode step")
    parser.add_argument("--decode-ms-64", type=float, default=5.70, help="simulated batch-64 decode step")
    parser.add_argument("--prefill-ms-per-token", type=float, default=0.0225)
    parser.add_argument("--mixed", action="store_true", help="a contract with MIXED graphs")
    parser.add_argument("--mixed-ms", type=float, default=1.5, help="simulated mixed step: fixed part")
    parser.add_argument("--mixed-ms-per-row", type=float, default=0.085, help="simulated mixed step: per decode row")
    parser.add_argument("--small-ms", type=float, default=0.05)
    parser.add_argument("--gemm-tile", type=int, default=1, help="a mixed step's p + w rows charged in whole tiles")
    args = parser.parse_args()

    engine, contract = build_engine(args)
    load = ("--workload", args.workload, "--min-input", str(args.min_input), "--max-input", str(args.max_input),
            "--min-output", str(args.min_output), "--max-output", str(args.max_output),
            "--system-len", str(args.system_len), "--turns", str(args.turns))
    run = serve_and_measure(engine, full=min(contract.max_active, args.concurrency), requests=args.requests,
                            concurrency=args.concurrency, input_len=args.input_len, output_len=args.output_len,
                            vocab=120000, queue_capacity=args.requests, timeout=1800, load_args=load)
    print(run.summary)
    result = run.result
    out = {"busy_fraction_steady": round(run.busy_steady, 3), "steady_s": round(run.steady_s, 1),
           "busy_fraction_whole_run": round(run.busy_whole, 3), "wall_s": round(run.wall_s, 1),
           "output_tok_s": result["output_tok_s"], "ttft_p50_ms": result["ttft_p50_ms"],
           "itl_p50_ms": result["itl_p50_ms"], "itl_p99_ms": result["itl_p99_ms"],
           "ttft_p99_ms": result["ttft_p99_ms"], "total_tok_s": result.get("total_tok_s"),
           "launches": {k: v for k, v in engine.stats().launches.items() if v},
           "simulated_decode_ms": [args.decode_ms, args.decode_ms_64]}
    print(f"simulated device busy {run.busy_steady:.1%} of {run.steady_s:.1f} s with all {run.full} slots live, "
          f"{run.busy_whole:.1%} of the whole {run.wall_s:.1f} s")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
