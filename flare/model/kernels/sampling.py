"""Token choice inside the captured decode graphs: the greedy variant in two launches,
the sampling variant in four.

:func:`flare.model.sampling.greedy_tokens` gathers each row's slot state, applies
the penalties over the vocabulary in about ten elementwise kernels and reduces
with ``argmax``, whose single-row reduction over 128k logits took 28 us on the
H200 (tools/bench_gpu.py's batch-1 profile, 2026-11-30). Here the first kernel
reads the logits and the slot's counts once per vocabulary block, applies the
penalties in registers with the reference's operations and rounding (no
multiply-add contraction, correctly rounded division) and keeps the block's
maximum and its first index; the second picks, per row, the first block holding
the row's maximum, so ties resolve to the lowest token id as ``argmax`` does.

:func:`sample_tokens` is :func:`flare.model.sampling.sampled_tokens` (the rounds of
draws that the reference's module docstring describes) without its sort-free torch
form's many launches. The first kernel keeps, per (row, block), the penalized maximum
and its index and the block's largest score and sum of exponentials. For a row with
filters, the second (one program a row) draws round 0's token from those block masses
and one block's scan, and the third (the (row, block) grid again) counts each block's
scores above the draw and above the second pivot, in parallel. The fourth, one program a
row, decides round 0 from those counts (a row without filters draws there and accepts)
and runs any later round itself: a draw, then one pass over the row. The draw has its
own launch so that no program of the grid draws it again (measured against the grid
drawing it in every program and against round 0 in the last kernel: docs/benchmarks.md,
"the sampling variant without a sort"). Philox runs in registers, word for word the
reference's.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...contract import (
    SAMPLING_FREQUENCY,
    SAMPLING_GRAMMAR,
    SAMPLING_LOGPROBS,
    SAMPLING_MIN_P,
    SAMPLING_PRESENCE,
    SAMPLING_REPETITION,
    SAMPLING_TEMPERATURE,
    SAMPLING_TOP_K,
    SAMPLING_TOP_P,
)
from ..sampling import SAMPLE_ROUNDS
from ._common import next_power_of_2, pdl_level, pdl_options, require, require_same_device, wait_for_inputs

_BLOCK = 2048


@triton.jit
def _penalized(logits_ptr, out_counts_ptr, prompt_counts_ptr, row, slot, cols, vocab, s_logits, s_counts,
               rep, presence, frequency):
    """A row's logits at ``cols`` with its slot's penalties applied, -inf past the vocabulary."""
    ok = cols < vocab
    # A row without penalties (the default) gets its logits back unchanged whatever its
    # counts hold (x / 1, x * 1, x - 0 are exact), so it reads only its logits: a third of
    # the bytes (64 rows: 98 MB of logits and counts a step otherwise).
    penalized_row = (rep != 1.0) | (presence != 0.0) | (frequency != 0.0)
    counted = cols < tl.where(penalized_row, vocab, 0)
    logits = tl.load(logits_ptr + row.to(tl.int64) * s_logits + cols, mask=ok, other=0.0)
    out_counts = tl.load(out_counts_ptr + slot * s_counts + cols, mask=counted, other=0)
    prompt_counts = tl.load(prompt_counts_ptr + slot * s_counts + cols, mask=counted, other=0)
    # flare.model.sampling.apply_penalties, operation for operation.
    seen = (prompt_counts > 0) | (out_counts > 0)
    penalized = tl.where(logits > 0, tl.math.div_rn(logits, rep), logits * rep)
    logits = tl.where(seen, penalized, logits)
    logits = logits - presence * (out_counts > 0).to(tl.float32)
    logits = logits - frequency * out_counts.to(tl.float32)
    return tl.where(ok, logits, float("-inf"))


@triton.jit
def _penalized_block_max_kernel(
    logits_ptr, sampling_ptr, out_counts_ptr, prompt_counts_ptr, slots_ptr, part_val_ptr, part_idx_ptr,
    vocab, num_blocks, s_logits, s_sampling, s_counts,
    REP: tl.constexpr, PRESENCE: tl.constexpr, FREQUENCY: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr,
):
    wait_for_inputs(PDL)
    row = tl.program_id(0)
    block = tl.program_id(1)
    slot = tl.load(slots_ptr + row).to(tl.int64)
    cols = block * BLOCK + tl.arange(0, BLOCK)
    rep = tl.load(sampling_ptr + slot * s_sampling + REP)
    presence = tl.load(sampling_ptr + slot * s_sampling + PRESENCE)
    frequency = tl.load(sampling_ptr + slot * s_sampling + FREQUENCY)
    logits = _penalized(logits_ptr, out_counts_ptr, prompt_counts_ptr, row, slot, cols, vocab, s_logits, s_counts,
                        rep, presence, frequency)
    best = tl.max(logits, axis=0)
    index = tl.argmax(logits, axis=0, tie_break_left=True)
    tl.store(part_val_ptr + row * num_blocks + block, best)
    tl.store(part_idx_ptr + row * num_blocks + block, block * BLOCK + index)


@triton.jit
def _block_max_kernel(logits_ptr, part_val_ptr, part_idx_ptr, vocab, num_blocks, s_logits,
                      BLOCK: tl.constexpr, PDL: tl.constexpr):
    # The penalty-free half of _penalized_block_max_kernel: each block's maximum and its first index.
    wait_for_inputs(PDL)
    row = tl.program_id(0)
    block = tl.program_id(1)
    cols = block * BLOCK + tl.arange(0, BLOCK)
    ok = cols < vocab
    logits = tl.load(logits_ptr + row.to(tl.int64) * s_logits + cols, mask=ok, other=float("-inf"))
    tl.store(part_val_ptr + row * num_blocks + block, tl.max(logits, axis=0))
    tl.store(part_idx_ptr + row * num_blocks + block, block * BLOCK + tl.argmax(logits, axis=0, tie_break_left=True))


def _require_logits(kernel: str, logits: torch.Tensor) -> None:
    require(logits.dtype == torch.float32 and logits.stride(1) == 1, kernel,
            f"logits must be float32 [B, V] with contiguous rows, got {logits.dtype} {tuple(logits.stride())}")


def _require_sampling(kernel: str, sampling: torch.Tensor) -> None:
    require(sampling.dtype == torch.float32 and sampling.stride(1) == 1, kernel, "sampling must be float32 rows")


def block_maxima(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's maximum logit per vocabulary block of _BLOCK and the block's first index of it,
    in one launch -> (values [B, blocks] float32, indices [B, blocks] int32). The first block
    holding a row's maximum holds its ``argmax`` (ties to the lowest id)."""
    kernel = "block_maxima"
    b, vocab = logits.shape
    _require_logits(kernel, logits)
    num_blocks = triton.cdiv(vocab, _BLOCK)
    pdl = pdl_level(logits)
    part_val = torch.empty((b, num_blocks), dtype=torch.float32, device=logits.device)
    part_idx = torch.empty((b, num_blocks), dtype=torch.int32, device=logits.device)
    _block_max_kernel[(b, num_blocks)](logits, part_val, part_idx, vocab, num_blocks, logits.stride(0),
                                       BLOCK=_BLOCK, PDL=pdl, num_warps=4, **pdl_options(pdl))
    return part_val, part_idx


