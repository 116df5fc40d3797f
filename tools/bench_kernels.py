"""Benchmark the Triton kernels of flare.model.kernels against torch on CUDA.

Every figure is a per-call time from CUDA-graph replays timed with CUDA events
(median of repeats), so Python launch overhead is out of both our number and the
reference's. Inputs rotate over enough distinct buffers that a call does not find
its data in the 60 MB L2. Achieved bandwidth counts the bytes a call must move
(each input read once, each output written once) and is printed next to the
device-to-device copy ceiling measured in the same run (about 4.3 TB/s on the
H200, DEVICE.md).

Sections (all by default, or pick with --only):
  attention   paged decode (B x context) and prefill (chunk over a prefix) against
              paged_attention_reference and F.scaled_dot_product_attention on
              contiguous K/V
  elementwise rms_norm, add_rms_norm (decode rows and a prefill chunk, which takes
              torch's variance), silu_mul against flare.model.layers; qkv_rope_write
              against flare.model.decoder.qkv_rope_write (the torch composite)
  gemv        linear_small_m against F.linear (cuBLAS) on Llama-3-8B shapes, M = 1..8,
              32 distinct weight copies per shape (as in a real step)
  step        all 32 layers' qkv/o/gate_up/down plus lm_head (15.0 GB of bf16) in one
              graph, through the `linear` selector against F.linear: the weight-streaming
              floor of a decode step
  sampling    the sampling variant's token choice over Llama 3's 128,256 logits
              (kernels.sampling.sample_tokens) against the sorted torch sampler it replaced
              (penalties, Philox, sort, filters, inverse CDF), with the greedy kernel and
              the logprob outputs (log_softmax, top 20) beside them; rows with temperature
              only and with Ollama's defaults (0.8, top_k 40, top_p 0.9)
--sweep gemv,attention times grids of launch shapes (GemvConfig per GEMV shape;
decode split counts and stages; prefill block shapes, also over packed rows, with and
without the unmasked steps) and prints the best; --sweep prefill times the prefill part
alone.

    python tools/bench_kernels.py [--only attention,elementwise,gemv,step,sampling] [--sweep gemv,attention,prefill]
                                  [--json PATH]

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flare.model import decoder, layers  # noqa: E402
from flare.model.attention import AttentionBatch, paged_attention_reference  # noqa: E402
from flare.model.kernels import (  # noqa: E402
    GemvConfig,
    _common,
    add_rms_norm,
    default_config,
    gemv,
    linear,
    linear_small_m,
    paged_attention,
    qkv_rope_write,
    rms_norm,
    silu_mul,
)

DEV = torch.device("cuda")
H, HKV, D, HIDDEN, INTER, VOCAB, LAYERS = 32, 8, 128, 4096, 14336, 128256, 32
PMAX = 128
PAGE = 64
ROTATE_BYTES = 256 << 20  # distinct input bytes per timed graph: several times the L2
LINEARS = {"qkv": (6144, HIDDEN), "o": (HIDDEN, HIDDEN), "gate_up": (2 * INTER, HIDDEN), "down": (HIDDEN, INTER)}


def graph_us(calls: list, repeats: int = 15) -> float:
    """Median microseconds per call of ``calls`` (zero-arg callables) captured in one graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for fn in calls:
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):  # the warm-up's stream (the GEMV's split tickets are per stream)
        for fn in calls:
            fn()
    us = replay_ms(graph, runs=repeats) * 1000.0 / len(calls)
    del graph
    return us


def replay_ms(graph: torch.cuda.CUDAGraph, *, replays: int = 1, runs: int = 15) -> float:
    """Median milliseconds per replay of ``graph`` over ``runs`` timed runs of ``replays``
    back-to-back replays (CUDA events), after one untimed replay."""
    graph.replay()
    torch.cuda.synchronize()
    samples = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / replays)
    return statistics.median(samples)


def copy_ceiling_gbs() -> tuple[float, dict[str, float]]:
    """Device-to-device copy bandwidth of 4 GiB (bytes read + written), clocks spun up first.

    Measured three ways: an eager cudaMemcpy timed with events, the same memcpy as a
    graph node, and an elementwise copy kernel in a graph. The ceiling is the best.
    """
    nbytes = 4 << 30
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=DEV).normal_()
    dst = torch.empty_like(src)
    start = time.monotonic()
    while time.monotonic() - start < 2.0:  # an idle H200 sits at 345 MHz until loaded
        dst.copy_(src)
        torch.cuda.synchronize()
    samples = []
    for _ in range(10):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        samples.append(begin.elapsed_time(end) * 1e3)
    ways = {"memcpy_eager": statistics.median(samples),
            "memcpy_graph": graph_us([lambda: dst.copy_(src)] * 4, repeats=10),
            "kernel_graph": graph_us([lambda: torch.mul(src, 1.0, out=dst)] * 4, repeats=10)}
    del src, dst
    torch.cuda.empty_cache()
    gbs = {k: 2 * nbytes / (us * 1e-6) / 1e9 for k, us in ways.items()}
    return max(gbs.values()), gbs


