#!/usr/bin/env python3
"""Speculative decoding speed beside plain decode, in the same process and on the same graphs.

CPU (default): the demo core with copy proposals, two workloads at batch 1: copy-heavy
(asking to repeat or lightly edit a passage of the prompt) and free generation. Each
prompt runs with speculation off, then on; greedy, so both produce the same tokens
(checked). Reports output tok/s of each and their ratio, with the acceptance counters.

CUDA (--device cuda): a random-weight Llama-3-8B core (tools/bench_gpu.py's) with the
benchmark proposer (speculation.ReplayProposer): a first plain run records each prompt's
greedy continuation, then the drafts replay it, each position right with probability
--accept (default 0.8 and 0). Batch 1 and batch 32, depth 4. Reports tok/s against plain
decode from the same run, the verification graphs' device times and the counters.

CUDA with --drafter: the same 8B target with a random Llama-3.2-1B-shaped draft core
(--speculative draft), at batch 1 and 32: plain decode, every round drafted and verified
(random drafts are all rejected, so this is the drafter's whole overhead), and the scheduler's
own choice (it backs off). Reports the drafter's round time per depth beside the verification
and decode step times, and what they project at acceptance 0.8.

CUDA with --profile: one batch-1 prompt decoded plainly, then with every round verified (drafts
always right), under the CUDA profiler; lists each run's kernels by exposed device time per
step (what each one added to the end of the kernels before it) and the idle time between
steps, so the verification graph's extra cost over a decode step can be read kernel by kernel.

Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

PASSAGES = [
    "The lighthouse stood at the end of the rocky point, its white tower streaked with salt. Every evening the "
    "keeper climbed the one hundred and twelve steps, trimmed the wick, polished the great lens and watched the "
    "beam sweep across the water until the first fishing boats came home.",
    "To make bread, mix four cups of flour with a spoon of salt and a packet of yeast. Add two cups of warm water "
    "and stir until the dough comes together. Knead it for ten minutes, let it rise for an hour, shape it into a "
    "loaf and bake it at two hundred degrees for forty minutes.",
    "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n"
    "def factorial(n):\n    result = 1\n    for i in range(2, n + 1):\n        result *= i\n    return result\n",
    "Dear team, the quarterly review will take place on Thursday at ten in the main conference room. Please bring "
    "your project updates, the budget figures for the last three months and any questions about the new travel "
    "policy. Lunch will be served afterwards.",
]
COPY_ASKS = ["Copy the following text word for word:\n\n{p}\n\nNow write it again exactly.",
             "Repeat this passage exactly as written:\n\n{p}",
             "Rewrite the following text, changing only the first sentence:\n\n{p}"]
FREE = ["Write a short story about a dragon who learns to bake.", "Explain how a rainbow forms.",
        "List five ideas for a birthday party and describe each one.", "Describe a walk through a busy market.",
        "What are the benefits of learning a second language?", "Write a letter to a friend about your holiday."]
RESULTS: dict = {}


def log(message: str) -> None:
    print(f"[bench_speculative {time.strftime('%H:%M:%S')}] {message}", flush=True)


def counters(model) -> dict:
    c = model.runtime.scheduler.speculation.counters
    return {k: getattr(c, k) for k in c.__slots__}


def acceptance(d: dict) -> dict:
    """The spec's figures from a counter delta."""
    return dict(mean_acceptance_length=round(d["accepted_drafts"] / max(1, d["draft_rounds"]), 3),
                depth=round(d["draft_positions"] / max(1, d["generation_rounds"]), 3),
                verification_steps=d["verification_steps"], probes=d["probes"])


def run_batch(model, prompts, params_for) -> tuple[float, list[list[int]]]:
    """Submit every prompt at once; -> (wall seconds to the last finish, output tokens each)."""
    from flare.request import ErrorEvent, FinishEvent, PreparedPrompt, TokenEvent

    outs: list[list[int]] = [[] for _ in prompts]
    done = threading.Semaphore(0)
    errors: list = []

    def sink_for(i):
        def sink(event):
            if isinstance(event, TokenEvent):
                outs[i].extend(event.token_ids)
            elif isinstance(event, (FinishEvent, ErrorEvent)):
                if isinstance(event, ErrorEvent):
                    errors.append(event)
                done.release()
        return sink

    t0 = time.perf_counter()
    for i, ids in enumerate(prompts):
        model.submit(PreparedPrompt(np.asarray(ids, np.int32)), params_for(i), sink_for(i))
    for _ in prompts:
        if not done.acquire(timeout=900):
            raise RuntimeError("a request did not finish")
    if errors:
        raise RuntimeError(f"request failed: {errors[0]}")
    return time.perf_counter() - t0, outs


