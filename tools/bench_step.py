#!/usr/bin/env python3
"""One decode step of a random-weight model shape, CUDA-graph timed, in kernel-level variants.

The step is what a greedy decode graph runs for its model: ``Decoder.forward`` over
the paged KV cache, the float32 logits and the two-launch greedy token choice, with
the serving kernels (``cuda_ops``). The slot bookkeeping around it (gathers of slot
state, records) is left out: this tool is for A/B checks of kernel changes in one
call, and tools/bench_gpu.py measures the real step. Each variant is captured in its
own graph and replayed back to back; the figure is the median of several timed runs
of many replays (CUDA events), against the HBM floor for the bytes the step reads
(every weight but the embedding table, plus the cached K/V) at the measured copy
ceiling. ``--profile`` lists the kernels of one replay of the first variant by
summed device time.

    python tools/bench_step.py [--shape llama3-8b] [--batch 1] [--cached 192]
                               [--variants serving,no_pdl,unfused] (see VARIANTS) [--profile]
    python tools/bench_step.py --mixed 2048:0,1024:64 --mixed-rows 2 --cached 1152 --context 2048 [--sustained 5]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_gpu import COPY_CEILING_BPS, SHAPES  # noqa: E402
from bench_kernels import read_ceiling_gbs, replay_ms  # noqa: E402

from flare.contract import SAMPLING_COLUMNS  # noqa: E402
from flare.model import kernels  # noqa: E402
from flare.model.attention import PAGE_TOKENS, AttentionBatch, KVCache, PackedBatch, PackedRows  # noqa: E402
from flare.model.checkpoint import random_runtime_weights  # noqa: E402
from flare.model.decoder import Decoder, cuda_ops  # noqa: E402
from flare.model.kernels import _common, attention, elementwise, gemv  # noqa: E402
from flare.model.kernels._common import wait_for_inputs  # noqa: E402
from flare.model.kernels.sampling import greedy_tokens  # noqa: E402
from flare.model.spec import ModelSpec  # noqa: E402

DEV = torch.device("cuda")


def make_spec(shape: str) -> ModelSpec:
    c = SHAPES[shape]
    return ModelSpec(family="llama", architecture="LlamaForCausalLM", vocab_size=c["vocab_size"],
                     hidden_size=c["hidden_size"], intermediate_size=c["intermediate_size"],
                     num_layers=c["num_hidden_layers"], num_heads=c["num_attention_heads"],
                     num_kv_heads=c["num_key_value_heads"], head_dim=c["hidden_size"] // c["num_attention_heads"],
                     rms_norm_eps=c["rms_norm_eps"], rope_theta=c["rope_theta"],
                     max_position_embeddings=c["max_position_embeddings"],
                     tie_word_embeddings=c["tie_word_embeddings"], qkv_bias=False, qk_norm=False)


class Step:
    """Inputs and persistent state of one decode step at batch ``b`` with ``cached`` keys per row."""

    def __init__(self, decoder: Decoder, b: int, cached: int, max_pages: int):
        spec = decoder.spec
        self.decoder, self.b = decoder, b
        self.kv = KVCache.allocate(spec.num_layers, b * max_pages + 1, spec.num_kv_heads, spec.head_dim,
                                   torch.bfloat16, DEV)
        for pool in self.kv.k + self.kv.v:
            pool.normal_()
        table = 1 + torch.arange(b * max_pages, device=DEV).view(b, max_pages)
        positions = torch.full((b, 1), cached - 1, device=DEV)
        self.batch = AttentionBatch(positions=positions,
                                    write_index=table.gather(1, positions // PAGE_TOKENS) * PAGE_TOKENS
                                    + positions % PAGE_TOKENS,
                                    page_table=table, kv_lens=torch.full((b,), cached, device=DEV))
        self.tokens = torch.randint(1000, 100000, (b, 1), device=DEV)
        slots = b + 1
        self.sampling = torch.ones(slots, SAMPLING_COLUMNS, device=DEV)
        self.sampling[:, 1:] = 0.0  # repetition 1, no presence or frequency penalty
        self.counts = torch.zeros(slots, spec.vocab_size, dtype=torch.int32, device=DEV)
        self.prompt_counts = torch.zeros_like(self.counts)
        self.slots = torch.arange(b, device=DEV)
        self.do_sample = torch.ones(b, dtype=torch.bool, device=DEV)
        self.slot_token = torch.zeros(slots, dtype=torch.int64, device=DEV)
        self.bytes = (sum(t.numel() * t.element_size() for name, t in decoder.w.items() if name != "embed")
                      + 2 * spec.num_layers * b * cached * spec.num_kv_heads * spec.head_dim * 2)

    def __call__(self) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (float32 logits, greedy tokens)."""
        hidden = self.decoder.forward(self.tokens, self.batch, self.kv)
        logits = self.decoder.logits(hidden)
        return logits, greedy_tokens(logits, self.sampling, self.counts, self.prompt_counts, self.slots,
                                     self.do_sample, self.slot_token)