@triton.jit
def _pick_kernel(
    part_val_ptr, part_idx_ptr, do_sample_ptr, slot_token_ptr, slots_ptr, out_ptr, num_blocks,
    BLOCKS: tl.constexpr, PDL: tl.constexpr,
):
    wait_for_inputs(PDL)
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCKS)
    ok = offs < num_blocks
    vals = tl.load(part_val_ptr + row * num_blocks + offs, mask=ok, other=float("-inf"))
    first = tl.argmax(vals, axis=0, tie_break_left=True)
    index = tl.load(part_idx_ptr + row * num_blocks + first)
    previous = tl.load(slot_token_ptr + tl.load(slots_ptr + row))
    token = tl.where(tl.load(do_sample_ptr + row) != 0, index.to(tl.int64), previous)
    tl.store(out_ptr + row, token)


def _check_token_inputs(kernel: str, logits: torch.Tensor, sampling: torch.Tensor, output_counts: torch.Tensor,
                        prompt_counts: torch.Tensor, slots: torch.Tensor, do_sample: torch.Tensor,
                        slot_token: torch.Tensor) -> None:
    b, vocab = logits.shape
    _require_logits(kernel, logits)
    require(output_counts.shape == prompt_counts.shape and output_counts.shape[1] == vocab
            and output_counts.dtype == prompt_counts.dtype == torch.int32
            and output_counts.stride() == prompt_counts.stride() and output_counts.stride(1) == 1, kernel,
            f"counts must be int32 [slots, {vocab}] with the same contiguous rows")
    _require_sampling(kernel, sampling)
    require(slots.shape == (b,) and do_sample.shape == (b,) and slot_token.dtype == torch.int64, kernel,
            f"slots and do_sample must be [{b}], slot_token int64")
    require_same_device(kernel, logits=logits, sampling=sampling, output_counts=output_counts,
                        prompt_counts=prompt_counts, slots=slots, do_sample=do_sample, slot_token=slot_token)


def greedy_tokens(logits: torch.Tensor, sampling: torch.Tensor, output_counts: torch.Tensor,
                  prompt_counts: torch.Tensor, slots: torch.Tensor, do_sample: torch.Tensor,
                  slot_token: torch.Tensor) -> torch.Tensor:
    """:func:`flare.model.sampling.greedy_tokens` in two launches (same arguments, same result)."""
    _check_token_inputs("greedy_tokens", logits, sampling, output_counts, prompt_counts, slots, do_sample,
                        slot_token)
    b, vocab = logits.shape
    num_blocks = triton.cdiv(vocab, _BLOCK)
    pdl = pdl_level(logits)
    part_val = torch.empty((b, num_blocks), dtype=torch.float32, device=logits.device)
    part_idx = torch.empty((b, num_blocks), dtype=torch.int32, device=logits.device)
    _penalized_block_max_kernel[(b, num_blocks)](
        logits, sampling, output_counts, prompt_counts, slots, part_val, part_idx,
        vocab, num_blocks, logits.stride(0), sampling.stride(0), output_counts.stride(0),
        REP=SAMPLING_REPETITION, PRESENCE=SAMPLING_PRESENCE, FREQUENCY=SAMPLING_FREQUENCY, BLOCK=_BLOCK, PDL=pdl,
        num_warps=4, enable_fp_fusion=False, **pdl_options(pdl),
    )
    out = torch.empty(b, dtype=torch.int64, device=logits.device)
    _pick_kernel[(b,)](part_val, part_idx, do_sample, slot_token, slots, out, num_blocks,
                       BLOCKS=next_power_of_2(num_blocks), PDL=pdl, num_warps=1, **pdl_options(pdl))
    return out