class HostGaps:
    """The host's turn between verification rounds: from the poll that returned one SPECULATIVE
    completion to the submission of the next SPECULATIVE step (median, microseconds)."""

    def __init__(self, model):
        self.ex, self.graphs, self.stamps = model.executor, model.loaded.contract.graphs, []

    def __enter__(self):
        from flare.contract import GraphKind
        poll, submit, stamps, graphs = self.ex.poll, self.ex.submit, self.stamps, self.graphs
        speculative = GraphKind.SPECULATIVE

        def timed_poll(timeout=0.0):
            done = poll(timeout)
            if done is not None:
                stamps.append((0, time.perf_counter(), graphs[done.graph_index].kind == speculative))
            return done

        def timed_submit(graph_index, uploads, grammar_constrained=False):
            stamps.append((1, time.perf_counter(), graphs[graph_index].kind == speculative))
            return submit(graph_index, uploads, grammar_constrained)

        self.ex.poll, self.ex.submit = timed_poll, timed_submit
        return self

    def __exit__(self, *exc):
        del self.ex.poll, self.ex.submit  # the instance attributes: the class's methods again

    def median_us(self) -> float | None:
        gaps = [b[1] - a[1] for a, b in zip(self.stamps, self.stamps[1:])
                if a[0] == 0 and b[0] == 1 and a[2] and b[2]]
        return round(float(np.median(gaps)) * 1e6, 1) if gaps else None


def run_rounds(model, prompts, params, alone: bool) -> tuple[float, list[list[int]]]:
    """All prompts at once, or (``alone``) one after another, each a batch of one."""
    if not alone:
        return run_batch(model, prompts, lambda i: params)
    total, outs = 0.0, []
    for p in prompts:
        dt, (out,) = run_batch(model, [p], lambda i: params)
        total += dt
        outs.append(out)
    return total, outs


def load_timed(core, config, **kwargs):
    """NativeModel.load on the GPU, its load-and-capture time and the device name recorded."""
    import torch

    from flare.engine.model import NativeModel

    t0 = time.perf_counter()
    model = NativeModel.load(core, config, progress=log, **kwargs)
    RESULTS["load_and_capture_s"] = round(time.perf_counter() - t0, 1)
    RESULTS["device"] = torch.cuda.get_device_name()
    return model


def plain_rounds(model, spec, batch: int, rng, args):
    """A workload of random prompts and its plain-decode baseline (speculation off, warmed, best
    of two) -> (alone, prompts, params, seconds, outputs). Batch 1 runs --bs1-prompts prompts one
    after another (more rounds, less noise)."""
    from flare.request import SamplingParams

    alone = batch == 1
    count = args.bs1_prompts if alone else batch
    prompts = [rng.integers(1000, 120000, args.prompt_len).astype(np.int32).tolist() for _ in range(count)]
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    with_speculation(model, False, spec)
    run_batch(model, prompts[:batch], lambda i: SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True))
    dt, outs = min((run_rounds(model, prompts, params, alone) for _ in range(2)), key=lambda r: r[0])
    return alone, prompts, params, dt, outs


def with_speculation(model, on: bool, spec) -> None:
    """Speculation on or off between rounds (the model thread is idle then)."""
    model.runtime.scheduler.speculation = spec if on else None