@triton.jit
def _read_kernel(x_ptr, out_ptr, n, chunk, BLOCK: tl.constexpr):
    """Sum one contiguous chunk of x (as a GEMV program streams its weight rows) and store
    the program's sum, so nothing but the reads is left to time."""
    start = tl.program_id(0).to(tl.int64) * chunk
    stop = tl.minimum(start + chunk, n)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for i in range(start, stop, BLOCK):
        offs = i + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + offs, mask=offs < stop, other=0.0).to(tl.float32)
    tl.store(out_ptr + tl.program_id(0), tl.sum(acc, axis=0))


def read_ceiling_gbs(nbytes: int) -> tuple[float, dict[str, float]]:
    """Streaming-read bandwidth over an ``nbytes`` bf16 buffer (size it as the weights a step
    reads, far past the L2): a read-only kernel in a graph, several launch shapes, the best.
    This, not the copy ceiling, is what a decode step's weight stream can approach (about
    4,540 GB/s on the H200 against 4,270 for copies, issue 27). -> (best GB/s, per shape)."""
    n = nbytes // 2
    x = torch.empty(n, dtype=torch.bfloat16, device=DEV).normal_()
    sms = torch.cuda.get_device_properties(DEV).multi_processor_count
    found = {}
    start = time.monotonic()
    while time.monotonic() - start < 2.0:  # clocks up (an idle H200 sits at 345 MHz)
        x.sum()
        torch.cuda.synchronize()
    for per_sm, block, warps in ((4, 4096, 4), (8, 4096, 4), (16, 2048, 4), (8, 8192, 8), (32, 2048, 2)):
        programs = sms * per_sm
        chunk = -(-n // programs)
        chunk = -(-chunk // block) * block
        out = torch.empty(programs, dtype=torch.float32, device=DEV)
        us = graph_us([lambda out=out, chunk=chunk, programs=programs, block=block, warps=warps:
                       _read_kernel[(programs,)](x, out, n, chunk, BLOCK=block, num_warps=warps)], repeats=10)
        found[f"{per_sm}/SM x{block} w{warps}"] = nbytes / (us * 1e-6) / 1e9
    del x
    torch.cuda.empty_cache()
    return max(found.values()), found


def rotations(bytes_per_call: float, cap: int = 32) -> int:
    return max(2, min(cap, math.ceil(ROTATE_BYTES / max(bytes_per_call, 1))))


def row(*cells) -> None:
    print("  ".join(f"{c:>12}" if not isinstance(c, float) else f"{c:>12.2f}" for c in cells))


# -- attention -------------------------------------------------------------------

def _decode_inputs(b: int, ctx: int, copies: int, gen: torch.Generator):
    pages_per_row = ctx // PAGE
    num_pages = 1 + copies * b * pages_per_row
    k_pool = torch.randn(num_pages, PAGE, HKV, D, device=DEV, generator=gen, dtype=torch.bfloat16)
    v_pool = torch.randn_like(k_pool)
    perm = torch.randperm(num_pages - 1, device=DEV, generator=gen) + 1
    batches, qs = [], []
    for c in range(copies):
        table = torch.zeros(b, PMAX if ctx <= PMAX * PAGE else pages_per_row, dtype=torch.int64, device=DEV)
        table[:, :pages_per_row] = perm[c * b * pages_per_row:(c + 1) * b * pages_per_row].view(b, pages_per_row)
        lens = torch.full((b,), ctx, dtype=torch.int64, device=DEV)
        batches.append(AttentionBatch(positions=(lens - 1).view(b, 1), write_index=torch.zeros(b, 1, dtype=torch.int64,
                                      device=DEV), page_table=table, kv_lens=lens))
        qs.append(torch.randn(b, 1, H, D, device=DEV, generator=gen, dtype=torch.bfloat16))
    return k_pool, v_pool, batches, qs


def bench_attention(ceiling: float, results: dict) -> None:
    gen = torch.Generator(device=DEV).manual_seed(0)
    scale = D ** -0.5
    print(f"\n== paged decode attention (H={H}, Hkv={HKV}, D={D}, bf16, Pmax={PMAX}): us per call, GB/s of K+V ==")
    row("B", "context", "flare us", "flare GB/s", "% ceiling", "sdpa us", "sdpa GB/s", "torch-ref us")
    for b in (1, 8, 32, 64):
        for ctx in (1024, 8192):
            kv_bytes = 2 * b * ctx * HKV * D * 2
            copies = rotations(kv_bytes)
            k_pool, v_pool, batches, qs = _decode_inputs(b, ctx, copies, gen)
            ours = graph_us([lambda q=q, bt=bt: paged_attention(q, k_pool, v_pool, bt, scale)
                             for q, bt in zip(qs, batches)])
            dense_copies = min(copies, 4)
            dense = [(torch.randn(b, HKV, ctx, D, device=DEV, generator=gen, dtype=torch.bfloat16),
                      torch.randn(b, HKV, ctx, D, device=DEV, generator=gen, dtype=torch.bfloat16),
                      torch.randn(b, H, 1, D, device=DEV, generator=gen, dtype=torch.bfloat16))
                     for _ in range(dense_copies)]
            sdpa = graph_us([lambda k=k, v=v, q=q: F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)
                             for k, v, q in dense])
            ref = float("nan")
            if b * ctx <= 64 * 1024:
                ref = graph_us([lambda q=q, bt=bt: paged_attention_reference(q, k_pool, v_pool, bt, scale)
                                for q, bt in list(zip(qs, batches))[:2]], repeats=5)
            gbs = kv_bytes / (ours * 1e-6) / 1e9
            row(b, ctx, ours, gbs, 100 * gbs / ceiling, sdpa, kv_bytes / (sdpa * 1e-6) / 1e9, ref)
            results[f"decode_b{b}_ctx{ctx}"] = {"flare_us": ours, "sdpa_us": sdpa, "torch_ref_us": ref,
                                                "flare_gbs": gbs}
            del k_pool, v_pool, batches, qs, dense
            torch.cuda.empty_cache()

    print("\n== paged prefill attention (B=1, causal by position): us per call, TFLOP/s ==")
    row("chunk", "prefix", "flare us", "flare TF/s", "sdpa us", "sdpa TF/s")
    for q_len in (512, 2048):
        for prefix in (0, 4096):
            ctx = prefix + q_len
            pages = -(-ctx // PAGE)
            k_pool = torch.randn(1 + 2 * pages, PAGE, HKV, D, device=DEV, generator=gen, dtype=torch.bfloat16)
            v_pool = torch.randn_like(k_pool)
            calls = []
            for c in range(2):
                table = torch.zeros(1, PMAX, dtype=torch.int64, device=DEV)
                table[0, :pages] = torch.arange(1 + c * pages, 1 + (c + 1) * pages, device=DEV)
                positions = (prefix + torch.arange(q_len, device=DEV)).view(1, q_len)
                bt = AttentionBatch(positions, positions, table, torch.tensor([ctx], device=DEV))
                q = torch.randn(1, q_len, H, D, device=DEV, generator=gen, dtype=torch.bfloat16)
                calls.append(lambda q=q, bt=bt: paged_attention(q, k_pool, v_pool, bt, scale))
            ours = graph_us(calls)
            kd = torch.randn(1, H, ctx, D, device=DEV, generator=gen, dtype=torch.bfloat16)
            vd = torch.randn_like(kd)
            qd = torch.randn(1, H, q_len, D, device=DEV, generator=gen, dtype=torch.bfloat16)
            if prefix == 0:
                sdpa = graph_us([lambda: F.scaled_dot_product_attention(qd, kd, vd, is_causal=True, scale=scale)])
            else:
                from torch.nn.attention.bias import causal_lower_right
                bias = causal_lower_right(q_len, ctx)
                sdpa = graph_us([lambda: F.scaled_dot_product_attention(qd, kd, vd, attn_mask=bias, scale=scale)])
            pairs = q_len * prefix + q_len * (q_len + 1) / 2
            flops = 4 * pairs * H * D
            row(q_len, prefix, ours, flops / (ours * 1e-6) / 1e12, sdpa, flops / (sdpa * 1e-6) / 1e12)
            results[f"prefill_q{q_len}_prefix{prefix}"] = {"flare_us": ours, "sdpa_us": sdpa,
                                                          "flare_tflops": flops / (ours * 1e-6) / 1e12}
            del k_pool, v_pool, kd, vd, qd, calls
            torch.cuda.empty_cache()


# -- elementwise -----------------------------------------------------------------

def bench_elementwise(ceiling: float, results: dict) -> None:
    gen = torch.Generator(device=DEV).manual_seed(1)
    print("\n== fused elementwise (bf16): us per call, GB/s ==")
    row("kernel", "shape", "flare us", "flare GB/s", "torch us", "torch GB/s")

    def report(name, shape, ours_calls, torch_calls, nbytes):
        ours, ref = graph_us(ours_calls), graph_us(torch_calls)
        row(name, shape, ours, nbytes / (ours * 1e-6) / 1e9, ref, nbytes / (ref * 1e-6) / 1e9)
        results[f"{name}_{shape}"] = {"flare_us": ours, "torch_us": ref}

    w = torch.randn(HIDDEN, device=DEV, generator=gen).bfloat16()
    for rows in (1, 64, 2048):
        nbytes = 2 * rows * HIDDEN * 2
        xs = [torch.randn(rows, HIDDEN, device=DEV, generator=gen).bfloat16() for _ in range(rotations(nbytes))]
        rs = [torch.randn_like(x) for x in xs]
        report("rms_norm", f"{rows}x{HIDDEN}", [lambda x=x: rms_norm(x, w, 1e-5) for x in xs],
               [lambda x=x: layers.rms_norm(x, w, 1e-5) for x in xs], nbytes)
        report("add_rms_norm", f"{rows}x{HIDDEN}",
               [lambda x=x, r=r: add_rms_norm(x, r, w, 1e-5) for x, r in zip(xs, rs)],
               [lambda x=x, r=r: layers.rms_norm(r + x, w, 1e-5) for x, r in zip(xs, rs)], 2 * nbytes)
        if rows > 1:  # the same rows as one prefill chunk [1, Q, N]: torch's variance, then the kernel
            chunks = [(x.view(1, rows, HIDDEN), r.view(1, rows, HIDDEN)) for x, r in zip(xs, rs)]
            report("add_rms_norm_prefill", f"1x{rows}x{HIDDEN}",
                   [lambda c=c: add_rms_norm(c[0], c[1], w, 1e-5) for c in chunks],
                   [lambda c=c: layers.rms_norm(c[1] + c[0], w, 1e-5) for c in chunks], 2 * nbytes)
    table_cos = torch.rand(8192, D, device=DEV, generator=gen)
    table_sin = torch.rand(8192, D, device=DEV, generator=gen)
    for b, q_len in ((64, 1), (1, 2048)):
        nbytes = 2 * b * q_len * (H + 2 * HKV) * D * 2 + 2 * b * q_len * D * 4
        copies = rotations(nbytes)
        qkvs = [torch.randn(b, q_len, (H + 2 * HKV) * D, device=DEV, generator=gen).bfloat16() for _ in range(copies)]
        pos = [torch.randint(0, 8192, (b, q_len), device=DEV, generator=gen) for _ in range(copies)]
        widx = torch.arange(b * q_len, device=DEV).view(b, q_len)
        pools = [torch.zeros(b * q_len // 64 + 1, 64, HKV, D, device=DEV, dtype=torch.bfloat16) for _ in range(2)]

        def fused(x, p):
            return qkv_rope_write(x, H, None, None, 1e-5, table_cos, table_sin, p, widx, *pools)

        def composite(x, p):
            return decoder.qkv_rope_write(x, H, None, None, 1e-5, table_cos, table_sin, p, widx, *pools)
        report("qkv_rope_write", f"{b}x{q_len}x{H}+{2 * HKV}x{D}",
               [lambda x=x, p=p: fused(x, p) for x, p in zip(qkvs, pos)],
               [lambda x=x, p=p: composite(x, p) for x, p in zip(qkvs, pos)], nbytes)
    for rows in (1, 64, 2048):
        nbytes = 3 * rows * INTER * 2
        gus = [torch.randn(rows, 2 * INTER, device=DEV, generator=gen).bfloat16() for _ in range(rotations(nbytes))]
        report("silu_mul", f"{rows}x{2 * INTER}", [lambda g=g: silu_mul(g) for g in gus],
               [lambda g=g: layers.silu_mul(g) for g in gus], nbytes)
    torch.cuda.empty_cache()


def _sorted_sampler(logits, sampling, out_counts, prompt_counts, slots, do_sample, slot_token, seeds, generated):
    """The sampling variant's token choice before the sort-free rounds (up to 2026-12-06): torch
    penalties, Philox, the vocabulary sorted per row, the filters and the inverse CDF."""
    from flare.model.sampling import _filtered, _invert, _is_greedy, apply_penalties, philox_uniform

    params = sampling[slots]
    penalized = apply_penalties(logits, params, out_counts[slots], prompt_counts[slots] > 0)
    kept, order, keep = _filtered(penalized, params)
    token = _invert(kept, order, keep.sum(dim=-1, keepdim=True) - 1, philox_uniform(seeds[slots], generated[slots]))
    token = torch.where(_is_greedy(params), penalized.argmax(dim=-1), token)
    return torch.where(do_sample, token, slot_token[slots])


def bench_sampling(results: dict, batches=(1, 8, 64, 128, 256)) -> None:
    from flare.contract import (
        SAMPLING_COLUMNS,
        SAMPLING_REPETITION,
        SAMPLING_TEMPERATURE,
        SAMPLING_TOP_K,
        SAMPLING_TOP_P,
    )
    from flare.model.kernels.sampling import greedy_tokens, sample_tokens

    gen = torch.Generator(device=DEV).manual_seed(3)
    print("\n== sampling variant's token choice, 128,256 logits: us per call ==")
    row("rows", "params", "sort-free", "sorted torch", "greedy kernel", "logprobs")
    # Random logits are a flat distribution (the filtered rows' worst case: many rounds); the
    # "peaked" rows lift eight random tokens by 12, so most of the mass sits on a few tokens
    # as after a language model's usual context.
    cases = (("temperature", "temperature 1", 1.0, 0, 1.0, False), ("ollama", "ollama 0.8/40/0.9", 0.8, 40, 0.9, False),
             ("peaked_ollama", "peaked ollama 0.8/40/0.9", 0.8, 40, 0.9, True))
    for key, label, temperature, top_k, top_p, peaked in cases:
        for b in batches:
            slots = b + 1
            sampling = torch.zeros(slots, SAMPLING_COLUMNS, device=DEV)
            sampling[:, SAMPLING_REPETITION] = 1.0
            sampling[:, SAMPLING_TEMPERATURE] = temperature
            sampling[:, SAMPLING_TOP_K] = top_k
            sampling[:, SAMPLING_TOP_P] = top_p
            counts = torch.zeros(slots, VOCAB, dtype=torch.int32, device=DEV)
            seeds = torch.arange(slots, dtype=torch.int64, device=DEV)
            generated = torch.zeros(slots, dtype=torch.int64, device=DEV)
            slot_ids = torch.arange(1, b + 1, device=DEV)
            yes = torch.ones(b, dtype=torch.bool, device=DEV)
            token = torch.zeros(slots, dtype=torch.int64, device=DEV)
            copies = rotations(b * VOCAB * 4, cap=8)
            # peaked like a language model's: a few likely tokens over a long tail
            xs = [torch.randn(b, VOCAB, device=DEV, generator=gen) * 2.0 for _ in range(copies)]
            for x in xs if peaked else ():
                x.scatter_add_(1, torch.randint(0, VOCAB, (b, 8), device=DEV, generator=gen),
                               torch.full((b, 8), 12.0, device=DEV))
            args = [(x, sampling, counts, counts, slot_ids, yes, token, seeds, generated) for x in xs]
            ours = graph_us([lambda a=a: sample_tokens(*a) for a in args])
            ref = graph_us([lambda a=a: _sorted_sampler(*a) for a in args])
            greedy = graph_us([lambda a=a: greedy_tokens(*a[:7]) for a in args])
            logprobs = graph_us([lambda x=x: torch.log_softmax(x, dim=-1).topk(20, dim=-1) for x in xs])
            row(b, label, ours, ref, greedy, logprobs)
            results[f"sampling_b{b}_{key}"] = {"sort_free_us": ours, "sorted_us": ref,
                                                          "greedy_us": greedy, "logprobs_us": logprobs}
            del xs, args
    torch.cuda.empty_cache()


# -- GEMV --------------------------------------------------------------------------

def _weights(gen) -> dict[str, list[torch.Tensor]]:
    w = {name: [(torch.randn(n, k, device=DEV, generator=gen) / math.sqrt(k)).bfloat16() for _ in range(LAYERS)]
         for name, (n, k) in LINEARS.items()}
    w["lm_head"] = [(torch.randn(VOCAB, HIDDEN, device=DEV, generator=gen) / 64).bfloat16()]
    return w


def _shape_calls(ws: list[torch.Tensor], x: torch.Tensor, fn) -> list:
    calls = [lambda w=w: fn(x, w) for w in ws]
    return calls if len(calls) > 1 else calls * 4  # lm_head: 1 GB per call, far past the L2


def bench_gemv(ceiling: float, results: dict, weights, gen, rows=(1, 2, 4, 8)) -> None:
    print("\n== small-batch linear (bf16, 32 distinct weights per shape): us per call, % of copy ceiling ==")
    row("shape", "M", "flare us", "flare %", "cublas us", "cublas %", "speedup", "config")
    for name, ws in weights.items():
        n, k = ws[0].shape
        nbytes = n * k * 2
        for m in rows:
            x = torch.randn(m, k, device=DEV, generator=gen).bfloat16()
            ours = graph_us(_shape_calls(ws, x, linear_small_m))
            ref = graph_us(_shape_calls(ws, x, F.linear))
            pct = lambda us: 100 * nbytes / (us * 1e-6) / 1e9 / ceiling  # noqa: E731
            cfg = default_config(m, n, k, DEV)
            row(name, m, ours, pct(ours), ref, pct(ref), ref / ours,
                f"{cfg.mode}/{cfg.block_n}x{cfg.block_k}/s{cfg.split_k}")
            results[f"linear_{name}_m{m}"] = {"flare_us": ours, "cublas_us": ref, "flare_pct": pct(ours),
                                             "cublas_pct": pct(ref)}


def bench_step(ceiling: float, results: dict, weights, gen) -> None:
    total = sum(w.numel() * 2 for ws in weights.values() for w in ws)
    floor_ms = total / (ceiling * 1e9) * 1e3
    print(f"\n== decode-step weight streaming: {LAYERS} layers + lm_head, {total / 1e9:.2f} GB, "
          f"floor {floor_ms:.2f} ms at the measured ceiling; % = floor / time ==")
    row("M", "flare ms", "flare %", "flare+pdl ms", "flare+pdl %", "cublas ms", "cublas %")
    order = [w for i in range(LAYERS) for w in (weights["qkv"][i], weights["o"][i], weights["gate_up"][i],
                                                  weights["down"][i])] + weights["lm_head"]
    for m in (1, 2, 4, 8):
        xs = {k: torch.randn(m, k, device=DEV, generator=gen).bfloat16() for k in (HIDDEN, INTER)}

        def step(fn):
            return [lambda: [fn(xs[w.shape[1]], w) for w in order]]

        _common.pdl_mode = "off"
        ours_ms = graph_us(step(linear), repeats=10) / 1e3
        _common.pdl_mode = "on"
        pdl_ms = graph_us(step(linear), repeats=10) / 1e3
        _common.pdl_mode = "auto"
        ref_ms = graph_us(step(F.linear), repeats=10) / 1e3
        row(m, ours_ms, 100 * floor_ms / ours_ms, pdl_ms, 100 * floor_ms / pdl_ms, ref_ms, 100 * floor_ms / ref_ms)
        results[f"step_m{m}"] = {"flare_ms": ours_ms, "flare_pdl_ms": pdl_ms, "cublas_ms": ref_ms, "floor_ms": floor_ms,
                                 "flare_pct_of_floor": 100 * floor_ms / ours_ms,
                                 "flare_pdl_pct_of_floor": 100 * floor_ms / pdl_ms,
                                 "cublas_pct_of_floor": 100 * floor_ms / ref_ms}


def sweep_configs(m: int) -> list[GemvConfig]:
    swap = lambda bn, bk, st, **kw: GemvConfig(block_n=bn, block_k=bk, num_stages=st, mode="swap", **kw)  # noqa: E731
    if m > 8:
        # 16-64 rows (decode batches past the GEMV's first range): the weight as the wide
        # operand (64 and 128 rows feed the Hopper warpgroup product) or as the narrow one
        # ("dot": x is the 64-row operand); split K for the narrow shapes' few programs.
        dot = lambda bn, bk, st, **kw: GemvConfig(block_n=bn, block_k=bk, num_stages=st, mode="dot", **kw)  # noqa: E731
        # First (a budget cut keeps them), shapes for the waves: fewer stages or narrower
        # tiles so two or more programs share an SM, a grid of many small tiles (gate/up's 224
        # 128-row tiles at one a multiprocessor leave 40 of 132 idle in their second wave).
        configs = [swap(128, 64, 3), swap(64, 64, 4), swap(64, 64, 6), dot(32, 64, 4), dot(32, 64, 6),
                   dot(16, 128, 4), dot(16, 256, 3), swap(128, 64, 6, num_warps=8), swap(256, 64, 4),
                   swap(128, 128, 2)]
        configs += [swap(64, 128, st) for st in (3, 4, 5)] + [swap(128, 64, st) for st in (4, 6)]
        configs += [swap(128, 128, 3), swap(128, 128, 4, num_warps=8), swap(64, 256, 3), swap(32, 256, 4)]
        configs += [swap(64, 128, 4, split_k=2), swap(32, 256, 4, split_k=2), swap(64, 128, 4, split_k=4)]
        configs += [dot(64, 128, 4), dot(32, 128, 5), dot(128, 64, 4), dot(64, 128, 4, split_k=2)]
        return configs
    configs = [swap(32, 256, st) for st in (4, 5, 6, 7)] + [swap(64, 256, st) for st in (5, 6)]
    configs += [swap(64, 128, st) for st in (4, 5, 6, 7)] + [swap(128, 128, 3), swap(128, 128, 4)]
    configs += [swap(32, 512, 3), swap(32, 512, 4), swap(16, 256, 5), swap(16, 512, 5), swap(32, 256, 5, split_k=2)]
    if m <= gemv.FMA_MAX_ROWS:  # one register accumulator a row, past one row folded 8 columns a thread
        fold = 1 if m == 1 else 8
        for bn, bk, warps in ((8, 512, 2), (8, 1024, 4), (4, 1024, 2), (4, 1024, 4), (16, 512, 4)):
            configs.append(GemvConfig(block_n=bn, block_k=bk, num_warps=warps, num_stages=3, mode="fma", k_fold=fold))
    return configs


def bench_attention_sweep(results: dict, *, decode: bool = True) -> None:
    """Decode split counts and stages (unless ``decode`` is False), prefill launch shapes."""
    from flare.model.attention import PackedRows
    from flare.model.kernels import (
        AttentionLaunch,
        packed_rows_attention,
        paged_decode_attention,
        paged_prefill_attention,
    )
    gen = torch.Generator(device=DEV).manual_seed(3)
    scale = D ** -0.5
    table = {}
    print("\n== attention sweep: decode (splits / stages), us per call ==")
    for b, ctx in ((1, 1024), (1, 8192), (8, 8192), (32, 1024), (64, 8192)) if decode else ():
        copies = rotations(2 * b * ctx * HKV * D * 2)
        k_pool, v_pool, batches, qs = _decode_inputs(b, ctx, copies, gen)
        found = {}
        variants = [(None, AttentionLaunch(pages_per_step=pps, num_stages=st)) for pps in (1, 2) for st in (2, 3, 4)]
        variants += [(None, AttentionLaunch(waves=w)) for w in (2, 4, 16)]
        variants += [(sp, AttentionLaunch()) for sp in (1, 2, 4, 8, 16)]
        for splits, launch in variants:
            us = graph_us([lambda q=q, bt=bt: paged_decode_attention(q, k_pool, v_pool, bt, scale, num_splits=splits,
                                                                     launch=launch) for q, bt in zip(qs, batches)])
            found[f"splits={splits} {launch}"] = us
        best = min(found, key=found.get)
        print(f"  B={b} ctx={ctx}: best {found[best]:.2f} us with {best}")
        for name, us in sorted(found.items(), key=lambda kv: kv[1]):
            print(f"      {us:9.2f}  {name}")
        table[f"decode_b{b}_ctx{ctx}"] = found
        del k_pool, v_pool, batches, qs
        torch.cuda.empty_cache()
    print("\n== attention sweep: prefill launch shapes, us per call ==")
    for q_len, prefix in ((2048, 0), (512, 4096), (64, 8000)):
        ctx = prefix + q_len
        pages = -(-ctx // PAGE)
        k_pool = torch.randn(1 + pages, PAGE, HKV, D, device=DEV, generator=gen, dtype=torch.bfloat16)
        v_pool = torch.randn_like(k_pool)
        table_ = torch.zeros(1, PMAX, dtype=torch.int64, device=DEV)
        table_[0, :pages] = torch.arange(1, 1 + pages, device=DEV)
        positions = (prefix + torch.arange(q_len, device=DEV)).view(1, q_len)
        bt = AttentionBatch(positions, positions, table_, torch.tensor([ctx], device=DEV))
        q = torch.randn(1, q_len, H, D, device=DEV, generator=gen, dtype=torch.bfloat16)
        table[f"prefill_q{q_len}_prefix{prefix}"] = _prefill_shapes(
            f"Q={q_len} prefix={prefix}", lambda launch: paged_prefill_attention(q, k_pool, v_pool, bt, scale,
                                                                                 launch=launch))
    # A MIXED step's packed rows: two fresh 1,024-token prompts, and four 512-token chunks over
    # 1,536 cached tokens each (packed_rows_attention, what the serving steps launch).
    for rows_n, q_len, prefix in ((2, 1024, 0), (4, 512, 1536)):
        ctx = prefix + q_len
        pages = -(-ctx // PAGE)
        k_pool = torch.randn(1 + rows_n * pages, PAGE, HKV, D, device=DEV, generator=gen, dtype=torch.bfloat16)
        v_pool = torch.randn_like(k_pool)
        page_table = torch.zeros(rows_n, PMAX, dtype=torch.int64, device=DEV)
        page_table[:, :pages] = torch.arange(1, 1 + rows_n * pages, device=DEV).view(rows_n, pages)
        lens = torch.full((rows_n,), q_len, dtype=torch.int64, device=DEV)
        rows = PackedRows(positions=(prefix + torch.arange(q_len, device=DEV)).repeat(rows_n),
                          q_start=torch.arange(rows_n, device=DEV) * q_len, q_len=lens, page_table=page_table,
                          kv_lens=torch.full((rows_n,), ctx, dtype=torch.int64, device=DEV))
        q = torch.randn(rows_n * q_len, H, D, device=DEV, generator=gen, dtype=torch.bfloat16)
        table[f"packed_{rows_n}x{q_len}_prefix{prefix}"] = _prefill_shapes(
            f"packed {rows_n} x {q_len} prefix={prefix}",
            lambda launch: packed_rows_attention(q, k_pool, v_pool, rows, scale, launch=launch))
    results["attention_sweep"] = table


def _prefill_shapes(label: str, call) -> dict[str, float]:
    """us per call of ``call(launch)`` over the prefill launch shapes, printed best first."""
    from flare.model.kernels import AttentionLaunch
    found = {}
    for bm, warps in ((64, 4), (128, 4), (128, 8)):
        for pps in (1, 2):
            for st in (2, 3):
                for unmasked in (False, True):
                    launch = AttentionLaunch(block_m=bm, num_warps=warps, num_stages=st, pages_per_step=pps, waves=2,
                                             unmasked_steps=unmasked)
                    try:
                        found[str(launch)] = graph_us([lambda: call(launch)])
                    except Exception as exc:
                        print(f"  skip {launch}: {type(exc).__name__}: {str(exc)[:100]}")
    best = min(found, key=found.get)
    print(f"  {label}: best {found[best]:.2f} us with {best}")
    for name, us in sorted(found.items(), key=lambda kv: kv[1]):
        print(f"      {us:9.2f}  {name}")
    return found


def bench_sweep(ceiling: float, results: dict, weights, gen, budget_s: float, rows=(1, 8)) -> None:
    """Each row count gets its share of the budget; configs run in sweep_configs' order, each
    over every shape, so a budget cut leaves every shape measured with the same configs."""
    print("\n== GemvConfig sweep: best per shape (% of copy ceiling) ==")
    row("shape", "M", "best %", "default %", "cublas %", "best config")
    table = {}
    for m in rows:
        deadline = time.monotonic() + budget_s / len(rows)
        shapes = {}
        for name, ws in weights.items():
            n, k = ws[0].shape
            shapes[name] = (ws, torch.randn(m, k, device=DEV, generator=gen).bfloat16(), n * k * 2, [])
        for cfg in sweep_configs(m):
            if time.monotonic() > deadline:
                break
            for name, (ws, x, nbytes, scores) in shapes.items():
                try:
                    us = graph_us(_shape_calls(ws, x, lambda x, w, c=cfg: linear_small_m(x, w, config=c)), repeats=7)
                except Exception as exc:  # a shape that does not compile (resources): report and go on
                    print(f"  skip {cfg}: {type(exc).__name__}: {str(exc)[:120]}")
                    continue
                scores.append((100 * nbytes / (us * 1e-6) / 1e9 / ceiling, cfg))
        for name, (ws, x, nbytes, scores) in shapes.items():
            if not scores:
                continue
            pct = lambda us: 100 * nbytes / (us * 1e-6) / 1e9 / ceiling  # noqa: E731
            best_pct, best = max(scores, key=lambda s: s[0])
            default_pct = pct(graph_us(_shape_calls(ws, x, linear_small_m), repeats=7))
            cublas_pct = pct(graph_us(_shape_calls(ws, x, F.linear), repeats=7))
            row(name, m, best_pct, default_pct, cublas_pct, f"{best}")
            table[f"{name}_m{m}"] = {"best_pct": best_pct, "default_pct": default_pct, "cublas_pct": cublas_pct,
                                     "best": best.__dict__,
                                     "all": [(round(p, 1), c.__dict__) for p, c in sorted(scores, key=lambda s: -s[0])]}
    results["sweep"] = table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="attention,elementwise,gemv,step")
    parser.add_argument("--sweep", default="",
                        help="comma list of gemv,attention,prefill (attention without its decode part): "
                        "time launch-shape grids")
    parser.add_argument("--sweep-budget-s", type=float, default=240.0)
    parser.add_argument("--rows", default="1,2,4,8", help="M values of the gemv section")
    parser.add_argument("--sweep-rows", default="1,8", help="M values of the gemv sweep")
    parser.add_argument("--json", help="also write the results object here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print(json.dumps({"error": "CUDA is not available"}))
        sys.exit(1)
    sections = set(args.only.split(","))
    props = torch.cuda.get_device_properties(0)
    ceiling, ways = copy_ceiling_gbs()
    print(f"device {props.name}, {props.multi_processor_count} SMs, torch {torch.__version__}; "
          f"copy ceiling {ceiling:.0f} GB/s (read + write; " + ", ".join(f"{k} {v:.0f}" for k, v in ways.items()) + ")")
    results: dict = {"device": props.name, "copy_ceiling_gbs": ceiling, "copy_ways_gbs": ways}
    with torch.inference_mode():
        if "attention" in sections:
            bench_attention(ceiling, results)
        if "elementwise" in sections:
            bench_elementwise(ceiling, results)
        sweeps = set(filter(None, args.sweep.split(",")))
        if sweeps & {"attention", "prefill"}:
            bench_attention_sweep(results, decode="attention" in sweeps)
        if sections & {"gemv", "step"} or "gemv" in sweeps:
            gen = torch.Generator(device=DEV).manual_seed(2)
            weights = _weights(gen)
            if "gemv" in sweeps:
                bench_sweep(ceiling, results, weights, gen, args.sweep_budget_s,
                            [int(m) for m in args.sweep_rows.split(",")])
            if "gemv" in sections:
                bench_gemv(ceiling, results, weights, gen, [int(m) for m in args.rows.split(",")])
            if "step" in sections:
                bench_step(ceiling, results, weights, gen)
        if "sampling" in sections:
            bench_sampling(results)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    summary = {k: v for k, v in results.items() if not k.endswith("sweep")}
    print(json.dumps(summary, default=str))


if __name__ == "__main__":
    main()
