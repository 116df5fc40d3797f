"""The slot bookkeeping around a step's forward pass, one launch on each side.

A decode program reads each row's slot state (token, position, page table) into
the attention metadata and, after sampling, writes the sampled token, the counts
and the completion record back. In torch (:class:`flare.model.programs.StepPrograms`'
own methods, the reference) that is about forty small gathers, scatters and
elementwise kernels per step, outside the programmatic-dependent-launch chain of
the forward: 0.09 ms of a 3.98 ms batch-1 step on the H200 (tools/bench_gpu.py
against tools/bench_step.py, 2026-11-30). Here one program per batch row does each
side; the results are the reference's, integer for integer.

A verification step (SPECULATIVE) has its own pair: the inputs of its w flat decode rows per
request (the request's last token and its drafts at consecutive positions), and after the
forward the acceptance (greedy: the longest prefix of drafts equal to the target's argmax) and
the writes of every accepted token. In torch they were some ninety launches, 0.17 ms of a
4.51 ms batch-1 width-5 verification on the H200 (tools/bench_speculative.py --profile).

Rows may repeat a slot only for padding (slot 0): those rows race on slot 0's
state and record, which nothing reads, as the reference's ``index_copy_`` would.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...contract import (
    REC_CONSUMED,
    REC_FLAG_PARTICIPATED,
    REC_FLAG_SAMPLED,
    REC_FLAGS,
    REC_GENERATED,
    REC_GENERATION,
    REC_KIND,
    REC_NEW_TOKENS,
    REC_SLOT,
    REC_TOKEN0,
    RECORD_FIELDS,
    GraphKind,
)
from ..attention import AttentionBatch
from ._common import next_power_of_2, pdl_level, pdl_options, require, wait_for_inputs
from .sampling import block_maxima


@triton.jit
def _decode_inputs_kernel(
    slots_ptr, slot_token_ptr, slot_position_ptr, slot_table_ptr,
    tokens_ptr, positions_ptr, write_index_ptr, table_ptr, kv_lens_ptr,
    max_position, max_pages, s_slot_table,
    PAGE: tl.constexpr, BLOCK_P: tl.constexpr, PDL: tl.constexpr,
):
    wait_for_inputs(PDL)
    row = tl.program_id(0)
    slot = tl.load(slots_ptr + row)
    position = tl.load(slot_position_ptr + slot)
    cols = tl.arange(0, BLOCK_P)
    source = slot_table_ptr + slot * s_slot_table
    tl.store(table_ptr + row * max_pages + cols, tl.load(source + cols, mask=cols < max_pages), mask=cols < max_pages)
    page = tl.load(source + tl.minimum(position // PAGE, max_pages - 1))
    tl.store(write_index_ptr + row, page * PAGE + position % PAGE)
    tl.store(positions_ptr + row, tl.minimum(position, max_position))
    tl.store(kv_lens_ptr + row, position + 1)
    tl.store(tokens_ptr + row, tl.load(slot_token_ptr + slot))


@triton.jit
def _commit_kernel(
    slots_ptr, token_ptr, do_sample_ptr, positions_ptr, slot_token_ptr, slot_generated_ptr, slot_generation_ptr,
    slot_position_ptr, counts_ptr, records_ptr, frame_ptr, num_slots, s_counts, kind, rows_ptr, hidden_ptr, width,
    FIELDS: tl.constexpr, BLOCK_F: tl.constexpr, F_SLOT: tl.constexpr, F_GENERATION: tl.constexpr,
    F_CONSUMED: tl.constexpr, F_GENERATED: tl.constexpr, F_NEW: tl.constexpr, F_KIND: tl.constexpr,
    F_FLAGS: tl.constexpr, F_TOKEN0: tl.constexpr, PARTICIPATED: tl.constexpr, SAMPLED: tl.constexpr,
    HAS_POSITIONS: tl.constexpr, HAS_ROWS: tl.constexpr, BLOCK_H: tl.constexpr, PDL: tl.constexpr,
):
    wait_for_inputs(PDL)
    row = tl.program_id(0)
    slot = tl.load(slots_ptr + row)
    if HAS_ROWS:  # the row's final hidden state into its slot (snapshots and resumes read it)
        for start in range(0, width, BLOCK_H):
            cols = start + tl.arange(0, BLOCK_H)
            ok = cols < width
            tl.store(hidden_ptr + slot * width + cols, tl.load(rows_ptr + row * width + cols, mask=ok), mask=ok)
    token = tl.load(token_ptr + row)
    if HAS_POSITIONS:  # the row's new slot position, stored before its record reads it
        consumed = tl.load(positions_ptr + row)
        tl.store(slot_position_ptr + slot, consumed)
    else:
        consumed = tl.load(slot_position_ptr + slot)
    sampled = (tl.load(do_sample_ptr + row) != 0).to(tl.int64)
    tl.store(slot_token_ptr + slot, token)
    generated = tl.load(slot_generated_ptr + slot) + sampled
    tl.store(slot_generated_ptr + slot, generated)
    # Integer atomics, as the reference's scatter_add_: exact in any order.
    tl.atomic_add(counts_ptr + slot * s_counts + token, sampled.to(tl.int32), mask=sampled != 0)
    fields = tl.arange(0, BLOCK_F)
    value = tl.where(fields == F_SLOT, slot, 0)
    value = tl.where(fields == F_GENERATION, tl.load(slot_generation_ptr + slot), value)
    value = tl.where(fields == F_CONSUMED, consumed, value)
    value = tl.where(fields == F_GENERATED, generated, value)
    value = tl.where(fields == F_NEW, sampled, value)
    value = tl.where(fields == F_KIND, kind, value)
    value = tl.where(fields == F_FLAGS, PARTICIPATED + SAMPLED * sampled, value)
    value = tl.where(fields == F_TOKEN0, token, value)
    frame = tl.load(frame_ptr)
    tl.store(records_ptr + (frame * num_slots + slot) * FIELDS + fields, value, mask=fields < FIELDS)


@triton.jit
def _verification_inputs_kernel(
    slots_ptr, num_tokens_ptr, step_tokens_ptr, s_step_tokens, slot_token_ptr, slot_position_ptr, slot_table_ptr,
    tokens_ptr, positions_ptr, write_index_ptr, table_ptr, kv_lens_ptr,
    max_position, max_pages, s_slot_table,
    W: tl.constexpr, PAGE: tl.constexpr, BLOCK_P: tl.constexpr, PDL: tl.constexpr,
):
    # One program per flat row i = row * W + q: position q of the row's verification. q = 0
    # feeds the slot's last token, q > 0 draft q - 1; a row reads the keys up to its own
    # position (the rows before it write theirs in the same layer), and positions past the
    # row's drafts write the scratch page.
    wait_for_inputs(PDL)
    i = tl.program_id(0)
    row = i // W
    q = i % W
    slot = tl.load(slots_ptr + row)
    drafts = tl.load(num_tokens_ptr + row)
    position = tl.load(slot_position_ptr + slot) + q
    fed = tl.load(step_tokens_ptr + row * s_step_tokens + tl.maximum(q - 1, 0))
    tl.store(tokens_ptr + i, tl.where(q == 0, tl.load(slot_token_ptr + slot), fed))
    cols = tl.arange(0, BLOCK_P)
    source = slot_table_ptr + slot * s_slot_table
    tl.store(table_ptr + i * max_pages + cols, tl.load(source + cols, mask=cols < max_pages), mask=cols < max_pages)
    page = tl.load(source + tl.minimum(position // PAGE, max_pages - 1))
    tl.store(write_index_ptr + i, tl.where(q <= drafts, page * PAGE + position % PAGE, 0))
    tl.store(positions_ptr + i, tl.minimum(position, max_position))
    tl.store(kv_lens_ptr + i, position - q + tl.minimum(q, drafts) + 1)


@triton.jit
def _verification_commit_kernel(
    slots_ptr, num_tokens_ptr, step_tokens_ptr, s_step_tokens, part_val_ptr, part_idx_ptr, num_blocks,
    token_ptr, accepted_ptr, rows_ptr, hidden_ptr, width,
    slot_token_ptr, slot_generated_ptr, slot_generation_ptr, slot_position_ptr,
    counts_ptr, s_counts, records_ptr, frame_ptr, num_slots, kind,
    W: tl.constexpr, BLOCK_W: tl.constexpr, GREEDY: tl.constexpr, BLOCKS: tl.constexpr,
    FIELDS: tl.constexpr, BLOCK_F: tl.constexpr, F_SLOT: tl.constexpr, F_GENERATION: tl.constexpr,
    F_CONSUMED: tl.constexpr, F_GENERATED: tl.constexpr, F_NEW: tl.constexpr, F_KIND: tl.constexpr,
    F_FLAGS: tl.constexpr, F_TOKEN0: tl.constexpr, FLAGS: tl.constexpr, BLOCK_H: tl.constexpr, PDL: tl.constexpr,
):
    # One program per request row: its W positions' choices, the accepted drafts k (the
    # longest prefix whose every draft the target chose), and the k + 1 emitted tokens.
    wait_for_inputs(PDL)
    row = tl.program_id(0)
    slot = tl.load(slots_ptr + row)
    q = tl.arange(0, BLOCK_W)
    in_row = q < W
    flat = row * W + q
    if GREEDY:  # the target's argmax at each position, from the block maxima
        blocks = tl.arange(0, BLOCKS)
        vals = tl.load(part_val_ptr + flat[:, None] * num_blocks + blocks[None, :],
                       mask=in_row[:, None] & (blocks < num_blocks)[None, :], other=float("-inf"))
        first = tl.argmax(vals, axis=1, tie_break_left=True)
        token = tl.load(part_idx_ptr + flat * num_blocks + first, mask=in_row, other=0).to(tl.int64)
        # position q's choice is checked against the token fed at q + 1: draft q
        following = tl.load(step_tokens_ptr + row * s_step_tokens + q, mask=q < W - 1, other=0)
        accepted = (q < tl.load(num_tokens_ptr + row)) & (following == token)
    else:
        token = tl.load(token_ptr + flat, mask=in_row, other=0)
        accepted = tl.load(accepted_ptr + flat, mask=in_row, other=0) != 0
    k = tl.min(tl.where(accepted & in_row, BLOCK_W, q), axis=0)  # the first position not accepted
    emitted = q <= k
    last = tl.sum(tl.where(q == k, token, 0), axis=0)
    source = rows_ptr + (row * W + k).to(tl.int64) * width
    for start in range(0, width, BLOCK_H):  # the last emitted position's hidden row into the slot's
        cols = start + tl.arange(0, BLOCK_H)
        ok = cols < width
        tl.store(hidden_ptr + slot * width + cols, tl.load(source + cols, mask=ok), mask=ok)
    position = tl.load(slot_position_ptr + slot) + k + 1
    tl.store(slot_position_ptr + slot, position)
    tl.store(slot_token_ptr + slot, last)
    generated = tl.load(slot_generated_ptr + slot) + k + 1
    tl.store(slot_generated_ptr + slot, generated)
    tl.atomic_add(counts_ptr + slot * s_counts + token, tl.full([BLOCK_W], 1, tl.int32), mask=emitted)
    fields = tl.arange(0, BLOCK_F)
    value = tl.where(fields == F_SLOT, slot, 0)
    value = tl.where(fields == F_GENERATION, tl.load(slot_generation_ptr + slot), value)
    value = tl.where(fields == F_CONSUMED, position, value)
    value = tl.where(fields == F_GENERATED, generated, value)
    value = tl.where(fields == F_NEW, k + 1, value)
    value = tl.where(fields == F_KIND, kind, value)
    value = tl.where(fields == F_FLAGS, FLAGS, value)
    record = records_ptr + (tl.load(frame_ptr) * num_slots + slot) * FIELDS
    tl.store(record + fields, value, mask=(fields < FIELDS) & ((fields < F_TOKEN0) | (fields >= F_TOKEN0 + W)))
    tl.store(record + F_TOKEN0 + q, tl.where(emitted, token, 0), mask=in_row)


def verification_inputs(buffers: dict[str, torch.Tensor], slots: torch.Tensor, width: int, context: int,
                        page_tokens: int) -> tuple[torch.Tensor, AttentionBatch]:
    """:meth:`StepPrograms._verification_inputs` in one launch: -> (tokens [B * W, 1], the
    attention batch of the B * W flat decode rows)."""
    kernel = "verification_inputs"
    table, step_tokens = buffers["slot.page_table"], buffers["step.tokens"]
    require(table.stride(1) == 1 and step_tokens.stride(1) == 1 and slots.dim() == 1 and slots.dtype == torch.int64,
            kernel, "slot.page_table and step.tokens rows must be contiguous and slots a 1-D int64 tensor")
    require(1 <= width <= step_tokens.shape[1] + 1, kernel, f"width {width} outside 1..{step_tokens.shape[1] + 1}")
    n, max_pages = slots.shape[0] * width, table.shape[1]
    device = slots.device
    tokens = torch.empty(n, 1, dtype=torch.int64, device=device)
    positions = torch.empty(n, 1, dtype=torch.int64, device=device)
    write_index = torch.empty(n, 1, dtype=torch.int64, device=device)
    page_table = torch.empty(n, max_pages, dtype=torch.int64, device=device)
    kv_lens = torch.empty(n, dtype=torch.int64, device=device)
    pdl = pdl_level(slots)
    _verification_inputs_kernel[(n,)](
        slots, buffers["step.num_tokens"], step_tokens, step_tokens.stride(0), buffers["slot.token"],
        buffers["slot.position"], table, tokens, positions, write_index, page_table, kv_lens,
        context - 1, max_pages, table.stride(0),
        W=width, PAGE=page_tokens, BLOCK_P=next_power_of_2(max_pages), PDL=pdl, num_warps=1, **pdl_options(pdl),
    )
    return tokens, AttentionBatch(positions=positions, write_index=write_index, page_table=page_table,
                                  kv_lens=kv_lens, keys_this_step=width)


def commit_verification(buffers: dict[str, torch.Tensor], output_counts: torch.Tensor, slots: torch.Tensor,
                        rows: torch.Tensor, width: int, *, logits: torch.Tensor | None = None,
                        token: torch.Tensor | None = None, accepted: torch.Tensor | None = None,
                        hidden: torch.Tensor) -> None:
    """:meth:`StepPrograms._commit_verification`: greedy (``logits`` [B * W, V] float32) in two
    launches, the block maxima and the commit; sampled (the rejection sampler's ``token`` and
    ``accepted`` [B, W]) in one."""
    kernel = "commit_verification"
    records, step_tokens = buffers["out.records"], buffers["step.tokens"]
    b, w = slots.shape[0], width
    require(rows.shape == (b * w, hidden.shape[1]) and rows.dtype == hidden.dtype and rows.is_contiguous()
            and hidden.is_contiguous(), kernel,
            f"rows must be contiguous [{b * w}, {hidden.shape[1]}] {hidden.dtype}, "
            f"got {tuple(rows.shape)} {rows.dtype}")
    require((logits is None) != (token is None and accepted is None) and (token is None) == (accepted is None),
            kernel, "pass the logits (greedy) or the token and accepted tensors (sampled)")
    require(records.is_contiguous() and records.shape[2] == RECORD_FIELDS and output_counts.stride(1) == 1
            and REC_TOKEN0 + w <= RECORD_FIELDS and step_tokens.stride(1) == 1, kernel,
            "records must be contiguous [2, slots, RECORD_FIELDS] with room for the width, counts rows contiguous")
    if logits is not None:
        require(logits.shape[0] == b * w, kernel, f"logits must have {b * w} rows, got {tuple(logits.shape)}")
        part_val, part_idx = block_maxima(logits)
        num_blocks, token, accepted = part_val.shape[1], slots, slots
    else:
        require(token.shape == (b, w) and accepted.shape == (b, w) and token.dtype == torch.int64
                and token.is_contiguous() and accepted.is_contiguous(), kernel,
                f"token and accepted must be contiguous [{b}, {w}], token int64")
        part_val = part_idx = slots
        num_blocks = 1
    pdl = pdl_level(slots)
    _verification_commit_kernel[(b,)](
        slots, buffers["step.num_tokens"], step_tokens, step_tokens.stride(0), part_val, part_idx, num_blocks,
        token, accepted, rows, hidden, hidden.shape[1],
        buffers["slot.token"], buffers["slot.generated"], buffers["slot.generation"], buffers["slot.position"],
        output_counts, output_counts.stride(0), records, buffers["step.frame"], records.shape[1],
        int(GraphKind.SPECULATIVE),
        W=w, BLOCK_W=next_power_of_2(w), GREEDY=logits is not None, BLOCKS=next_power_of_2(num_blocks),
        FIELDS=RECORD_FIELDS, BLOCK_F=next_power_of_2(RECORD_FIELDS), F_SLOT=REC_SLOT, F_GENERATION=REC_GENERATION,
        F_CONSUMED=REC_CONSUMED, F_GENERATED=REC_GENERATED, F_NEW=REC_NEW_TOKENS, F_KIND=REC_KIND,
        F_FLAGS=REC_FLAGS, F_TOKEN0=REC_TOKEN0, FLAGS=REC_FLAG_PARTICIPATED + REC_FLAG_SAMPLED,
        BLOCK_H=min(1024, next_power_of_2(hidden.shape[1])), PDL=pdl, num_warps=1, **pdl_options(pdl),
    )


def decode_inputs(buffers: dict[str, torch.Tensor], slots: torch.Tensor, context: int,
                  page_tokens: int) -> tuple[torch.Tensor, AttentionBatch]:
    """:meth:`StepPrograms._decode_inputs` in one launch: -> (tokens [B, 1], the attention batch)."""
    kernel = "decode_inputs"
    table = buffers["slot.page_table"]
    require(table.stride(1) == 1 and slots.dim() == 1 and slots.dtype == torch.int64, kernel,
            "slot.page_table rows must be contiguous and slots a 1-D int64 tensor")
    b, max_pages = slots.shape[0], table.shape[1]
    device = slots.device
    tokens = torch.empty(b, 1, dtype=torch.int64, device=device)
    positions = torch.empty(b, 1, dtype=torch.int64, device=device)
    write_index = torch.empty(b, 1, dtype=torch.int64, device=device)
    page_table = torch.empty(b, max_pages, dtype=torch.int64, device=device)
    kv_lens = torch.empty(b, dtype=torch.int64, device=device)
    pdl = pdl_level(slots)
    _decode_inputs_kernel[(b,)](
        slots, buffers["slot.token"], buffers["slot.position"], table,
        tokens, positions, write_index, page_table, kv_lens,
        context - 1, max_pages, table.stride(0),
        PAGE=page_tokens, BLOCK_P=next_power_of_2(max_pages), PDL=pdl, num_warps=1, **pdl_options(pdl),
    )
    return tokens, AttentionBatch(positions=positions, write_index=write_index, page_table=page_table,
                                  kv_lens=kv_lens)


def commit_samples(buffers: dict[str, torch.Tensor], output_counts: torch.Tensor, slots: torch.Tensor,
                   token: torch.Tensor, do_sample: torch.Tensor, kind: int,
                   positions: torch.Tensor | None = None, rows: torch.Tensor | None = None, *,
                   hidden: torch.Tensor | None = None) -> None:
    """:meth:`StepPrograms._commit` in one launch: the sampled tokens (and ``positions``, the
    rows' new slot positions, when given) into the slot rows, the generated and penalty
    counts, each row's completion record into the current frame, and the step's final
    hidden ``rows`` [B, D], when given, into the slots' rows of ``hidden`` [S, D]."""
    kernel = "commit_samples"
    records = buffers["out.records"]
    b = slots.shape[0]
    if rows is not None:
        require(hidden is not None and hidden.dim() == 2 and hidden.is_contiguous(), kernel,
                "rows need the contiguous [slots, D] hidden store to write them into")
        require(rows.shape == (b, hidden.shape[1]) and rows.dtype == hidden.dtype and rows.is_contiguous(), kernel,
                f"rows must be contiguous [{b}, {hidden.shape[1]}] {hidden.dtype}, got {tuple(rows.shape)} "
                f"{rows.dtype}")
    require(token.shape == (b,) and do_sample.shape == (b,) and token.dtype == torch.int64, kernel,
            f"token and do_sample must be [{b}], token int64")
    require(positions is None or (positions.shape == (b,) and positions.dtype == torch.int64), kernel,
            f"positions must be [{b}] int64")
    require(records.is_contiguous() and records.shape[2] == RECORD_FIELDS and output_counts.stride(1) == 1, kernel,
            "records must be contiguous [2, slots, RECORD_FIELDS] and counts rows contiguous")
    pdl = pdl_level(slots)
    _commit_kernel[(b,)](
        slots, token, do_sample, positions if positions is not None else token,
        buffers["slot.token"], buffers["slot.generated"], buffers["slot.generation"],
        buffers["slot.position"], output_counts, records, buffers["step.frame"], records.shape[1],
        output_counts.stride(0), int(kind), rows if rows is not None else token,
        hidden if rows is not None else token, hidden.shape[1] if rows is not None else 0,
        FIELDS=RECORD_FIELDS, BLOCK_F=next_power_of_2(RECORD_FIELDS), F_SLOT=REC_SLOT, F_GENERATION=REC_GENERATION,
        F_CONSUMED=REC_CONSUMED, F_GENERATED=REC_GENERATED, F_NEW=REC_NEW_TOKENS, F_KIND=REC_KIND,
        F_FLAGS=REC_FLAGS, F_TOKEN0=REC_TOKEN0, PARTICIPATED=REC_FLAG_PARTICIPATED, SAMPLED=REC_FLAG_SAMPLED,
        HAS_POSITIONS=positions is not None, HAS_ROWS=rows is not None,
        BLOCK_H=min(1024, next_power_of_2(hidden.shape[1])) if rows is not None else 1,
        PDL=pdl, num_warps=1, **pdl_options(pdl),
    )


__all__ = ["commit_samples", "commit_verification", "decode_inputs", "verification_inputs"]