@triton.jit
def _grammar_mask_kernel(
    logits_ptr, sampling_ptr, masks_ptr, slots_ptr, vocab, s_logits, s_sampling, s_masks,
    GRAMMAR: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr,
):
    # The logits are the previous kernel's output: wait before any write, even a row that
    # turns out unconstrained (a program that left early would end this kernel before the
    # logits were done, and the next kernel's wait would no longer cover them).
    wait_for_inputs(PDL)
    row = tl.program_id(0)
    slot = tl.load(slots_ptr + row).to(tl.int64)
    if tl.load(sampling_ptr + slot * s_sampling + GRAMMAR) == 0:
        return
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < vocab
    words = tl.load(masks_ptr + slot * s_masks + cols // 32, mask=ok, other=0)
    forbidden = ((words >> (cols % 32)) & 1) == 0
    tl.store(logits_ptr + row.to(tl.int64) * s_logits + cols, tl.full((BLOCK,), float("-inf"), tl.float32),
             mask=ok & forbidden)


def apply_grammar_masks(logits: torch.Tensor, sampling: torch.Tensor, masks: torch.Tensor,
                        slots: torch.Tensor) -> None:
    """:func:`flare.model.sampling.apply_grammar_masks` in one launch: writes only the
    forbidden logits of constrained rows; an unconstrained row's programs read one flag."""
    kernel = "apply_grammar_masks"
    b, vocab = logits.shape
    _require_logits(kernel, logits)
    require(masks.dtype == torch.int32 and masks.stride(1) == 1 and masks.shape[1] * 32 >= vocab, kernel,
            f"masks must be int32 [slots, >= {-(-vocab // 32)}] with contiguous rows")
    _require_sampling(kernel, sampling)
    require(slots.shape == (b,), kernel, f"slots must be [{b}]")
    require_same_device(kernel, logits=logits, sampling=sampling, masks=masks, slots=slots)
    pdl = pdl_level(logits)
    _grammar_mask_kernel[(b, triton.cdiv(vocab, _MASK_BLOCK))](
        logits, sampling, masks, slots, vocab, logits.stride(0), sampling.stride(0), masks.stride(0),
        GRAMMAR=SAMPLING_GRAMMAR, BLOCK=_MASK_BLOCK, PDL=pdl, num_warps=4, **pdl_options(pdl),
    )


_PHILOX_M0 = tl.constexpr(0xD2511F53)
_PHILOX_M1 = tl.constexpr(0xCD9E8D57)
_PHILOX_W0 = tl.constexpr(0x9E3779B9)
_PHILOX_W1 = tl.constexpr(0xBB67AE85)


@triton.jit
def _philox_uniform(seed, counter, stream):
    """flare.model.sampling.philox_uniform of one (int64 seed, int64 counter, int32 stream)."""
    k0 = (seed & 0xFFFFFFFF).to(tl.uint32)
    k1 = ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32)
    c0 = (counter & 0xFFFFFFFF).to(tl.uint32)
    c1 = ((counter >> 32) & 0xFFFFFFFF).to(tl.uint32)
    c2 = stream.to(tl.uint32)
    c3 = tl.zeros_like(c0)
    m0 = tl.full((), _PHILOX_M0, tl.uint32)
    m1 = tl.full((), _PHILOX_M1, tl.uint32)
    for _ in tl.static_range(10):
        hi0 = tl.umulhi(m0, c0)
        lo0 = m0 * c0
        hi1 = tl.umulhi(m1, c2)
        lo1 = m1 * c2
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0 = k0 + tl.full((), _PHILOX_W0, tl.uint32)
        k1 = k1 + tl.full((), _PHILOX_W1, tl.uint32)
    return (c0 >> 8).to(tl.float32) * (1.0 / 16777216.0)


@triton.jit
def _sample_stats_kernel(
    logits_ptr, sampling_ptr, out_counts_ptr, prompt_counts_ptr, slots_ptr,
    part_max_ptr, part_idx_ptr, part_top_ptr, part_sum_ptr, vocab, num_blocks, s_logits, s_sampling, s_counts,
    REP: tl.constexpr, PRESENCE: tl.constexpr, FREQUENCY: tl.constexpr, TEMPERATURE: tl.constexpr,
    BLOCK: tl.constexpr, PDL: tl.constexpr,
):
    # Per (row, vocabulary block): the penalized logits' maximum and its first index (the
    # greedy token), the largest score (logit / temperature) and sum(exp(score - largest)).
    wait_for_inputs(PDL)
    row = tl.program_id(0)
    block = tl.program_id(1)
    slot = tl.load(slots_ptr + row).to(tl.int64)
    params = sampling_ptr + slot * s_sampling
    cols = block * BLOCK + tl.arange(0, BLOCK)
    logits = _penalized(logits_ptr, out_counts_ptr, prompt_counts_ptr, row, slot, cols, vocab, s_logits, s_counts,
                        tl.load(params + REP), tl.load(params + PRESENCE), tl.load(params + FREQUENCY))
    temperature = tl.load(params + TEMPERATURE)
    scores = tl.math.div_rn(logits, tl.where(temperature > 0, temperature, 1.0))
    top = tl.max(scores, axis=0)
    mass = tl.sum(tl.where(scores > float("-inf"), tl.exp(scores - top), 0.0), axis=0)
    at = row * num_blocks + block
    tl.store(part_max_ptr + at, tl.max(logits, axis=0))
    tl.store(part_idx_ptr + at, block * BLOCK + tl.argmax(logits, axis=0, tie_break_left=True))
    tl.store(part_top_ptr + at, top)
    tl.store(part_sum_ptr + at, mass)