def cpu_bench(args) -> None:
    from flare.config import EngineConfig
    from flare.core.embedded import demo_core
    from flare.engine.model import NativeModel
    from flare.request import SamplingParams

    model = NativeModel.load(demo_core(), EngineConfig(device="cpu", kv_memory_bytes=1 << 30, speculative="copy",
                                                       speculative_depth=args.depth), progress=log)
    spec = model.runtime.scheduler.speculation
    tok = model.tokenizer

    def chat(text):
        return tok.encode(f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n",
                          add_special_tokens=False).ids

    workloads = {"copy": [chat(a.format(p=p)) for p in PASSAGES for a in COPY_ASKS][:args.prompts],
                 "free": [chat(q) for q in FREE][:args.prompts]}
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
    try:
        with_speculation(model, False, spec)
        run_batch(model, [workloads["free"][0]], lambda i: SamplingParams(max_tokens=8, temperature=0.0))  # warm
        for name, prompts in workloads.items():
            times = {"off": 0.0, "on": 0.0}
            tokens = {"off": 0, "on": 0}
            lossless = True
            before = None
            for ids in prompts:
                # alternate off/on per prompt so drift in machine speed hits both
                with_speculation(model, False, spec)
                dt_off, (out_off,) = run_batch(model, [ids], lambda i: params)
                with_speculation(model, True, spec)
                before = before or counters(model)
                dt_on, (out_on,) = run_batch(model, [ids], lambda i: params)
                lossless &= out_on == out_off
                times["off"] += dt_off
                times["on"] += dt_on
                tokens["off"] += len(out_off)
                tokens["on"] += len(out_on)
            after = counters(model)
            delta = {k: after[k] - before[k] for k in after}
            off, on = tokens["off"] / times["off"], tokens["on"] / times["on"]
            RESULTS[name] = dict(plain_tok_s=round(off, 2), speculative_tok_s=round(on, 2),
                                 ratio=round(on / off, 3), lossless=lossless, output_tokens=tokens["on"],
                                 **acceptance(delta))
            log(f"{name}: plain {off:.2f} tok/s, copy proposals {on:.2f} tok/s, ratio {on / off:.3f}, "
                f"lossless {lossless}, {RESULTS[name]}")
    finally:
        model.close()


def cuda_bench(args) -> None:
    from bench_gpu import export, make_checkpoint

    from flare.config import EngineConfig
    from flare.contract import GraphKind
    from flare.scheduler.speculation import ReplayProposer

    ckpt = args.workdir / "llama3-8b-hf"
    core = args.workdir / "llama3-8b-core-64-512"
    make_checkpoint(ckpt, "llama3-8b", args.tokenizer)
    export(ckpt, core, 4096, max_active=64, chunk=512)
    truth: dict[bytes, np.ndarray] = {}
    proposer = ReplayProposer(truth, 0.0, vocab_size=128256, seed=0)
    model = load_timed(core, EngineConfig(device="cuda", max_active=32, speculative="copy",
                                          speculative_depth=args.depth), proposer=proposer)
    sched = model.runtime.scheduler
    spec = sched.speculation
    rng = np.random.default_rng(5)
    try:
        for batch in args.batches:
            alone, prompts, params, plain_dt, plain_out = plain_rounds(model, spec, batch, rng, args)
            tokens = sum(len(o) for o in plain_out)
            row = {"plain_tok_s": round(tokens / plain_dt, 1)}
            # The replayed continuation: the verification graph's own greedy output (drafts from
            # the plain run, all offered). In bf16 a verification row and a plain decode row are
            # products of different shapes, so near-ties (random weights are full of them) can
            # round apart; a verification row's choice depends only on its context, so this
            # continuation is what every later verification of the same width computes.
            spec.widths = [args.depth + 1]
            for ids, out in zip(prompts, plain_out):
                truth[np.asarray(ids, np.int32).tobytes()] = np.asarray(out, np.int64)
            proposer.accept = 1.0
            with_speculation(model, True, spec)
            spec.always = True
            _, spec_out = run_rounds(model, prompts, params, alone)
            spec.always = False
            same = [next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), len(a))
                    for a, b in zip(plain_out, spec_out)]
            row["plain_vs_verified_first_difference"] = int(np.median(same))
            for ids, out in zip(prompts, spec_out):
                truth[np.asarray(ids, np.int32).tobytes()] = np.asarray(out, np.int64)
            for accept in args.accept:
                proposer.accept = accept
                # fresh acceptance statistics per setting: new requests, and a population that has
                # seen none of the earlier settings (its prior would carry them over)
                spec.population.clear()
                with_speculation(model, True, spec)
                before = counters(model)
                best = None
                with HostGaps(model) as gaps:
                    for _ in range(2):
                        dt, outs = run_rounds(model, prompts, params, alone)
                        best = dt if best is None else min(best, dt)
                        lossless = outs == spec_out
                after = counters(model)
                d = {k: after[k] - before[k] for k in after}
                row[f"a{accept}"] = dict(tok_s=round(tokens / best, 1), ratio=round(plain_dt / best, 3),
                                         lossless=lossless, host_gap_us=gaps.median_us(), **acceptance(d))
                log(f"batch {batch}, acceptance {accept}: {row[f'a{accept}']} (plain {row['plain_tok_s']} tok/s)")
            RESULTS[f"bs{batch}"] = row
        ms = {}
        for g in model.loaded.contract.graphs:
            est = sched.timing.estimate_ns(g.index)
            if est and g.kind in (GraphKind.SPECULATIVE, GraphKind.DECODE) and g.batch in (1, 32):
                ms[g.label] = round(est * 1e-6, 3)
        RESULTS["device_ms"] = ms
    finally:
        model.close()