class MixedStep:
    """Inputs and state of one MIXED step, as flare/model/programs.py builds it: ``p`` prompt
    tokens in ``rows`` packed prefill rows (each after ``prefix`` cached keys; 0: fresh
    prompts), then ``w`` decode rows at ``cached`` keys; every row's last token sampled
    greedily. The sampled rows' logits and token choice are the decode step's."""

    def __init__(self, decoder: Decoder, p: int, w: int, rows: int, prefix: int, cached: int, max_pages: int):
        spec = decoder.spec
        self.decoder, self.p, self.w, self.rows = decoder, p, w, rows
        n = rows + w
        self.kv = KVCache.allocate(spec.num_layers, n * max_pages + 1, spec.num_kv_heads, spec.head_dim,
                                   torch.bfloat16, DEV)
        for pool in self.kv.k + self.kv.v:
            pool.normal_()
        table = 1 + torch.arange(n * max_pages, device=DEV).view(n, max_pages)
        q_len = torch.full((rows,), p // rows, device=DEV)
        q_len[-1] += p - int(q_len.sum())
        q_start = torch.cumsum(q_len, 0) - q_len
        row_of = torch.repeat_interleave(torch.arange(rows, device=DEV), q_len)
        positions = prefix + torch.arange(p, device=DEV) - q_start[row_of]
        write = table[row_of, positions // PAGE_TOKENS] * PAGE_TOKENS + positions % PAGE_TOKENS
        packed = PackedRows(positions=positions, q_start=q_start, q_len=q_len, page_table=table[:rows],
                            kv_lens=prefix + q_len)
        decode = None
        sample = q_start + q_len - 1
        if w:
            dtable = table[rows:]
            dpos = torch.full((w, 1), cached - 1, device=DEV)
            dwrite = dtable.gather(1, dpos // PAGE_TOKENS) * PAGE_TOKENS + dpos % PAGE_TOKENS
            decode = AttentionBatch(positions=dpos, write_index=dwrite, page_table=dtable,
                                    kv_lens=torch.full((w,), cached, device=DEV))
            positions = torch.cat([positions, dpos.view(-1)])
            write = torch.cat([write, decode.write_index.view(-1)])
            sample = torch.cat([sample, torch.arange(p, p + w, device=DEV)])
        self.batch = PackedBatch(positions=positions.view(1, -1), write_index=write.view(1, -1), prefill=packed,
                                 decode=decode)
        self.sample_index = sample
        self.tokens = torch.randint(1000, 100000, (1, p + w), device=DEV)
        self.sampling = torch.ones(n + 1, SAMPLING_COLUMNS, device=DEV)
        self.sampling[:, 1:] = 0.0
        self.counts = torch.zeros(n + 1, spec.vocab_size, dtype=torch.int32, device=DEV)
        self.prompt_counts = torch.zeros_like(self.counts)
        self.slots = torch.arange(n, device=DEV)
        self.do_sample = torch.ones(n, dtype=torch.bool, device=DEV)
        self.slot_token = torch.zeros(n + 1, dtype=torch.int64, device=DEV)

    def __call__(self) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.decoder.forward(self.tokens, self.batch, self.kv, self.sample_index)
        logits = self.decoder.logits(hidden)
        return logits, greedy_tokens(logits, self.sampling, self.counts, self.prompt_counts, self.slots,
                                     self.do_sample, self.slot_token)


def capture(step: Step) -> tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, torch.Tensor]]:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.inference_mode(), torch.cuda.stream(stream):
        for _ in range(2):
            step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.inference_mode(), torch.cuda.graph(graph, stream=stream):
        outputs = step()
    torch.cuda.synchronize()
    return graph, outputs


def profile(graph: torch.cuda.CUDAGraph, out: Path | None,
            replays: int = 5) -> list[tuple[str, float, float, int, float]]:
    """Kernels of ``replays`` replays by name: (name, exposed us, device us, launches, idle us), per replay.

    Kernels may overlap under PDL, so each one's own duration (device us) overstates
    its cost; its exposed time is how far it moved the latest end seen so far, in start
    order: what the step would lose without it, and the exposed times add up to the step.
    Idle us is the part of the exposed time before the kernel started, when no kernel ran:
    the launch boundary's cost (between replays excluded).
    Batch-1 GEMVs are told apart by their place in the layer (qkv, o, gate_up, down).
    """
    from torch.profiler import DeviceType, ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    events = sorted((e for e in prof.events() if e.device_type == DeviceType.CUDA), key=lambda e: e.time_range.start)
    gemvs = [e for e in events if e.name == "_linear_small_m_kernel"]
    per_step = len(gemvs) // replays
    roles = {id(e): ("lm_head" if i % per_step == per_step - 1 else ("qkv", "o", "gate_up", "down")[i % per_step % 4])
             for i, e in enumerate(gemvs)}
    sums: dict[str, list[float]] = {}
    latest = None
    per_replay = len(events) // replays
    for index, e in enumerate(events):
        name = f"gemv {roles[id(e)]}" if id(e) in roles else e.name
        exposed = e.time_range.end - latest if latest is not None else e.time_range.elapsed_us()
        idle = e.time_range.start - latest if latest is not None else 0.0
        latest = e.time_range.end if latest is None else max(latest, e.time_range.end)
        row = sums.setdefault(name, [0.0, 0.0, 0, 0.0])
        row[0] += max(0.0, exposed)
        row[1] += e.time_range.elapsed_us()
        row[2] += 1
        row[3] += max(0.0, idle) if index % per_replay else 0.0  # a replay's first kernel: between replays
    rows = sorted(((name, exp / replays, dur / replays, n // replays, idle / replays)
                   for name, (exp, dur, n, idle) in sums.items()), key=lambda r: -r[1])
    if out is not None:
        (out / "bench_step_profile.json").write_text(json.dumps(rows, indent=1))
    return rows


@dataclass(frozen=True)
class Variant:
    """Kernel switches of one step variant (the defaults are the serving configuration)."""

    pdl: str = "on"  # _common.pdl_mode
    level: int = 2  # _common.PDL_AUTO_LEVEL
    preload: int = 1  # gemv.PRELOAD_TILES
    k_fold: int = 1  # gemv.K_FOLD (batch-1 GEMVs)
    # "silu", "rope": run those epilogues as their own kernels; "norm": the RMSNorms and
    # residual adds as elementwise kernels, not inside the GEMVs
    unfused: tuple[str, ...] = ()
    max_splits: int = 16  # attention.MAX_SPLITS
    attention: dict = field(default_factory=dict)  # AttentionLaunch overrides of DECODE_LAUNCH
    norm_warps: int = 8  # elementwise.NORM_WARPS_WIDE
    gemv_shapes: dict = field(default_factory=dict)  # gemv.SHAPE_OVERRIDES at batch 1
    multi_row: dict = field(default_factory=dict)  # gemv.MULTI_ROW_OVERRIDES (2..8 rows)
    wide_rows: dict = field(default_factory=dict)  # gemv.WIDE_ROW_OVERRIDES (9..64 rows)
    routed_rows: tuple = gemv.ROUTED_ROWS  # row ranges the selectors send to the GEMV rather than cuBLAS
    merge_rows: int = 16  # attention.MERGE_ROWS
    # Extra one-program kernels after each layer's attention (PDL like the step's own): what
    # one more kernel boundary in the chain costs.
    extra_kernels: int = 0
    # Whether the logits must equal the serving variant's bit for bit: launch-only changes
    # compute the same function in the same order; the unfused RoPE epilogue accumulates
    # with contraction, and other warp counts reduce in another order.
    exact: bool = True


# The qkv product's tile variants were measured unfolded, before it folded its
# accumulator under a register cap by default; they keep measuring that.
QKV_UNFOLDED = {"k_fold": 1, "max_registers": 0}

VARIANTS = {
    "serving": Variant(),
    "pdl1": Variant(level=1),
    "no_pdl": Variant(pdl="off"),
    "unfused_silu": Variant(unfused=("silu",)),
    "unfused_rope": Variant(unfused=("rope",), exact=False),
    "unfused": Variant(unfused=("silu", "rope"), exact=False),
    "unfused_norm": Variant(unfused=("norm",), exact=False),
    "preload2": Variant(preload=2),
    "splits4": Variant(max_splits=4),
    "merge_in_kernel": Variant(attention={"merge_in_kernel": True}),
    "no_attn_preload": Variant(attention={"preload": False}),
    # The FMA accumulator folded 8 columns a thread (GemvConfig.k_fold): about half the
    # registers, so larger tiles or fewer warps fit as many programs an SM.
    "fold8": Variant(k_fold=8, exact=False),
    "fold8_gate_up_w2": Variant(k_fold=8, gemv_shapes={(28672, 4096): {"num_warps": 2}}, exact=False),
    "fold8_qkv_8x1024_w4": Variant(k_fold=8, gemv_shapes={(6144, 4096): {"block_n": 8, "num_warps": 4,
                                                                         "max_registers": 0}}, exact=False),
    # The qkv product folds at 8 under an 80-register cap by default (one wave of 12
    # programs an SM); these are the other choices.
    "qkv_plain": Variant(gemv_shapes={(6144, 4096): QKV_UNFOLDED}, exact=False),
    "qkv_fold8_nocap": Variant(gemv_shapes={(6144, 4096): {"max_registers": 0}}, exact=False),
    "qkv_fold8_r72": Variant(gemv_shapes={(6144, 4096): {"max_registers": 72}}, exact=False),
    "qkv_fold8_8x1024_w4_r80": Variant(gemv_shapes={(6144, 4096): {"block_n": 8, "num_warps": 4}}, exact=False),
    "fold8_o_down_16x1024": Variant(k_fold=8, gemv_shapes={(4096, 4096): {"block_n": 16},
                                                          (4096, 14336): {"block_n": 16}}, exact=False),
    "qkv_2x1024_w1": Variant(gemv_shapes={(6144, 4096): {**QKV_UNFOLDED, "block_n": 2, "num_warps": 1}}, exact=False),
    "qkv_4x1024_w1": Variant(gemv_shapes={(6144, 4096): {**QKV_UNFOLDED, "num_warps": 1}}, exact=False),
    "qkv_4x1024_w4": Variant(gemv_shapes={(6144, 4096): {**QKV_UNFOLDED, "num_warps": 4}}, exact=False),
    "gate_up_4x2048_w4": Variant(gemv_shapes={(28672, 4096): {"block_k": 2048}}, exact=False),
    "gate_up_4x2048_w8": Variant(gemv_shapes={(28672, 4096): {"block_k": 2048, "num_warps": 8}}, exact=False),
    "gate_up_preload2": Variant(gemv_shapes={(28672, 4096): {"preload_tiles": 2}}),
    "gate_up_4x1024_w2": Variant(gemv_shapes={(28672, 4096): {"num_warps": 2}}, exact=False),
    "gate_up_4x1024_w8": Variant(gemv_shapes={(28672, 4096): {"num_warps": 8}}, exact=False),
    "gate_up_8x1024_w8": Variant(gemv_shapes={(28672, 4096): {"block_n": 8, "num_warps": 8}}, exact=False),
    "lm_head_4x1024_w4": Variant(gemv_shapes={(128256, 4096): {"num_warps": 4}}, exact=False),
    "o_down_8x1024_w8": Variant(gemv_shapes={(4096, 4096): {"block_n": 8, "num_warps": 8},
                                             (4096, 14336): {"block_n": 8, "num_warps": 8}}, exact=False),
    "qkv_8x1024_w4": Variant(gemv_shapes={(6144, 4096): {**QKV_UNFOLDED, "block_n": 8, "num_warps": 4}}, exact=False),
    "attn_warps2": Variant(attention={"num_warps": 2}, exact=False),
    "attn_stages2": Variant(attention={"num_stages": 2}),
    "merge_rows4": Variant(merge_rows=4),
    "norm_warps4": Variant(norm_warps=4, exact=False),
    "norm_warps2": Variant(norm_warps=2, exact=False),
    # Llama-3-8B's o projection is [4096, 4096], its lm_head [128256, 4096]. A variant that
    # names no warp count takes the current default's (the gate/up product's went from two
    # to four after the gate_up_8x512 and gate_up_4x512 figures in TUNING.md were taken).
    "o_preload2": Variant(gemv_shapes={(4096, 4096): {"preload_tiles": 2}}),
    # Other tiles sum in another order: not bit-identical.
    "qkv_2x1024": Variant(gemv_shapes={(6144, 4096): {**QKV_UNFOLDED, "block_n": 2}}, exact=False),
    "o_2x1024": Variant(gemv_shapes={(4096, 4096): {"block_n": 2}}, exact=False),
    "down_2x1024": Variant(gemv_shapes={(4096, 14336): {"block_n": 2}}, exact=False),
    "narrow_2x1024": Variant(gemv_shapes={(6144, 4096): {**QKV_UNFOLDED, "block_n": 2}, (4096, 4096): {"block_n": 2},
                                          (4096, 14336): {"block_n": 2}}, exact=False),
    "gate_up_8x512": Variant(gemv_shapes={(28672, 4096): {"block_n": 8, "block_k": 512}}, exact=False),
    "gate_up_8x1024_w4": Variant(gemv_shapes={(28672, 4096): {"block_n": 8, "block_k": 1024, "num_warps": 4}},
                                 exact=False),
    "o_8x512": Variant(gemv_shapes={(4096, 4096): {"block_n": 8, "block_k": 512}}, exact=False),
    "gate_up_o_8x512": Variant(gemv_shapes={(28672, 4096): {"block_n": 8, "block_k": 512},
                                            (4096, 4096): {"block_n": 8, "block_k": 512}}, exact=False),
    "qkv_8x512": Variant(gemv_shapes={(6144, 4096): {**QKV_UNFOLDED, "block_n": 8, "block_k": 512}}, exact=False),
    # 4 x 512 tiles: half the tile's registers, so more programs a multiprocessor (qkv
    # takes 153 registers with 4 x 1024 over two warps: 6 an SM, its 1,536 in 1.94 waves).
    "qkv_4x512": Variant(gemv_shapes={(6144, 4096): {**QKV_UNFOLDED, "block_k": 512}}, exact=False),
    "o_4x512": Variant(gemv_shapes={(4096, 4096): {"block_k": 512}}, exact=False),
    "down_4x512": Variant(gemv_shapes={(4096, 14336): {"block_k": 512}}, exact=False),
    "gate_up_4x512": Variant(gemv_shapes={(28672, 4096): {"block_k": 512}}, exact=False),
    "narrow_4x512": Variant(gemv_shapes={(6144, 4096): {**QKV_UNFOLDED, "block_k": 512}, (4096, 4096): {"block_k": 512},
                                         (4096, 14336): {"block_k": 512}}, exact=False),
    # The o and down GEMVs (the fused norms' producers) with 8 x 1024 tiles over 4 warps.
    "o_down_8x1024_w4": Variant(gemv_shapes={(4096, 4096): {"block_n": 8, "num_warps": 4},
                                             (4096, 14336): {"block_n": 8, "num_warps": 4}}, exact=False),
    "extra_kernel": Variant(extra_kernels=1),
    "extra_kernels4": Variant(extra_kernels=4),
    # One attention program per (row, kv head): no merge kernel, the pages in sequence.
    "splits1": Variant(max_splits=1, exact=False),
    "splits1_pps2": Variant(max_splits=1, attention={"pages_per_step": 2}, exact=False),
    "splits1_pps4_w8": Variant(max_splits=1, attention={"pages_per_step": 4, "num_warps": 8, "num_stages": 1},
                               exact=False),
}
# 2..8 rows (a width-5 verification at batch 1 is five): the swap-mode tiles. The defaults give
# Llama-3-8B's o and down 128 programs (under one per SM) and qkv 96.
QKV, O_PROJ, GATE_UP, DOWN, LM_HEAD = (6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (128256, 4096)


def _tiles(shapes, **cfg) -> dict:
    return {shape: dict(cfg) for shape in shapes}


NARROW = (QKV, O_PROJ, DOWN)
VARIANTS.update({
    "mr_narrow_bn16": Variant(multi_row=_tiles(NARROW, block_n=16, block_k=256, num_stages=5), exact=False),
    "mr_narrow_bn16_s4": Variant(multi_row=_tiles(NARROW, block_n=16, block_k=256, num_stages=4), exact=False),
    "mr_narrow_bn16_k512": Variant(multi_row=_tiles(NARROW, block_n=16, block_k=512, num_stages=3), exact=False),
    "mr_narrow_bn16_w2": Variant(multi_row=_tiles(NARROW, block_n=16, block_k=256, num_stages=5, num_warps=2),
                                 exact=False),
    "mr_narrow_bn32_k128": Variant(multi_row=_tiles(NARROW, block_n=32, block_k=128, num_stages=8), exact=False),
    "mr_all_bn16": Variant(multi_row=_tiles(NARROW + (GATE_UP, LM_HEAD), block_n=16, block_k=256, num_stages=5),
                           exact=False),
    "mr_all_bn32_k256": Variant(multi_row=_tiles(NARROW + (GATE_UP, LM_HEAD), block_n=32, block_k=256,
                                                 num_stages=5), exact=False),
    "mr_gate_up_bn32": Variant(multi_row=_tiles((GATE_UP,), block_n=32, block_k=256, num_stages=5), exact=False),
})
# Decode batches of 9..64 rows through the GEMV kernel (its tensor-core tiles and the fused
# epilogues) or through cuBLAS and the elementwise kernels ("cublas_wide"; gemv.ROUTED_ROWS
# sends every row count up to 64 to the kernel). The variants below override the defaults
# (gemv.default_config), which changed since some were measured: up to 32 rows the narrow
# shapes split K with the last program reducing; every wide launch now lets the next kernel
# start after its K loop, with nothing loaded before its wait (w_pdl_late_p0).
ALL_WIDE, ONLY_EIGHT = ((1, 64),), ((1, 8),)
SHALLOW = {QKV: {"num_stages": 4}, O_PROJ: {"num_stages": 5}, DOWN: {"num_stages": 5}}
VARIANTS.update({
    "wide": Variant(routed_rows=ALL_WIDE, exact=False),
    "wide_no_pdl": Variant(routed_rows=ALL_WIDE, pdl="off", exact=False),
    "wide_shallow": Variant(routed_rows=ALL_WIDE, wide_rows=SHALLOW, exact=False),
    "cublas_wide": Variant(routed_rows=ONLY_EIGHT, exact=False),
    # the narrow shapes as 64-row warpgroup tiles of the weight
    "wide_swap_s6": Variant(routed_rows=ALL_WIDE, wide_rows=_tiles(NARROW, mode="swap", block_n=64, block_k=128,
                                                                   num_stages=6), exact=False),
    "wide_swap_k64_s8": Variant(routed_rows=ALL_WIDE, wide_rows=_tiles(NARROW, mode="swap", block_n=64,
                                                                       block_k=64, num_stages=8), exact=False),
})
# The wide launches without programmatic dependent launch (GemvConfig.pdl), and the narrow
# shapes as 128- or 64-row weight tiles with K split and the last program of each tile
# reducing (GemvConfig.last_reduces): more programs than output tiles, and an x tile re-read
# by a quarter (or half) as many programs as with the 32-row tiles.
EVERY = NARROW + (GATE_UP, LM_HEAD)
PLAIN = _tiles(EVERY, pdl=False)


def _split(block_n: int, block_k: int, stages: int, splits: dict, **extra) -> dict:
    return {shape: dict(mode="swap", block_n=block_n, block_k=block_k, num_stages=stages, split_k=s,
                        last_reduces=True, **extra) for shape, s in splits.items()}


SPLIT_128 = _split(128, 64, 6, {QKV: 4, O_PROJ: 4, DOWN: 8})
SPLIT_128_S2 = _split(128, 64, 6, {QKV: 2, O_PROJ: 2, DOWN: 4})
SPLIT_64 = _split(64, 128, 6, {QKV: 2, O_PROJ: 2, DOWN: 4})


def _merge(*overrides: dict) -> dict:
    out: dict = {}
    for o in overrides:
        for shape, cfg in o.items():
            out[shape] = {**out.get(shape, {}), **cfg}
    return out


VARIANTS.update({
    "wide_plain": Variant(routed_rows=ALL_WIDE, wide_rows=PLAIN, exact=False),
    "wide_split128": Variant(routed_rows=ALL_WIDE, wide_rows=SPLIT_128, exact=False),
    "wide_split128_plain": Variant(routed_rows=ALL_WIDE, wide_rows=_merge(PLAIN, SPLIT_128), exact=False),
    "wide_split128_s2": Variant(routed_rows=ALL_WIDE, wide_rows=SPLIT_128_S2, exact=False),
    "wide_split64": Variant(routed_rows=ALL_WIDE, wide_rows=SPLIT_64, exact=False),
    "wide_split64_plain": Variant(routed_rows=ALL_WIDE, wide_rows=_merge(PLAIN, SPLIT_64), exact=False),
    # against the defaults (narrow shapes split up to 32 rows, wide launches plain past 32)
    "wide_pdl": Variant(routed_rows=ALL_WIDE, wide_rows=_tiles(EVERY, pdl=True), exact=False),
    "wide_all_plain": Variant(routed_rows=ALL_WIDE, wide_rows=PLAIN, exact=False),
    "wide_split128_gu2": Variant(routed_rows=ALL_WIDE, wide_rows=_merge(SPLIT_128, _split(128, 64, 6, {GATE_UP: 2})),
                                 exact=False),
})
# Tiles for the waves at 33..64 rows: gate/up's 224 128-row tiles take one 147 KB program an SM,
# so their second wave leaves 40 of 132 multiprocessors idle (three stages: three programs an
# SM, the grid resident at once); qkv's 96 64-row tiles leave 36 idle (x as the 64-row side
# over 32- or 16-row weight tiles: 192 or 384 programs); o's and down's 128 32-row tiles run
# one 172 KB program an SM (16-row tiles over four stages: two an SM).
def _wide(mode: str, block_n: int, block_k: int, stages: int, *shapes) -> dict:
    return _tiles(shapes, mode=mode, block_n=block_n, block_k=block_k, num_stages=stages)


GU_S3 = _wide("swap", 128, 64, 3, GATE_UP)
QKV_DOT32 = _wide("dot", 32, 64, 6, QKV)
OD_DOT16 = _wide("dot", 16, 128, 4, O_PROJ, DOWN)
VARIANTS.update({
    "w_gu_s3": Variant(wide_rows=GU_S3, exact=False),  # the default since (gemv.default_config)
    "w_gu_64x64s4": Variant(wide_rows=_wide("swap", 64, 64, 4, GATE_UP), exact=False),
    "w_qkv_dot32k64": Variant(wide_rows=QKV_DOT32, exact=False),
    "w_qkv_dot16": Variant(wide_rows=_wide("dot", 16, 128, 4, QKV), exact=False),
    "w_od_dot16": Variant(wide_rows=OD_DOT16, exact=False),
    "w_combo": Variant(wide_rows=_merge(GU_S3, QKV_DOT32, OD_DOT16), exact=False),
})
# Decode attention at batch 9 and up: a minimum of steps (64-key pages) a context split, so a
# short row runs in fewer of the launch's static splits; with the last split merging (no merge
# kernel), a row within one split writes its output directly.
VARIANTS.update({
    "ms2": Variant(attention={"min_split_steps": 2}, exact=False),
    "ms4": Variant(attention={"min_split_steps": 4}, exact=False),
    "ms4_mik": Variant(attention={"min_split_steps": 4, "merge_in_kernel": True}, exact=False),
    "ms8_mik": Variant(attention={"min_split_steps": 8, "merge_in_kernel": True}, exact=False),
    "mik": Variant(attention={"merge_in_kernel": True}, exact=False),
    # Serving writes a row that one split holds from that split, the merge reading only the
    # splits holding keys (AttentionLaunch.direct_single_split; the same bits; "ms4" above adds
    # a minimum of four steps a split to it): "full_merge" is the earlier form (every split
    # stores, the merge reads all).
    "full_merge": Variant(attention={"direct_single_split": False}),
})
# The balanced decode grid (AttentionLaunch.balanced_programs_per_sm, balanced_min_steps): a fixed
# grid of programs an SM takes the batch's (row, kv head, split) items, each row's split count
# chosen on the device from the batch's lengths; "static" is the static splits and their merge.


def _balanced(per_sm: int, steps: int, stages: int = 3, cap: int = 0, merge: bool = False) -> tuple[str, Variant]:
    """The variant name (bal<per_sm>_ms<steps>[_s2][_r<cap>][_mik]) and its launch fields."""
    name = f"bal{per_sm}_ms{steps}" + (f"_s{stages}" if stages != 3 else "") + (f"_r{cap}" if cap else "") \
        + ("_mik" if merge else "")
    return name, Variant(attention={"balanced_programs_per_sm": per_sm, "balanced_min_steps": steps,
                                    "balanced_num_stages": stages, "balanced_max_registers": cap,
                                    "merge_in_kernel": merge}, exact=False)


VARIANTS.update(_balanced(per_sm, steps) for per_sm in (1, 2, 3, 4, 8) for steps in (1, 2, 4, 8))
VARIANTS.update(_balanced(per_sm, steps, stages=2) for per_sm in (2, 3, 4, 6) for steps in (1, 2, 4, 8))
VARIANTS.update(_balanced(per_sm, steps, cap=cap) for per_sm, cap in ((3, 168), (4, 128)) for steps in (1, 2, 4, 8))
VARIANTS.update(_balanced(per_sm, steps, cap=cap, merge=True)
                for per_sm, steps, cap in ((2, 4, 0), (2, 1, 0), (3, 4, 168), (3, 1, 168), (4, 4, 128)))
VARIANTS["static"] = Variant(attention={"balanced_programs_per_sm": 0}, exact=False)
# Where the wide launches let the next kernel start (GemvConfig.trigger_after_loop) and what
# they load before their wait (GemvConfig.preload_tiles 0: nothing).
VARIANTS.update({
    "w_pdl_p0": Variant(wide_rows=_tiles(EVERY, pdl=True, preload_tiles=0), exact=False),
    "w_pdl_late": Variant(wide_rows=_tiles(EVERY, pdl=True, trigger_after_loop=True), exact=False),
    "w_pdl_late_p0": Variant(wide_rows=_tiles(EVERY, pdl=True, preload_tiles=0, trigger_after_loop=True),
                             exact=False),
    "w_pdl_late_narrow": Variant(wide_rows=_tiles(NARROW, pdl=True, trigger_after_loop=True), exact=False),
    # the earlier wide defaults: one tile preloaded under PDL at its level up to 32 rows, plain past 32
    "w_before_32": Variant(wide_rows=_tiles(EVERY, preload_tiles=1, trigger_after_loop=False), exact=False),
    "w_before_64": Variant(wide_rows=_tiles(EVERY, pdl=False, preload_tiles=1, trigger_after_loop=False),
                           exact=False),
    # the same for 2..8 rows and for batch 1
    "mr_late_p0": Variant(multi_row=_tiles(EVERY, preload_tiles=0, trigger_after_loop=True), exact=False),
    "mr_late": Variant(multi_row=_tiles(EVERY, trigger_after_loop=True), exact=False),
    "b1_late": Variant(gemv_shapes=_tiles(EVERY, trigger_after_loop=True), exact=False),
    "b1_late_p0": Variant(gemv_shapes=_tiles(EVERY, preload_tiles=0, trigger_after_loop=True), exact=False),
    # stages of the wide tiles with the late start (gate/up at four stages: two 98 KB programs an SM)
    "w_gu_s4": Variant(wide_rows=_tiles((GATE_UP,), num_stages=4), exact=False),
    "w_od_s5": Variant(wide_rows=_tiles((O_PROJ, DOWN), num_stages=5), exact=False),
    "w_qkv_s4": Variant(wide_rows=_tiles((QKV,), num_stages=4), exact=False),
    # K splits of the 9..32-row narrow tiles (two on qkv and o, four on down by default)
    "w_o_split4": Variant(wide_rows={O_PROJ: {"split_k": 4}}, exact=False),
    "w_qkv_split4": Variant(wide_rows={QKV: {"split_k": 4}}, exact=False),
    "w_down_split2": Variant(wide_rows={DOWN: {"split_k": 2}}, exact=False),
    "w_o_s5": Variant(wide_rows={O_PROJ: {"num_stages": 5}}, exact=False),
})
# 2..8 rows on the FMA tiles (mode "fma": one register accumulator a row, each thread's eight
# adjacent columns folded), batch 1's tile shapes over four warps so that a thread holds eight
# columns of K (sm_90: 64-148 registers at 2-8 rows, no spills), or over two warps with half
# the K ("_w2").
FMA_TILES = {QKV: {"block_n": 4}, O_PROJ: {"block_n": 8}, DOWN: {"block_n": 8}, GATE_UP: {"block_n": 4},
             LM_HEAD: {"block_n": 4}}


def _fma_rows(block_k: int = 1024, num_warps: int = 4, shapes: dict | None = None, **cfg) -> dict:
    """FMA_TILES with ``cfg`` for every shape and ``shapes`` ({shape: fields}) for some."""
    return {shape: {"mode": "fma", "k_fold": 8, "num_stages": 3, "split_k": 1, "last_reduces": False,
                    "block_k": block_k, "num_warps": num_warps, **tile, **cfg, **(shapes or {}).get(shape, {})}
            for shape, tile in FMA_TILES.items()}


EARLY = {"preload_tiles": 1, "trigger_after_loop": False}


VARIANTS.update({
    "mr_fma": Variant(multi_row=_fma_rows(), exact=False),
    "mr_fma_early": Variant(multi_row=_fma_rows(preload_tiles=1, trigger_after_loop=False), exact=False),
    "mr_fma_w2": Variant(multi_row=_fma_rows(block_k=512, num_warps=2), exact=False),
    "mr_fma_w2_early": Variant(multi_row=_fma_rows(block_k=512, num_warps=2, preload_tiles=1,
                                                   trigger_after_loop=False), exact=False),
    "mr_fma_qkv8": Variant(multi_row=_fma_rows(shapes={QKV: {"block_n": 8}}, **EARLY), exact=False),
    "mr_fma_qkv_w2": Variant(multi_row=_fma_rows(shapes={QKV: {"num_warps": 2}}, **EARLY), exact=False),
    "mr_fma_narrow16": Variant(multi_row=_fma_rows(shapes={O_PROJ: {"block_n": 16}, DOWN: {"block_n": 16}},
                                                   **EARLY), exact=False),
    # the FMA tiles on some shapes only, the tensor-core tiles on the others
    "mr_fma_o": Variant(multi_row={O_PROJ: _fma_rows(**EARLY)[O_PROJ]}, exact=False),
    "mr_fma_o_qkv": Variant(multi_row={s: _fma_rows(**EARLY)[s] for s in (O_PROJ, QKV)}, exact=False),
    "mr_o_split2": Variant(multi_row={O_PROJ: {"split_k": 2, "last_reduces": True}}, exact=False),
    "mr_o_bn16": Variant(multi_row={O_PROJ: {"block_n": 16}}, exact=False),
    "mr_o_split4": Variant(multi_row={O_PROJ: {"split_k": 4, "last_reduces": True}}, exact=False),
    "mr_od_split2": Variant(multi_row=_tiles((O_PROJ, DOWN), split_k=2, last_reduces=True), exact=False),
    "mr_oq_split2": Variant(multi_row=_tiles((O_PROJ, QKV), split_k=2, last_reduces=True), exact=False),
    "mr_narrow_split2": Variant(multi_row=_tiles(NARROW, split_k=2, last_reduces=True), exact=False),
})
SERVING_DECODE_LAUNCH = attention.DECODE_LAUNCH


@triton.jit
def _touch_kernel(x_ptr, PDL: tl.constexpr):
    """Wait for the previous kernel and rewrite one element of its output (no change)."""
    wait_for_inputs(PDL)
    tl.store(x_ptr, tl.load(x_ptr))


def _with_extra_kernels(attend, count: int):
    def run(*args):
        out = attend(*args)
        level = _common.pdl_level(out)
        for _ in range(count):
            _touch_kernel[(1,)](out, PDL=level, num_warps=1, **_common.pdl_options(level))
        return out
    return run


def apply_variant(name: str, decoder: Decoder) -> Variant:
    """Set the kernel switches and the decoder ops of a named variant (before capture)."""
    if name not in VARIANTS:
        raise SystemExit(f"unknown variant {name!r}; known: {', '.join(VARIANTS)}")
    v = VARIANTS[name]
    _common.pdl_mode, _common.PDL_AUTO_LEVEL, gemv.PRELOAD_TILES, gemv.K_FOLD = v.pdl, v.level, v.preload, v.k_fold
    attention.MAX_SPLITS = v.max_splits
    attention.DECODE_LAUNCH = replace(SERVING_DECODE_LAUNCH, **v.attention)
    elementwise.NORM_WARPS_WIDE = v.norm_warps
    gemv.SHAPE_OVERRIDES = dict(v.gemv_shapes)
    gemv.MULTI_ROW_OVERRIDES = dict(v.multi_row)
    gemv.WIDE_ROW_OVERRIDES = dict(v.wide_rows)
    gemv.ROUTED_ROWS = v.routed_rows
    attention.MERGE_ROWS = v.merge_rows
    ops = cuda_ops()
    if "silu" in v.unfused:
        ops = replace(ops, linear_silu=lambda x, w: kernels.silu_mul(kernels.linear(x, w)))
    if "rope" in v.unfused:
        ops = replace(ops, linear_qkv_rope_write=lambda x, w, b, *rest: kernels.qkv_rope_write(kernels.linear(x, w, b),
                                                                                                 *rest))
    if "norm" in v.unfused:
        ops = replace(ops, linear_add_rms_norm=lambda x, w, residual, weight, eps: kernels.add_rms_norm(
            kernels.linear(x, w), residual, weight, eps))
    if v.extra_kernels:
        ops = replace(ops, attention=_with_extra_kernels(ops.attention, v.extra_kernels))
    decoder.ops = ops
    return v


def curve(decoder: Decoder, batches: list[int], args) -> int:
    """The step at each batch against its floor: the bytes it must read (every weight but the
    embedding, plus each row's cached K/V) at the streaming-read ceiling measured in this run
    over a weight-sized buffer (the copy-ceiling ratio beside it, for history). One row per
    (variant, batch); ``--variants`` names them (the serving configuration first)."""
    weights = sum(t.numel() * t.element_size() for name, t in decoder.w.items() if name != "embed")
    read_bps = read_ceiling_gbs(weights)[0] * 1e9
    print(f"{args.shape}, {args.cached} cached keys a row: read ceiling {read_bps / 1e9:,.0f} GB/s over "
          f"{weights / 1e9:.2f} GB (copy {COPY_CEILING_BPS / 1e9:,.0f})", flush=True)
    rows = []
    variants = args.variants.split(",")
    for b in batches:
        step = Step(decoder, b, args.cached, args.context // PAGE_TOKENS)
        floor = step.bytes / read_bps * 1e3
        for name in variants:
            apply_variant(name, decoder)
            try:
                graph, _ = capture(step)
            except Exception as exc:  # a launch shape the device refuses (resources): report, go on
                print(f"  batch {b:>3} {name:>16}: failed: {type(exc).__name__}: {str(exc)[:160]}", flush=True)
                continue
            ms = min(replay_ms(graph, replays=50, runs=7) for _ in range(2))
            row = dict(variant=name, batch=b, ms=round(ms, 3), floor_ms=round(floor, 3),
                       vs_read_floor=round(ms / floor, 3),
                       vs_copy_floor=round(ms * COPY_CEILING_BPS / step.bytes / 1e3, 3), tok_s=round(b / ms * 1e3, 1))
            rows.append(row)
            print(f"  batch {b:>3} {name:>16}: {ms:.3f} ms/step, floor {floor:.3f} ms ({row['vs_read_floor']:.3f}x "
                  f"read, {row['vs_copy_floor']:.3f}x copy), {row['tok_s']:,.0f} tok/s", flush=True)
            if args.profile and b in args.profile_batches and name == variants[0]:
                profiled = profile(graph, args.out)
                print(f"     exposed / device / idle us a step; idle in all: {sum(r[4] for r in profiled):.1f} us")
                for kname, exposed, dur, n, idle in profiled:
                    print(f"     {exposed:9.1f} {dur:9.1f} {idle:7.1f} {n:4d}  {kname}")
            del graph
        del step
        torch.cuda.empty_cache()
    apply_variant("serving", decoder)
    result = dict(shape=args.shape, cached=args.cached, read_ceiling_gbs=round(read_bps / 1e9, 1), curve=rows)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench_step_curve.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result))
    return 0


def sustained(graph: torch.cuda.CUDAGraph, seconds: float) -> tuple[float, float]:
    """(ms of one replay after 0.3 s idle, the median of ten; ms a replay back to back for
    ``seconds``, the median of the second half). Under a long run of large GEMMs the H200
    holds its power cap by lowering its clock: the first figure is the burst, the second
    what a loaded server gets (docs/benchmarks.md, 2026-12-04)."""
    import time

    def timed(replays: int) -> list[float]:
        events = [torch.cuda.Event(enable_timing=True) for _ in range(replays + 1)]
        events[0].record()
        for e in events[1:]:
            graph.replay()
            e.record()
        torch.cuda.synchronize()
        return [a.elapsed_time(b) for a, b in zip(events, events[1:])]

    idle = []
    for _ in range(10):
        time.sleep(0.3)
        idle += timed(1)
    loaded = []
    begin = time.perf_counter()
    while time.perf_counter() - begin < seconds:
        loaded += timed(10)
    half = sorted(loaded[len(loaded) // 2:])
    return sorted(idle)[len(idle) // 2], half[len(half) // 2]


def logits_mismatch(name: str, logits: torch.Tensor, first: str, first_logits: torch.Tensor) -> str | None:
    """How variant ``name``'s logits differ from variant ``first``'s, or None: bit for bit when
    both are exact (Variant.exact), else only the greedy token is compared."""
    if VARIANTS[name].exact and VARIANTS[first].exact and not torch.equal(logits, first_logits):
        return f"logits differ from {first} (max abs {float((logits - first_logits).abs().max()):.3g})"
    if not torch.equal(logits.argmax(-1), first_logits.argmax(-1)):
        return f"greedy token differs from {first}'s"
    return None


def mixed(decoder: Decoder, shapes: list[tuple[int, int]], args) -> int:
    """Each MIXED step (p prompt tokens, w decoders) timed as a graph, beside the decode step of
    its w rows alone at the same context: a decoder riding a prefill step should cost less
    than the weight pass of a step of its own. ``--variants`` (the serving configuration
    first) are timed on the same inputs, each step's logits compared with the first
    variant's; with ``--profile``, the first variant's kernels; with ``--sustained``, each
    step after idle and under a sustained load."""
    max_pages = args.context // PAGE_TOKENS
    variants = args.variants.split(",")
    results, alone, mismatches = [], {}, []
    apply_variant("serving", decoder)
    for w in sorted({w for _, w in shapes if w}):
        step = Step(decoder, w, args.cached, max_pages)
        graph, _ = capture(step)
        alone[w] = min(replay_ms(graph, replays=20, runs=7) for _ in range(2))
        print(f"  decode b{w:<4} alone at {args.cached} keys: {alone[w]:.3f} ms", flush=True)
        del graph, step
    plain: dict[tuple[str, int], float] = {}
    for p, w in shapes:
        rows = max(1, min(args.mixed_rows, p))
        step = MixedStep(decoder, p, w, rows, args.mixed_prefix, args.cached, max_pages)
        first_logits = None
        for name in variants:
            apply_variant(name, decoder)
            try:
                graph, (out_logits, _) = capture(step)
            except Exception as exc:  # a launch the device refuses: report, go on
                mismatches.append(f"p{p} w{w} {name}: failed ({type(exc).__name__}: {str(exc)[:200]})")
                print(f"  {mismatches[-1]}", flush=True)
                torch.cuda.synchronize()
                continue
            graph.replay()
            torch.cuda.synchronize()
            logits = out_logits.clone()
            ms = min(replay_ms(graph, replays=10, runs=7) for _ in range(2))
            if not torch.equal(out_logits, logits):
                mismatches.append(f"p{p} w{w} {name}: logits changed between replays")
            if first_logits is None:
                first, first_logits = name, logits
            elif (differs := logits_mismatch(name, logits, first, first_logits)) is not None:
                mismatches.append(f"p{p} w{w} {name}: {differs}")
            row = dict(variant=name, prompt=p, decoders=w, rows=rows, prefix=args.mixed_prefix, ms=round(ms, 3),
                       prompt_tok_s=round(p / ms * 1e3))
            if w == 0:
                plain[name, p] = ms
            elif (name, p) in plain:
                row["riding_ms"] = round(ms - plain[name, p], 3)
                row["decode_alone_ms"] = round(alone[w], 3)
            if args.sustained:
                row["after_idle_ms"], row["sustained_ms"] = sustained(graph, args.sustained)
                print(f"  mixed p{p:<5} w{w:<4} {name}: {row['after_idle_ms']:.3f} ms after 0.3 s idle, "
                      f"{row['sustained_ms']:.3f} ms sustained over {args.sustained:g} s", flush=True)
            results.append(row)
            extra = (f"; {w} decoders ride for {row['riding_ms']:.3f} ms (alone {alone[w]:.3f})"
                     if "riding_ms" in row else "")
            print(f"  mixed p{p:<5} w{w:<4} {name:>20} ({rows} prefill rows, prefix {args.mixed_prefix}): "
                  f"{ms:.3f} ms, {row['prompt_tok_s']:,} prompt tok/s{extra}", flush=True)
            if args.profile and name == variants[0]:
                profiled = profile(graph, None, replays=3)
                print(f"     exposed / device / idle us a step; idle in all: {sum(r[4] for r in profiled):.1f} us")
                for kname, exposed, dur, n, idle in profiled[:16]:
                    print(f"     {exposed:9.1f} {dur:9.1f} {idle:7.1f} {n:4d}  {kname[:90]}")
            del graph
        del step
        torch.cuda.empty_cache()
    print("logits stable across replays and equal across variants" if not mismatches else "\n".join(mismatches))
    result = dict(shape=args.shape, cached=args.cached, mixed=results, mismatches=mismatches)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench_step_mixed.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result))
    return 1 if mismatches else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="llama3-8b", choices=sorted(SHAPES))
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--cached", type=int, default=192, help="keys per row (bench_gpu's batch-1 run averages ~192)")
    parser.add_argument("--context", type=int, default=4096, help="page-table width in tokens, as the core's")
    parser.add_argument("--variants", default="serving,no_pdl,unfused")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--profile-batches", default="64",
                        help="with --curve: the batches whose first variant is profiled")
    parser.add_argument("--curve", default="", help="batches, e.g. 1,2,4,8,16,32,64: the serving step at each "
                        "against its floor (weights + the KV it reads) at the same run's read ceiling")
    parser.add_argument("--mixed", default="", help="MIXED steps as prompt:decoders pairs, e.g. 128:0,128:64: "
                        "each timed beside its decoders' step alone (w rows at --cached keys)")
    parser.add_argument("--mixed-rows", type=int, default=1, help="prefill rows sharing a mixed step's prompt tokens")
    parser.add_argument("--mixed-prefix", type=int, default=0, help="cached keys before each prefill row")
    parser.add_argument("--sustained", type=float, default=0.0, help="with --mixed: also time each step after "
                        "idle and over this many seconds back to back (the power cap's clock)")
    parser.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) if os.environ.get("OUT") else None)
    args = parser.parse_args()
    args.profile_batches = {int(b) for b in args.profile_batches.split(",")}
    spec = make_spec(args.shape)
    decoder = Decoder(spec, random_runtime_weights(spec, scale=0.02, dtype=torch.bfloat16, device=DEV),
                      max_positions=args.context)
    if args.mixed:
        return mixed(decoder, [tuple(int(v) for v in pair.split(":")) for pair in args.mixed.split(",")], args)
    if args.curve:
        return curve(decoder, [int(b) for b in args.curve.split(",")], args)
    step = Step(decoder, args.batch, args.cached, args.context // PAGE_TOKENS)
    floor_ms = step.bytes / COPY_CEILING_BPS * 1e3
    print(f"{args.shape} batch {args.batch}, {args.cached} cached keys: {step.bytes / 1e9:.2f} GB per step, "
          f"floor {floor_ms:.3f} ms at {COPY_CEILING_BPS / 1e12:.2f} TB/s", flush=True)
    results, logits, graphs, mismatches = {}, {}, {}, []
    for name in args.variants.split(","):
        apply_variant(name, decoder)
        try:
            graph, (out_logits, _) = capture(step)
        except Exception as exc:  # a launch shape past the GPU's resources: report, go on
            mismatches.append(f"{name}: failed ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})")
            print(mismatches[-1], flush=True)
            torch.cuda.synchronize()
            continue
        graphs[name] = graph, out_logits
        graph.replay()
        torch.cuda.synchronize()
        logits[name] = out_logits.clone()
        results[name] = replay_ms(graph, replays=50, runs=7)
        print(f"{name:>24}: {results[name]:.3f} ms/step ({results[name] / floor_ms:.3f}x floor)", flush=True)
    # Timing again in reverse order: the spread says what difference is noise. A replay
    # rewrites the same K/V, so each variant's logits must stay bit-identical across its
    # replays (a kernel reading its input before the previous kernel wrote it would
    # show here). Two exact variants (Variant.exact) match each other bit for bit; else
    # only the greedy token is compared.
    first = next(iter(logits))
    for name in reversed(list(graphs)):
        graph, out_logits = graphs[name]
        again = replay_ms(graph, replays=50, runs=7)
        print(f"{name:>24}: {again:.3f} ms/step again", flush=True)
        results[name] = min(results[name], again)
        if not torch.equal(out_logits, logits[name]):
            mismatches.append(f"{name}: logits changed between replays (max abs "
                              f"{float((out_logits - logits[name]).abs().max()):.3g})")
        if (differs := logits_mismatch(name, logits[name], first, logits[first])) is not None:
            mismatches.append(f"{name}: {differs}")
    print("logits stable across replays and equal across variants" if not mismatches else "\n".join(mismatches))
    if args.profile:
        rows = profile(graphs[first][0], args.out)
        print(f"\nkernels of one '{first}' replay: {sum(r[3] for r in rows)} launches, "
              f"{sum(r[1] for r in rows) / 1e3:.3f} ms exposed (between replays excluded), "
              f"{sum(r[2] for r in rows) / 1e3:.3f} ms of summed kernel durations")
        print(f"idle before kernels (launch boundaries): {sum(r[4] for r in rows):.1f} us")
        print(f"{'exposed us':>11} {'device us':>10} {'idle us':>8} {'launches':>8}  kernel")
        for kname, exposed, us, count, idle in rows[:22]:
            print(f"{exposed:11.1f} {us:10.1f} {idle:8.1f} {count:8d}  {kname[:90]}")
    summary = {"shape": args.shape, "batch": args.batch, "cached": args.cached, "floor_ms": round(floor_ms, 3)}
    summary |= {f"{k}_ms": round(v, 3) for k, v in results.items()}
    summary |= {f"{k}_vs_floor": round(v / floor_ms, 3) for k, v in results.items()}
    summary["mismatches"] = mismatches
    print(json.dumps(summary))
    if args.out is not None:
        (args.out / "bench_step.json").write_text(json.dumps(summary, indent=1))
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