@triton.jit
def _row_params(sampling_ptr, do_sample_ptr, row, slot, s_sampling, vocab,
                REP: tl.constexpr, PRESENCE: tl.constexpr, FREQUENCY: tl.constexpr, TEMPERATURE: tl.constexpr,
                TOP_P: tl.constexpr, TOP_K: tl.constexpr, MIN_P: tl.constexpr):
    """A row's penalties, temperature divisor and filters (flare.model.sampling._filter_limits),
    and whether it needs no draw (greedy, or not sampling this step)."""
    params = sampling_ptr + slot * s_sampling
    temperature = tl.load(params + TEMPERATURE)
    top_p = tl.load(params + TOP_P)
    top_k = tl.load(params + TOP_K)
    min_p = tl.load(params + MIN_P)
    k = tl.where(top_k > 0, top_k, vocab.to(tl.float32))
    filtered = (k < vocab) | (top_p < 1.0) | (min_p > 0.0)
    done = (temperature <= 0.0) | (top_k == 1.0) | (tl.load(do_sample_ptr + row) == 0)
    return (tl.load(params + REP), tl.load(params + PRESENCE), tl.load(params + FREQUENCY),
            tl.where(temperature > 0, temperature, 1.0), top_p, k, min_p, filtered, done)


@triton.jit
def _row_masses(part_top_ptr, part_sum_ptr, row, num_blocks, blocks):
    """The row's largest score and each block's sum of exp(score - largest)."""
    in_row = blocks < num_blocks
    part = row * num_blocks + blocks
    tops = tl.load(part_top_ptr + part, mask=in_row, other=float("-inf"))
    top = tl.max(tops, axis=0)
    sums = tl.load(part_sum_ptr + part, mask=in_row, other=0.0)
    return top, tl.where(tops > float("-inf"), sums * tl.exp(tops - top), 0.0)


@triton.jit
def _block_scores(logits_ptr, out_counts_ptr, prompt_counts_ptr, row, slot, block, lanes, vocab, s_logits, s_counts,
                  rep, presence, frequency, divisor, BLOCK: tl.constexpr):
    cols = block * BLOCK + lanes
    return tl.math.div_rn(_penalized(logits_ptr, out_counts_ptr, prompt_counts_ptr, row, slot, cols, vocab, s_logits,
                                     s_counts, rep, presence, frequency), divisor)


@triton.jit
def _draw(logits_ptr, out_counts_ptr, prompt_counts_ptr, row, slot, vocab, s_logits, s_counts, rep, presence,
          frequency, divisor, weights, top, pivot, uniform, blocks, lanes, BLOCK: tl.constexpr, BLOCKS: tl.constexpr):
    """One round's token and score: the block the uniform falls in by the block masses left
    above the pivot, then the token inside it by that block's scan."""
    target = uniform * tl.sum(weights, axis=0)
    cumulative = tl.cumsum(weights, axis=0)
    j = tl.min(tl.where(cumulative > target, blocks, BLOCKS), axis=0)
    j = tl.where(j < BLOCKS, j, tl.max(tl.where(weights > 0, blocks, 0), axis=0))  # past the end: rounding
    before = tl.sum(tl.where(blocks == j, cumulative - weights, 0.0), axis=0)
    scores = _block_scores(logits_ptr, out_counts_ptr, prompt_counts_ptr, row, slot, j, lanes, vocab, s_logits,
                           s_counts, rep, presence, frequency, divisor, BLOCK)
    live = tl.where(scores > pivot, tl.exp(scores - top), 0.0)
    i = tl.min(tl.where(before + tl.cumsum(live, axis=0) > target, lanes, BLOCK), axis=0)
    i = tl.where(i < BLOCK, i, tl.max(tl.where(live > 0, lanes, 0), axis=0))
    score = tl.max(tl.where(lanes == i, scores, float("-inf")), axis=0)
    return (j * BLOCK + i).to(tl.int64), score