def kernel_table(events, steps: int) -> list[tuple[str, float, int]]:
    """CUDA kernel events -> (name, exposed us per step, launches per step), plus an "(idle)"
    row: the time no kernel ran, from the first kernel's start to the last one's end."""
    sums: dict[str, list[float]] = {}
    latest = idle = None
    for e in sorted(events, key=lambda e: e.time_range.start):
        start, end = e.time_range.start, e.time_range.end
        if latest is None:
            latest, idle = start, 0.0
        idle += max(0.0, start - latest)
        row = sums.setdefault(e.name[:90], [0.0, 0])
        row[0] += max(0.0, end - max(latest, start))
        row[1] += 1
        latest = max(latest, end)
    rows = sorted(((n, round(t / steps, 1), round(c / steps, 2)) for n, (t, c) in sums.items()), key=lambda r: -r[1])
    return rows + [("(idle)", round((idle or 0.0) / steps, 1), 0)]


def profile_bench(args) -> None:
    """Kernel tables of plain decode and of verification rounds, one batch-1 prompt each."""
    from bench_gpu import export, make_checkpoint
    from torch.profiler import DeviceType, ProfilerActivity
    from torch.profiler import profile as torch_profile

    from flare.config import EngineConfig
    from flare.contract import GraphKind
    from flare.scheduler.speculation import ReplayProposer

    ckpt = args.workdir / "llama3-8b-hf"
    core = args.workdir / "llama3-8b-core-64-512"
    make_checkpoint(ckpt, "llama3-8b", args.tokenizer)
    export(ckpt, core, 4096, max_active=64, chunk=512)
    truth: dict[bytes, np.ndarray] = {}
    proposer = ReplayProposer(truth, 1.0, vocab_size=128256, seed=0)
    model = load_timed(core, EngineConfig(device="cuda", max_active=32, speculative="copy",
                                          speculative_depth=args.depth), proposer=proposer)
    spec = model.runtime.scheduler.speculation
    spec.widths = [args.depth + 1]
    graphs = model.loaded.contract.graphs
    kinds: list = []
    submit = model.executor.submit

    def counted(graph_index, uploads, grammar_constrained=False):
        kinds.append(graphs[graph_index].kind)
        return submit(graph_index, uploads, grammar_constrained)

    model.executor.submit = counted
    rng = np.random.default_rng(5)
    args.bs1_prompts = 1
    try:
        _, prompts, params, _, plain_out = plain_rounds(model, spec, 1, rng, args)
        truth[np.asarray(prompts[0], np.int32).tobytes()] = np.asarray(plain_out[0], np.int64)
        with_speculation(model, True, spec)
        spec.always = True
        _, (verified,) = run_rounds(model, prompts, params, True)  # warm; the verification graph's own output
        truth[np.asarray(prompts[0], np.int32).tobytes()] = np.asarray(verified, np.int64)
        for label, on, kind in (("decode", False, GraphKind.DECODE), ("verification", True, GraphKind.SPECULATIVE)):
            with_speculation(model, on, spec)
            kinds.clear()
            with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
                run_rounds(model, prompts, params, True)
            steps = sum(k == kind for k in kinds)
            table = kernel_table([e for e in prof.events() if e.device_type == DeviceType.CUDA], steps)
            RESULTS[f"profile_{label}"] = dict(steps=steps, submissions=len(kinds), kernels=table[:40])
            log(f"{label}: {steps} steps of {len(kinds)} submissions; kernels by exposed us per step:")
            for name, us, n in table[:40]:
                print(f"  {us:9.1f} us  {n:6.2f}x  {name}", flush=True)
    finally:
        del model.executor.submit
        model.close()


