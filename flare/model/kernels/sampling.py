"""The greedy decode variant's token choice in two launches.

:func:`flare.model.sampling.greedy_tokens` gathers each row's slot state, applies
the penalties over the vocabulary in about ten elementwise kernels and reduces
with ``argmax``, whose single-row reduction over 128k logits took 28 us on the
H200 (tools/bench_gpu.py's batch-1 profile, 2026-11-30). Here the first kernel
reads the logits and the slot's counts once per vocabulary block, applies the
penalties in registers with the reference's operations and rounding (no
multiply-add contraction, correctly rounded division) and keeps the block's
maximum and its first index; the second picks, per row, the first block holding
the row's maximum, so ties resolve to the lowest token id as ``argmax`` does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...contract import SAMPLING_FREQUENCY, SAMPLING_GRAMMAR, SAMPLING_PRESENCE, SAMPLING_REPETITION
from ._common import next_power_of_2, pdl_level, pdl_options, require, require_same_device, wait_for_inputs

_BLOCK = 2048


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
    ok = cols < vocab
    rep = tl.load(sampling_ptr + slot * s_sampling + REP)
    presence = tl.load(sampling_ptr + slot * s_sampling + PRESENCE)
    frequency = tl.load(sampling_ptr + slot * s_sampling + FREQUENCY)
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
    logits = tl.where(ok, logits, float("-inf"))
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


def block_maxima(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's maximum logit per vocabulary block of _BLOCK and the block's first index of it,
    in one launch -> (values [B, blocks] float32, indices [B, blocks] int32). The first block
    holding a row's maximum holds its ``argmax`` (ties to the lowest id)."""
    kernel = "block_maxima"
    b, vocab = logits.shape
    require(logits.dtype == torch.float32 and logits.stride(1) == 1, kernel,
            f"logits must be float32 [B, V] with contiguous rows, got {logits.dtype} {tuple(logits.stride())}")
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


def greedy_tokens(logits: torch.Tensor, sampling: torch.Tensor, output_counts: torch.Tensor,
                  prompt_counts: torch.Tensor, slots: torch.Tensor, do_sample: torch.Tensor,
                  slot_token: torch.Tensor) -> torch.Tensor:
    """:func:`flare.model.sampling.greedy_tokens` in two launches (same arguments, same result)."""
    kernel = "greedy_tokens"
    b, vocab = logits.shape
    require(logits.dtype == torch.float32 and logits.stride(1) == 1, kernel,
            f"logits must be float32 [B, V] with contiguous rows, got {logits.dtype} {tuple(logits.stride())}")
    require(output_counts.shape == prompt_counts.shape and output_counts.shape[1] == vocab
            and output_counts.dtype == prompt_counts.dtype == torch.int32
            and output_counts.stride() == prompt_counts.stride() and output_counts.stride(1) == 1, kernel,
            f"counts must be int32 [slots, {vocab}] with the same contiguous rows")
    require(sampling.dtype == torch.float32 and sampling.stride(1) == 1, kernel, "sampling must be float32 rows")
    require(slots.shape == (b,) and do_sample.shape == (b,) and slot_token.dtype == torch.int64, kernel,
            f"slots and do_sample must be [{b}], slot_token int64")
    require_same_device(kernel, logits=logits, sampling=sampling, output_counts=output_counts,
                        prompt_counts=prompt_counts, slots=slots, do_sample=do_sample, slot_token=slot_token)
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
    require(logits.dtype == torch.float32 and logits.stride(1) == 1, kernel,
            f"logits must be float32 [B, V] with contiguous rows, got {logits.dtype} {tuple(logits.stride())}")
    require(masks.dtype == torch.int32 and masks.stride(1) == 1 and masks.shape[1] * 32 >= vocab, kernel,
            f"masks must be int32 [slots, >= {-(-vocab // 32)}] with contiguous rows")
    require(sampling.dtype == torch.float32 and sampling.stride(1) == 1, kernel, "sampling must be float32 rows")
    require(slots.shape == (b,), kernel, f"slots must be [{b}]")
    require_same_device(kernel, logits=logits, sampling=sampling, masks=masks, slots=slots)
    pdl = pdl_level(logits)
    _grammar_mask_kernel[(b, triton.cdiv(vocab, _MASK_BLOCK))](
        logits, sampling, masks, slots, vocab, logits.stride(0), sampling.stride(0), masks.stride(0),
        GRAMMAR=SAMPLING_GRAMMAR, BLOCK=_MASK_BLOCK, PDL=pdl, num_warps=4, **pdl_options(pdl),
    )


_MASK_BLOCK = 4096

__all__ = ["apply_grammar_masks", "block_maxima", "greedy_tokens"]