@triton.jit
def _first_draw_kernel(
    logits_ptr, sampling_ptr, out_counts_ptr, prompt_counts_ptr, slots_ptr, seed_ptr, generated_ptr,
    do_sample_ptr, part_top_ptr, part_sum_ptr, first_token_ptr, first_score_ptr,
    vocab, num_blocks, s_logits, s_sampling, s_counts,
    REP: tl.constexpr, PRESENCE: tl.constexpr, FREQUENCY: tl.constexpr, TEMPERATURE: tl.constexpr,
    TOP_P: tl.constexpr, TOP_K: tl.constexpr, MIN_P: tl.constexpr,
    BLOCK: tl.constexpr, BLOCKS: tl.constexpr, PDL: tl.constexpr,
):
    # Round 0's draw of a filtered row, one program a row: the counts over the row's blocks
    # follow in their own launch (_first_counts_kernel). A row without filters takes its
    # first draw and leaves in the rounds kernel.
    wait_for_inputs(PDL)
    row = tl.program_id(0)
    slot = tl.load(slots_ptr + row).to(tl.int64)
    rep, presence, frequency, divisor, top_p, k, min_p, filtered, done = _row_params(
        sampling_ptr, do_sample_ptr, row, slot, s_sampling, vocab, REP, PRESENCE, FREQUENCY, TEMPERATURE, TOP_P,
        TOP_K, MIN_P)
    if (done == 0) & filtered:
        blocks = tl.arange(0, BLOCKS)
        top, weights = _row_masses(part_top_ptr, part_sum_ptr, row, num_blocks, blocks)
        uniform = _philox_uniform(tl.load(seed_ptr + slot), tl.load(generated_ptr + slot), tl.full((), 0, tl.int32))
        drawn, score = _draw(logits_ptr, out_counts_ptr, prompt_counts_ptr, row, slot, vocab, s_logits, s_counts, rep,
                             presence, frequency, divisor, weights, top, float("-inf"), uniform, blocks,
                             tl.arange(0, BLOCK), BLOCK, BLOCKS)
        tl.store(first_token_ptr + row, drawn)
        tl.store(first_score_ptr + row, score)


@triton.jit
def _first_counts_kernel(
    logits_ptr, sampling_ptr, out_counts_ptr, prompt_counts_ptr, slots_ptr, do_sample_ptr, part_top_ptr,
    first_score_ptr, part_count_ptr, part_mass_ptr, part_count_mid_ptr, part_mass_mid_ptr,
    vocab, num_blocks, s_logits, s_sampling, s_counts,
    REP: tl.constexpr, PRESENCE: tl.constexpr, FREQUENCY: tl.constexpr, TEMPERATURE: tl.constexpr,
    TOP_P: tl.constexpr, TOP_K: tl.constexpr, MIN_P: tl.constexpr,
    BLOCK: tl.constexpr, BLOCKS: tl.constexpr, PDL: tl.constexpr,
):
    # Round 0's counts over the grid (row, block) for a filtered row whose draw is below the
    # top: its block's scores above the draw and above the second pivot, and their masses.
    wait_for_inputs(PDL)
    row = tl.program_id(0)
    block = tl.program_id(1)
    slot = tl.load(slots_ptr + row).to(tl.int64)
    rep, presence, frequency, divisor, top_p, k, min_p, filtered, done = _row_params(
        sampling_ptr, do_sample_ptr, row, slot, s_sampling, vocab, REP, PRESENCE, FREQUENCY, TEMPERATURE, TOP_P,
        TOP_K, MIN_P)
    if (done == 0) & filtered:
        blocks = tl.arange(0, BLOCKS)
        top = tl.max(tl.load(part_top_ptr + row * num_blocks + blocks, mask=blocks < num_blocks,
                             other=float("-inf")), axis=0)
        score = tl.load(first_score_ptr + row)
        if score < top:
            scores = _block_scores(logits_ptr, out_counts_ptr, prompt_counts_ptr, row, slot, block,
                                   tl.arange(0, BLOCK), vocab, s_logits, s_counts, rep, presence, frequency, divisor,
                                   BLOCK)
            weight = tl.exp(scores - top)
            mid = (score + top) * 0.5
            at = row * num_blocks + block
            tl.store(part_count_ptr + at, tl.sum((scores > score).to(tl.int32), axis=0))
            tl.store(part_mass_ptr + at, tl.sum(tl.where(scores > score, weight, 0.0), axis=0))
            tl.store(part_count_mid_ptr + at, tl.sum((scores > mid).to(tl.int32), axis=0))
            tl.store(part_mass_mid_ptr + at, tl.sum(tl.where(scores > mid, weight, 0.0), axis=0))