def drafter_bench(args) -> None:
    from bench_gpu import export, make_checkpoint

    from flare.config import EngineConfig
    from flare.contract import GraphKind

    cores = {}
    for shape in ("llama3-8b", "llama3.2-1b"):
        ckpt = args.workdir / f"{shape}-hf"
        cores[shape] = args.workdir / f"{shape}-core-64-512"
        make_checkpoint(ckpt, shape, args.tokenizer)
        export(ckpt, cores[shape], 4096, max_active=64, chunk=512)
    model = load_timed(cores["llama3-8b"], EngineConfig(
        device="cuda", max_active=32, speculative="draft", draft_core=str(cores["llama3.2-1b"]),
        speculative_depth=args.depth))
    sched, drafter = model.runtime.scheduler, model.drafter
    spec = sched.speculation
    rng = np.random.default_rng(5)
    try:
        for batch in (1, 32):
            alone, prompts, params, plain_dt, plain_out = plain_rounds(model, spec, batch, rng, args)
            tokens = sum(len(o) for o in plain_out)
            row = {"plain_tok_s": round(tokens / plain_dt, 1)}
            for mode in ("every_round_drafted", "scheduler_choice"):
                spec.population.clear()
                with_speculation(model, True, spec)
                spec.always = mode == "every_round_drafted"
                before = counters(model)
                best = None
                for _ in range(2):
                    dt, outs = run_rounds(model, prompts, params, alone)
                    best = dt if best is None else min(best, dt)
                spec.always = False
                after = counters(model)
                d = {k: after[k] - before[k] for k in after}
                row[mode] = dict(tok_s=round(tokens / best, 1), ratio=round(plain_dt / best, 3),
                                 same_tokens=outs == plain_out, **acceptance(d))
                log(f"batch {batch}, {mode}: {row[mode]} (plain {row['plain_tok_s']} tok/s)")
            graphs = {(g.kind, g.batch, g.tokens, g.greedy): g for g in model.loaded.contract.graphs}
            b = 1 if batch == 1 else 32
            decode_ms = sched.timing.estimate_ns(graphs[(GraphKind.DECODE, b, 1, True)].index) * 1e-6
            verify = graphs[(GraphKind.SPECULATIVE, b, args.depth + 1, True)]
            verify_ms = sched.timing.estimate_ns(verify.index) * 1e-6
            draft_ms = {f"depth{k[1]}": round(v * 1e3, 3) for k, v in sorted(drafter.cost_s.items()) if k[0] == b}
            row.update(decode_ms=round(decode_ms, 3), verify_ms=round(verify_ms, 3), drafter_round_ms=draft_ms)
            full = drafter.cost_s.get((b, args.depth))
            if full and verify_ms and decode_ms:
                kept = 1 + sum(0.8 ** i for i in range(1, args.depth + 1))
                row["projected_ratio_at_a0.8"] = round(kept * decode_ms / (verify_ms + full * 1e3), 3)
            RESULTS[f"bs{batch}"] = row
    finally:
        model.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=0, help="per request (default: CPU 96, CUDA 256)")
    parser.add_argument("--prompts", type=int, default=6, help="CPU: prompts per workload")
    parser.add_argument("--prompt-len", type=int, default=128, help="CUDA: random prompt tokens")
    parser.add_argument("--bs1-prompts", type=int, default=6, help="CUDA: batch-1 prompts run one after another")
    parser.add_argument("--accept", type=float, nargs="+", default=[0.8, 0.0], help="CUDA: replayed draft accuracy")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 32], help="CUDA: batch sizes of the replay runs")
    parser.add_argument("--drafter", action="store_true", help="CUDA: a random 1B draft core's overhead instead")
    parser.add_argument("--profile", action="store_true", help="CUDA: kernel tables of decode and verification")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/flare-bench"))
    parser.add_argument("--tokenizer", type=Path, default=Path(".carry/llama3-tokenizer.json"))
    parser.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) if os.environ.get("OUT") else None)
    args = parser.parse_args()
    args.max_tokens = args.max_tokens or (96 if args.device == "cpu" else 256)
    RESULTS.update(device_kind=args.device, depth=args.depth, max_tokens=args.max_tokens)
    try:
        (cpu_bench if args.device == "cpu" else drafter_bench if args.drafter
         else profile_bench if args.profile else cuda_bench)(args)
    finally:
        if args.out is not None:
            args.out.mkdir(parents=True, exist_ok=True)
            name = ("bench_drafter.json" if args.drafter else "bench_speculative_profile.json" if args.profile
                    else "bench_speculative.json")
            (args.out / name).write_text(json.dumps(RESULTS, indent=2))
    print(json.dumps(RESULTS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