@triton.jit
def _rounds_kernel(
    logits_ptr, sampling_ptr, out_counts_ptr, prompt_counts_ptr, slots_ptr, seed_ptr, generated_ptr,
    do_sample_ptr, slot_token_ptr, part_max_ptr, part_idx_ptr, part_top_ptr, part_sum_ptr,
    first_token_ptr, first_score_ptr, part_count_ptr, part_mass_ptr, part_count_mid_ptr, part_mass_mid_ptr, out_ptr,
    vocab, num_blocks, s_logits, s_sampling, s_counts,
    REP: tl.constexpr, PRESENCE: tl.constexpr, FREQUENCY: tl.constexpr, TEMPERATURE: tl.constexpr,
    TOP_P: tl.constexpr, TOP_K: tl.constexpr, MIN_P: tl.constexpr, ROUNDS: tl.constexpr,
    BLOCK: tl.constexpr, BLOCKS: tl.constexpr, PDL: tl.constexpr,
):
    # One row's rounds (flare.model.sampling.sample). A filtered row's round 0 was drawn and
    # counted by the two launches before; a row without filters draws here and accepts. Any
    # later round draws here and reads every block once, counting the scores above the draw
    # and above the second pivot and the masses above each per block (one of them is the next
    # round's block masses on a rejection).
    wait_for_inputs(PDL)
    row = tl.program_id(0)
    slot = tl.load(slots_ptr + row).to(tl.int64)
    blocks = tl.arange(0, BLOCKS)
    lanes = tl.arange(0, BLOCK)
    in_row = blocks < num_blocks
    part = row * num_blocks + blocks
    maxima = tl.load(part_max_ptr + part, mask=in_row, other=float("-inf"))
    token = tl.load(part_idx_ptr + row * num_blocks + tl.argmax(maxima, axis=0, tie_break_left=True)).to(tl.int64)
    rep, presence, frequency, divisor, top_p, k, min_p, filtered, done = _row_params(
        sampling_ptr, do_sample_ptr, row, slot, s_sampling, vocab, REP, PRESENCE, FREQUENCY, TEMPERATURE, TOP_P,
        TOP_K, MIN_P)
    top, weights = _row_masses(part_top_ptr, part_sum_ptr, row, num_blocks, blocks)
    limit = top_p * tl.sum(weights, axis=0)
    seed = tl.load(seed_ptr + slot)
    counter = tl.load(generated_ptr + slot)
    pivot = float("-inf")
    finished = done.to(tl.int32)
    r = 0
    while (finished == 0) & (r < ROUNDS):
        if (r == 0) & filtered:
            drawn = tl.load(first_token_ptr + row)
            score = tl.load(first_score_ptr + row)
        else:
            drawn, score = _draw(logits_ptr, out_counts_ptr, prompt_counts_ptr, row, slot, vocab, s_logits, s_counts,
                                 rep, presence, frequency, divisor, weights, top, pivot,
                                 _philox_uniform(seed, counter, r), blocks, lanes, BLOCK, BLOCKS)
        accept = (filtered == 0) | (score >= top)
        if accept == 0:
            mid = (score + top) * 0.5
            if r == 0:  # (only a filtered row gets here)
                count = tl.sum(tl.load(part_count_ptr + part, mask=in_row, other=0), axis=0)
                count_mid = tl.sum(tl.load(part_count_mid_ptr + part, mask=in_row, other=0), axis=0)
                above_blocks = tl.load(part_mass_ptr + part, mask=in_row, other=0.0)
                mid_blocks = tl.load(part_mass_mid_ptr + part, mask=in_row, other=0.0)
            else:
                # (the counts stay per lane until the end: two block sums a tile, not four)
                counts = tl.zeros((BLOCK,), tl.int32)
                counts_mid = tl.zeros((BLOCK,), tl.int32)
                above_blocks = tl.zeros((BLOCKS,), tl.float32)
                mid_blocks = tl.zeros((BLOCKS,), tl.float32)
                for block in range(0, num_blocks):
                    scores = _block_scores(logits_ptr, out_counts_ptr, prompt_counts_ptr, row, slot, block, lanes,
                                           vocab, s_logits, s_counts, rep, presence, frequency, divisor, BLOCK)
                    weight = tl.exp(scores - top)
                    above = scores > score
                    above_mid = scores > mid
                    counts += above.to(tl.int32)
                    counts_mid += above_mid.to(tl.int32)
                    above_blocks = tl.where(blocks == block, tl.sum(tl.where(above, weight, 0.0), axis=0),
                                            above_blocks)
                    mid_blocks = tl.where(blocks == block, tl.sum(tl.where(above_mid, weight, 0.0), axis=0),
                                          mid_blocks)
                count = tl.sum(counts, axis=0)
                count_mid = tl.sum(counts_mid, axis=0)
            accept = (count < k) & (tl.sum(above_blocks, axis=0) < limit) & (tl.exp(score - top) >= min_p)
            if accept == 0:
                mid_kept = (count_mid < k) & (tl.sum(mid_blocks, axis=0) < limit) & (tl.exp(mid - top) >= min_p)
                pivot = tl.where(mid_kept, score, mid)
                weights = tl.where(mid_kept, above_blocks, mid_blocks)
        if accept != 0:
            token = drawn
            finished = 1
        r += 1
    previous = tl.load(slot_token_ptr + slot)
    tl.store(out_ptr + row, tl.where(tl.load(do_sample_ptr + row) != 0, token, previous))


def sample_tokens(logits: torch.Tensor, sampling: torch.Tensor, output_counts: torch.Tensor,
                  prompt_counts: torch.Tensor, slots: torch.Tensor, do_sample: torch.Tensor,
                  slot_token: torch.Tensor, slot_seed: torch.Tensor, slot_generated: torch.Tensor) -> torch.Tensor:
    """:func:`flare.model.sampling.sampled_tokens` in four launches (same arguments; the same
    tokens but where a draw lands within rounding of a block or token boundary)."""
    kernel = "sample_tokens"
    _check_token_inputs(kernel, logits, sampling, output_counts, prompt_counts, slots, do_sample, slot_token)
    require(slot_seed.dtype == slot_generated.dtype == torch.int64 and slot_seed.dim() == slot_generated.dim() == 1,
            kernel, "slot seeds and generated counts must be int64 [slots]")
    require_same_device(kernel, logits=logits, slot_seed=slot_seed, slot_generated=slot_generated)
    b, vocab = logits.shape
    num_blocks = triton.cdiv(vocab, _BLOCK)
    pdl = pdl_level(logits)
    dev = logits.device
    part_max = torch.empty((b, num_blocks), dtype=torch.float32, device=dev)
    part_idx = torch.empty((b, num_blocks), dtype=torch.int32, device=dev)
    part_top = torch.empty((b, num_blocks), dtype=torch.float32, device=dev)
    part_sum = torch.empty((b, num_blocks), dtype=torch.float32, device=dev)
    columns = dict(REP=SAMPLING_REPETITION, PRESENCE=SAMPLING_PRESENCE, FREQUENCY=SAMPLING_FREQUENCY,
                   TEMPERATURE=SAMPLING_TEMPERATURE)
    _sample_stats_kernel[(b, num_blocks)](
        logits, sampling, output_counts, prompt_counts, slots, part_max, part_idx, part_top, part_sum,
        vocab, num_blocks, logits.stride(0), sampling.stride(0), output_counts.stride(0), **columns,
        BLOCK=_BLOCK, PDL=pdl, num_warps=4, enable_fp_fusion=False, **pdl_options(pdl),
    )
    first_token = torch.empty(b, dtype=torch.int64, device=dev)
    first_score = torch.empty(b, dtype=torch.float32, device=dev)
    part_count = torch.empty((b, num_blocks), dtype=torch.int32, device=dev)
    part_count_mid = torch.empty((b, num_blocks), dtype=torch.int32, device=dev)
    part_mass = torch.empty((b, num_blocks), dtype=torch.float32, device=dev)
    part_mass_mid = torch.empty((b, num_blocks), dtype=torch.float32, device=dev)
    columns.update(TOP_P=SAMPLING_TOP_P, TOP_K=SAMPLING_TOP_K, MIN_P=SAMPLING_MIN_P)
    shape = dict(BLOCK=_BLOCK, BLOCKS=next_power_of_2(num_blocks), PDL=pdl, enable_fp_fusion=False,
                 **pdl_options(pdl))
    strides = (vocab, num_blocks, logits.stride(0), sampling.stride(0), output_counts.stride(0))
    _first_draw_kernel[(b,)](
        logits, sampling, output_counts, prompt_counts, slots, slot_seed, slot_generated, do_sample, part_top, part_sum,
        first_token, first_score, *strides, **columns, **shape, num_warps=4,
    )
    _first_counts_kernel[(b, num_blocks)](
        logits, sampling, output_counts, prompt_counts, slots, do_sample, part_top, first_score, part_count, part_mass,
        part_count_mid, part_mass_mid, *strides, **columns, **shape, num_warps=4,
    )
    out = torch.empty(b, dtype=torch.int64, device=dev)
    _rounds_kernel[(b,)](
        logits, sampling, output_counts, prompt_counts, slots, slot_seed, slot_generated, do_sample, slot_token,
        part_max, part_idx, part_top, part_sum, first_token, first_score, part_count, part_mass, part_count_mid,
        part_mass_mid, out, *strides, **columns, ROUNDS=SAMPLE_ROUNDS, **shape,
        num_warps=8,
    )
    return out


_MASK_BLOCK = 4096


# Top logprobs: a logit and its token id as one int64 key, ordered as the logits are and, among
# equal logits, the lower id first, so one max reduction picks the next candidate and keys are
# never equal. The high word is the float's bits with a negative float's magnitude bits
# flipped (an order-preserving int32), the low word 2^31 - 1 - id.
@triton.jit
def _logit_keys(x, cols):
    bits = x.to(tl.int32, bitcast=True)
    ordered = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    return ordered.to(tl.int64) * 4294967296 + (2147483647 - cols).to(tl.int64)


@triton.jit
def _no_key():
    # Below every key of a real logit (the least is a NaN's with every magnitude bit set).
    return tl.full((), -2147483648, tl.int64) * 4294967296


@triton.jit
def _logprob_blocks_kernel(
    logits_ptr, sampling_ptr, slots_ptr, part_max_ptr, part_sum_ptr, part_key_ptr, vocab, num_blocks, s_logits,
    s_sampling, LOGPROBS: tl.constexpr, K: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr,
):
    # Per (row, block) of a row whose slot wants logprobs: the block's largest logit, its sum of
    # exponentials below that, and its K best keys in order. Other rows' programs read one flag.
    wait_for_inputs(PDL)
    row = tl.program_id(0)
    block = tl.program_id(1)
    slot = tl.load(slots_ptr + row).to(tl.int64)
    if tl.load(sampling_ptr + slot * s_sampling + LOGPROBS) == 0:
        return
    cols = block * BLOCK + tl.arange(0, BLOCK)
    ok = cols < vocab
    x = tl.load(logits_ptr + row.to(tl.int64) * s_logits + cols, mask=ok, other=float("-inf"))
    top = tl.max(x, axis=0)
    at = row * num_blocks + block
    tl.store(part_max_ptr + at, top)
    tl.store(part_sum_ptr + at, tl.sum(tl.exp(x - tl.where(top == float("-inf"), 0.0, top)), axis=0))
    none = _no_key()
    keys = tl.where(ok, _logit_keys(x, cols), none)
    for k in tl.static_range(K):
        best = tl.max(keys, axis=0)
        tl.store(part_key_ptr + at * K + k, best)
        keys = tl.where(keys == best, none, keys)


@triton.jit
def _logprob_rows_kernel(
    logits_ptr, sampling_ptr, slots_ptr, token_ptr, frame_ptr, part_max_ptr, part_sum_ptr, part_key_ptr,
    out_lp_ptr, out_ids_ptr, num_blocks, s_logits, s_sampling, s_lp_frame, s_lp_slot, s_ids_frame, s_ids_slot,
    LOGPROBS: tl.constexpr, K: tl.constexpr, BLOCKS: tl.constexpr, CANDIDATES: tl.constexpr, PDL: tl.constexpr,
):
    # One program a row: the log-sum-exp from the blocks' pairs, the K best of the blocks'
    # candidates, and the row's logprobs written into this step's frame at its slot.
    wait_for_inputs(PDL)
    row = tl.program_id(0)
    slot = tl.load(slots_ptr + row).to(tl.int64)
    if tl.load(sampling_ptr + slot * s_sampling + LOGPROBS) == 0:
        return
    blocks = tl.arange(0, BLOCKS)
    in_row = blocks < num_blocks
    tops = tl.load(part_max_ptr + row * num_blocks + blocks, mask=in_row, other=float("-inf"))
    sums = tl.load(part_sum_ptr + row * num_blocks + blocks, mask=in_row, other=0.0)
    top = tl.max(tops, axis=0)
    top = tl.where(top == float("-inf"), 0.0, top)
    lse = top + tl.log(tl.sum(sums * tl.exp(tops - top), axis=0))
    frame = tl.load(frame_ptr)
    lp_row = out_lp_ptr + frame * s_lp_frame + slot * s_lp_slot
    ids_row = out_ids_ptr + frame * s_ids_frame + slot * s_ids_slot
    token = tl.load(token_ptr + row)
    tl.store(lp_row, tl.load(logits_ptr + row.to(tl.int64) * s_logits + token) - lse)
    offs = tl.arange(0, CANDIDATES)
    none = _no_key()
    keys = tl.load(part_key_ptr + row * num_blocks * K + offs, mask=offs < num_blocks * K, other=none)
    for k in tl.static_range(K):
        best = tl.max(keys, axis=0)
        keys = tl.where(keys == best, none, keys)
        high = best >> 32
        bits = tl.where(high < 0, high ^ 0x7FFFFFFF, high).to(tl.int32)
        tl.store(lp_row + 1 + k, bits.to(tl.float32, bitcast=True) - lse)
        tl.store(ids_row + k, 2147483647 - (best & 0xFFFFFFFF))


_LOGPROB_BLOCK = 2048


def write_logprobs(logits: torch.Tensor, token: torch.Tensor, slots: torch.Tensor, *, sampling: torch.Tensor,
                   frame: torch.Tensor, out_logprobs: torch.Tensor, out_top_ids: torch.Tensor) -> None:
    """:func:`flare.model.sampling.token_logprobs` written into the step's frame (``frame``
    names it) at each row's slot, in two launches, for the rows whose slot sets
    ``SAMPLING_LOGPROBS``: the chosen token's logprob and the K best (K =
    ``out_top_ids.shape[2]``; equal logits: the lower id first). Other rows' frame rows are
    left as they were (their requests never read them); their programs read one flag each."""
    kernel = "write_logprobs"
    b, vocab = logits.shape
    k = out_top_ids.shape[-1]
    _require_logits(kernel, logits)
    _require_sampling(kernel, sampling)
    require(slots.shape == (b,) and token.shape == (b,) and token.dtype == torch.int64, kernel,
            f"slots and token must be [{b}], token int64")
    require(frame.shape == (1,) and frame.dtype == torch.int64, kernel, "frame must be int64 [1]")
    require(out_logprobs.dim() == out_top_ids.dim() == 3 and out_logprobs.shape[:2] == out_top_ids.shape[:2]
            and out_logprobs.shape[2] == 1 + k and out_logprobs.dtype == torch.float32
            and out_top_ids.dtype == torch.int64 and out_logprobs.stride(2) == out_top_ids.stride(2) == 1, kernel,
            "out_logprobs must be float32 [frames, slots, 1 + K] and out_top_ids int64 [frames, slots, K]")
    require(1 <= k <= vocab, kernel, f"K must be 1..{vocab}, got {k}")
    require_same_device(kernel, logits=logits, token=token, slots=slots, sampling=sampling, frame=frame,
                        out_logprobs=out_logprobs, out_top_ids=out_top_ids)
    num_blocks = triton.cdiv(vocab, _LOGPROB_BLOCK)
    pdl = pdl_level(logits)
    dev = logits.device
    part_max = torch.empty((b, num_blocks), dtype=torch.float32, device=dev)
    part_sum = torch.empty((b, num_blocks), dtype=torch.float32, device=dev)
    part_key = torch.empty((b, num_blocks, k), dtype=torch.int64, device=dev)
    _logprob_blocks_kernel[(b, num_blocks)](
        logits, sampling, slots, part_max, part_sum, part_key, vocab, num_blocks, logits.stride(0),
        sampling.stride(0), LOGPROBS=SAMPLING_LOGPROBS, K=k, BLOCK=_LOGPROB_BLOCK, PDL=pdl, num_warps=4,
        **pdl_options(pdl),
    )
    _logprob_rows_kernel[(b,)](
        logits, sampling, slots, token, frame, part_max, part_sum, part_key, out_logprobs, out_top_ids, num_blocks,
        logits.stride(0), sampling.stride(0), out_logprobs.stride(0), out_logprobs.stride(1), out_top_ids.stride(0),
        out_top_ids.stride(1), LOGPROBS=SAMPLING_LOGPROBS, K=k, BLOCKS=next_power_of_2(num_blocks),
        CANDIDATES=next_power_of_2(num_blocks * k), PDL=pdl, num_warps=4, **pdl_options(pdl),
    )


__all__ = ["apply_grammar_masks", "block_maxima", "greedy_tokens", "sample_tokens", "write_logprobs"]
