"""Paged attention over the KV page pool: decode (Q == 1) and chunked prefill.

Contract: :func:`flare.model.attention.paged_attention_reference`. Query ``i`` of
row ``b`` at absolute position ``p`` attends to cached keys ``j`` with
``j <= p`` and ``j < kv_lens[b]``; keys live in pages ``page_table[b, j // 64]``
of ``k_pool``/``v_pool`` ``[num_pages, 64, Hkv, D]``.

One kernel serves both shapes. A program owns one (row, kv head) pair and a
block of ``BLOCK_M`` query rows, where a query row is a (query token, head of
the GQA group) pair: row ``r`` is token ``r // G`` and head ``kv_head * G + r % G``,
so each K/V page is read once per group rather than once per query head. It walks
the row's pages ``pages_per_step`` at a time (BLOCK_N = 64 or 128 keys) with an
online softmax in fp32 (FlashAttention-2's rescaled accumulator).

When (row, kv head, query block) programs alone cannot fill the GPU (decode below
a few hundred rows x kv heads, a short prefill chunk over a long prefix) the
context is split into ``num_splits`` parts (flash-decoding): the count is chosen on the host
from static shapes only, while each split's page range is computed on the device
from the row's actual length, so short rows do not leave most splits idle and
the launch stays graph-capturable. Each split writes a normalised partial output
and its log-sum-exp; a second kernel merges them.

Padding rows (kv_lens 0, garbage positions) read no pages past the clamped
length and produce zeros; page ids are clamped into the pool, so no index can
leave it.

H200, bf16 Llama-3-8B heads, 8k-context page tables (tools/bench_kernels.py): decode
at B=64 over 8k keys streams K/V at 4.46 TB/s (F.scaled_dot_product_attention on
contiguous K/V: 4.55), B=1 over 8k keys takes 21 us (SDPA 17); a 512-token chunk
over a 4k prefix 135 us (SDPA 142), a fresh 2048-token prefill 146 us (SDPA 91).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from ...config import PAGE_TOKENS
from ..attention import AttentionBatch, PackedBatch, PackedRows, fresh_sdpa_attention
from ._common import (
    INTERPRETED,
    dot_precision,
    next_power_of_2,
    pdl_level,
    pdl_options,
    require,
    require_float,
    require_inner_contiguous,
    require_same_device,
    sm_count,
    wait_for_inputs,
)

MAX_SPLITS = 16
# Decode splits until (row, kv head, split) programs number about this many times
# the SM count. H200 sweep, bf16 Llama-3-8B heads, us per call for waves 1/2/4/8:
# B=1 ctx 8192 21.7/19.6/19.9/19.6, B=64 ctx 8192 609/611/516/499 (3 splits).
# More than 16 splits cost 3 us at B=1 on short contexts (empty splits still merge).
# Short contexts at mid batch prefer fewer splits (B=32 over 1k keys: 40.7 us at 2
# waves, 46.6 at 8), but the count is static and long contexts gain far more.
DECODE_WAVES = 8
# Prefill partials are [S, B, Q, H, D] fp32, tens of MB at Q=512: split only a grid
# smaller than one wave (a short chunk over a long prefix), to about two waves.
PREFILL_WAVES = 2
MERGE_ROWS = 16  # (b, token, head) rows per merge program
# Decode programs resident per SM with the first K/V step preloaded (AttentionLaunch.preload):
# the two held tiles take the Llama-3-8B heads' kernel from 128 to 227 registers (sm_90
# compile), two programs an SM. The preload runs only when the whole grid fits at once:
# programs of a later wave start after the kernel before has finished anyway, and a grid
# of several waves (large batches, long contexts) would lose half its occupancy.
PRELOAD_PROGRAMS_PER_SM = 2
LOG2_E = 1.4426950408889634  # 1 / ln 2: scores are kept in log2 units for exp2
# Stand-in for -inf that keeps exp2 differences finite (no inf - inf = NaN).
NEG_BIG = tl.constexpr(-1.0e30)


@triton.jit
def _paged_attention_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, part_o_ptr, part_lse_ptr, counter_ptr,
    positions_ptr, page_table_ptr, kv_lens_ptr, q_start_ptr, q_len_ptr, block_row_ptr, block_idx_ptr,
    qk_scale, batch_size, num_queries, num_heads, max_pages, num_pool_pages, min_steps,
    s_qb, s_qq, s_qh,
    s_ob, s_oq, s_oh,
    s_kp, s_kt, s_kh,
    s_vp, s_vt, s_vh,
    s_pb, s_pq, s_tb,
    NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, PAGE: tl.constexpr, PAGES_PER_STEP: tl.constexpr, BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    PRECISION: tl.constexpr, MERGE_IN_KERNEL: tl.constexpr, DECODE_DIRECT: tl.constexpr, PRELOAD: tl.constexpr,
    PDL: tl.constexpr, VARLEN: tl.constexpr, UNMASKED_STEPS: tl.constexpr,
):
    # MERGE_IN_KERNEL (with NUM_SPLITS > 1): no merge kernel. Of a (row, kv head, block),
    # only the splits that hold keys take part: one alone writes the output, several
    # count themselves in at counter_ptr and the last to finish merges their partials.
    # DECODE_DIRECT (decode, NUM_SPLITS > 1, the merge kernel after it): a row whose keys one
    # split holds is written by split 0, and only the splits holding keys store partials.
    # PRELOAD (decode): the metadata and the split's first K/V step are read before the
    # PDL wait (see the wrapper); only the new key of the row's position is read after.
    if not PRELOAD:
        wait_for_inputs(PDL)
    block = tl.program_id(0)
    pair = tl.program_id(1)
    split = tl.program_id(2)
    if VARLEN:
        # Packed rows: program (i, kv head) takes query block block_idx[i] of row block_row[i],
        # so only blocks some row holds are launched; block_row[i] == batch_size marks the
        # few spare programs of the static grid (they read and write nothing).
        b = tl.load(block_row_ptr + block)
        spare = b >= batch_size
        b = tl.minimum(b, batch_size - 1)
        block = tl.load(block_idx_ptr + block)
        kv_head = pair
    else:
        b = pair // NUM_KV_HEADS
        kv_head = pair % NUM_KV_HEADS

    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    token = rows // GROUP
    head = kv_head * GROUP + rows % GROUP
    # VARLEN (packed rows): row b's queries are the flat tokens q_start[b] .. + q_len[b] of a
    # [1, N] stream (its batch strides are 0); num_queries bounds the grid, not the row.
    if VARLEN:
        q0 = tl.load(q_start_ptr + b)
        row_ok = (token < tl.load(q_len_ptr + b)) & (not spare)
    else:
        q0 = 0
        row_ok = token < num_queries
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < HEAD_DIM

    # Visible keys of each query row: j < min(position + 1, kv_len), clamped into the
    # page table so padding rows with garbage metadata stay in bounds.
    kv_len = tl.load(kv_lens_ptr + b)
    kv_len = tl.minimum(tl.maximum(kv_len, 0), max_pages * PAGE)
    position = tl.load(positions_ptr + b * s_pb + (q0 + token) * s_pq, mask=row_ok, other=-1)
    limit = tl.minimum(position + 1, kv_len)
    limit = tl.where(row_ok, tl.maximum(limit, 0), 0)  # [BLOCK_M]
    # Keys are visited BLOCK_N = PAGE * PAGES_PER_STEP at a time.
    num_steps = tl.cdiv(tl.max(limit, axis=0), BLOCK_N)
    # At least min_steps a split: a short row takes fewer splits (the rest have no keys).
    steps_per_split = _split_steps(num_steps, min_steps, NUM_SPLITS)
    first = split * steps_per_split
    last = tl.minimum(first + steps_per_split, num_steps)

    m_i = tl.full([BLOCK_M], NEG_BIG, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    offs_n = tl.arange(0, BLOCK_N)
    in_page = offs_n % PAGE
    k_base = k_ptr + kv_head * s_kh
    v_base = v_ptr + kv_head * s_vh
    table = page_table_ptr + b * s_tb
    start = first
    if PRELOAD:
        # The first step's keys stream in while the kernels before finish. The new key
        # (the row's own position, written by this step's qkv) may not have landed: its
        # page is looked up now and its row reloaded after the wait.
        has_first = first < last
        page = _step_pages(table, first, offs_n, max_pages, num_pool_pages, PAGE, PAGES_PER_STEP)
        k_first = _load_keys(k_base, page, in_page, dims, dim_ok, s_kp, s_kt, has_first)
        v_first = _load_values(v_base, page, in_page, dims, dim_ok, s_vp, s_vt, has_first)
        new_key = tl.max(tl.where(row_ok, position, -1), axis=0)
        new_page = tl.load(table + tl.minimum(tl.maximum(new_key, 0) // PAGE, max_pages - 1)).to(tl.int64)
        new_page = tl.minimum(tl.maximum(new_page, 0), num_pool_pages - 1)
        new_in_first = has_first & (new_key >= 0) & (new_key // BLOCK_N == first)
        wait_for_inputs(PDL)
        new_at = new_page * s_kp + (new_key % PAGE) * s_kt
        new_k = tl.load(k_base + new_at + dims, mask=dim_ok & new_in_first, other=0.0)
        new_v = tl.load(v_base + (new_page * s_vp + (new_key % PAGE) * s_vt) + dims, mask=dim_ok & new_in_first,
                        other=0.0)
    q = tl.load(q_ptr + b * s_qb + (q0 + token[:, None]) * s_qq + head[:, None] * s_qh + dims[None, :],
                mask=row_ok[:, None] & dim_ok[None, :], other=0.0)  # [BLOCK_M, BLOCK_D]
    if PRELOAD:
        lane_new = (offs_n == new_key % BLOCK_N) & new_in_first  # [BLOCK_N]
        k_first = tl.where(lane_new[None, :], new_k[:, None], k_first)
        v_first = tl.where(lane_new[:, None], new_v[None, :], v_first)
        if has_first:
            prob, alpha, m_i, l_i = _scores(q, k_first, first, limit, m_i, l_i, offs_n, qk_scale, BLOCK_N, PRECISION)
            acc = acc * alpha[:, None] + tl.dot(prob.to(v_first.dtype), v_first, input_precision=PRECISION)
        start = first + 1
    masked_from = start
    if UNMASKED_STEPS:
        # Steps whose every key all of the block's rows see (below the causal diagonal and
        # the row's length) skip the visibility mask: the same sums, less work a tile.
        # Rows outside the block's tokens hold q = 0 and are never stored.
        seen_by_all = tl.min(tl.where(row_ok, limit, max_pages * PAGE), axis=0) // BLOCK_N
        masked_from = tl.minimum(tl.maximum(seen_by_all, start), last)
        for step in range(start, masked_from):
            page = _step_pages(table, step, offs_n, max_pages, num_pool_pages, PAGE, PAGES_PER_STEP)
            k = _load_keys(k_base, page, in_page, dims, dim_ok, s_kp, s_kt, True)
            prob, alpha, m_i, l_i = _visible_scores(q, k, m_i, l_i, qk_scale, PRECISION)
            v = _load_values(v_base, page, in_page, dims, dim_ok, s_vp, s_vt, True)
            acc = acc * alpha[:, None] + tl.dot(prob.to(v.dtype), v, input_precision=PRECISION)
    m_i, l_i, acc = _masked_steps(q, k_base, v_base, table, masked_from, last, limit, m_i, l_i, acc, offs_n, in_page,
                                  dims, dim_ok, max_pages, num_pool_pages, qk_scale, s_kp, s_kt, s_vp, s_vt, PAGE,
                                  PAGES_PER_STEP, BLOCK_N, PRECISION)

    has_keys = l_i > 0.0
    out = acc / tl.where(has_keys, l_i, 1.0)[:, None]
    store_ok = row_ok[:, None] & dim_ok[None, :]
    out_rows = out_ptr + b * s_ob + (q0 + token[:, None]) * s_oq + head[:, None] * s_oh + dims[None, :]
    # Splits holding keys: the first cdiv(num_steps, steps_per_split) (none for a padding row,
    # whose output split 0 writes as zeros).
    active = _active_splits(num_steps, steps_per_split)
    if NUM_SPLITS == 1:
        tl.store(out_rows, out.to(out_ptr.dtype.element_ty), mask=store_ok)
    elif DECODE_DIRECT or MERGE_IN_KERNEL:
        if active <= 1:
            # A row whose keys one split holds: split 0 writes the output (exactly what the
            # merge of one non-empty split gives), the others nothing; no merge reads it.
            if split == 0:
                tl.store(out_rows, out.to(out_ptr.dtype.element_ty), mask=store_ok)
        elif split < active:  # a merge reads the first `active` splits only
            _store_partial(out, m_i, l_i, has_keys, part_o_ptr, part_lse_ptr, split, batch_size, b, num_queries,
                           token, num_heads, head, dims, row_ok, store_ok, HEAD_DIM)
            if MERGE_IN_KERNEL:
                _merge_if_last(counter_ptr + block * (batch_size * NUM_KV_HEADS) + pair, active, part_o_ptr,
                               part_lse_ptr, (b * num_queries + token) * num_heads + head, row_ok,
                               batch_size * num_queries * num_heads, dims, store_ok, out_rows, NUM_SPLITS, HEAD_DIM)
    else:
        _store_partial(out, m_i, l_i, has_keys, part_o_ptr, part_lse_ptr, split, batch_size, b, num_queries, token,
                       num_heads, head, dims, row_ok, store_ok, HEAD_DIM)


@triton.jit
def _store_partial(out, m_i, l_i, has_keys, part_o_ptr, part_lse_ptr, split, batch_size, b, num_queries, token,
                   num_heads, head, dims, row_ok, store_ok, HEAD_DIM: tl.constexpr):
    """A split's normalised output and log-sum-exp into the partials, [S, B, Q, H, D] and
    [S, B, Q, H] (contiguous)."""
    part_row = ((split * batch_size + b) * num_queries + token) * num_heads + head
    tl.store(part_o_ptr + part_row[:, None] * HEAD_DIM + dims[None, :], out, mask=store_ok)
    tl.store(part_lse_ptr + part_row, _log_sum_exp(m_i, l_i, has_keys), mask=row_ok)


@triton.jit
def _decode_steps(position, kv_len, max_pages, min_steps, PAGE: tl.constexpr, BLOCK_N: tl.constexpr,
                  NUM_SPLITS: tl.constexpr):
    """A decode row's key steps and steps a split, as the merge kernel finds them from the
    row's metadata: keys j < min(position + 1, kv_len), clamped into the page table, which is
    what the attention kernel's block-wide limit comes to when Q == 1."""
    kv_len = tl.minimum(tl.maximum(kv_len, 0), max_pages * PAGE)
    limit = tl.maximum(tl.minimum(position + 1, kv_len), 0)
    num_steps = tl.cdiv(limit, BLOCK_N)
    return num_steps, _split_steps(num_steps, min_steps, NUM_SPLITS)


@triton.jit
def _split_steps(num_steps, min_steps, NUM_SPLITS: tl.constexpr):
    """Key steps a split: the row's steps over the splits, at least ``min_steps``."""
    return tl.maximum(tl.cdiv(num_steps, NUM_SPLITS), min_steps)


@triton.jit
def _active_splits(num_steps, steps_per_split):
    """Splits holding keys: the first cdiv(num_steps, steps_per_split); none without keys."""
    return tl.where(num_steps > 0, tl.cdiv(num_steps, tl.maximum(steps_per_split, 1)), 0)


@triton.jit
def _step_pages(table, step, offs_n, max_pages, num_pool_pages, PAGE: tl.constexpr, PAGES_PER_STEP: tl.constexpr):
    """Page ids of the keys of ``step`` (a scalar for one page a step, else one per key),
    clamped into the pool; a step past the table reads page 0 of the row (masked)."""
    if PAGES_PER_STEP == 1:
        page = tl.load(table + tl.minimum(step, max_pages - 1)).to(tl.int64)
    else:
        # The last step may run past Pmax: scratch page, masked.
        page_idx = step * PAGES_PER_STEP + offs_n // PAGE
        page = tl.load(table + page_idx, mask=page_idx < max_pages, other=0).to(tl.int64)
    return tl.minimum(tl.maximum(page, 0), num_pool_pages - 1)


@triton.jit
def _load_keys(k_base, page, in_page, dims, dim_ok, s_kp, s_kt, ok):
    """K of one step, [BLOCK_D, BLOCK_N] (the dot's right operand)."""
    return tl.load(k_base + (page * s_kp + in_page * s_kt)[None, :] + dims[:, None], mask=dim_ok[:, None] & ok,
                   other=0.0)


@triton.jit
def _load_values(v_base, page, in_page, dims, dim_ok, s_vp, s_vt, ok):
    """V of one step, [BLOCK_N, BLOCK_D]."""
    return tl.load(v_base + (page * s_vp + in_page * s_vt)[:, None] + dims[None, :], mask=dim_ok[None, :] & ok,
                   other=0.0)


@triton.jit
def _scores(q, k, step, limit, m_i, l_i, offs_n, qk_scale, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    """One online-softmax step over keys ``step * BLOCK_N + offs_n``: (probabilities,
    the accumulator's rescale, the new running max and sum)."""
    s = tl.dot(q, k, input_precision=PRECISION) * qk_scale  # [BLOCK_M, BLOCK_N], log2 units
    visible = (step * BLOCK_N + offs_n)[None, :] < limit[:, None]
    s = tl.where(visible, s, NEG_BIG)
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp2(m_i - m_new)
    prob = tl.where(visible, tl.exp2(s - m_new[:, None]), 0.0)
    return prob, alpha, m_new, l_i * alpha + tl.sum(prob, axis=1)


@triton.jit
def _masked_steps(q, k_base, v_base, table, start, end, limit, m_i, l_i, acc, offs_n, in_page, dims, dim_ok, max_pages,
                  num_pool_pages, qk_scale, s_kp, s_kt, s_vp, s_vt, PAGE: tl.constexpr, PAGES_PER_STEP: tl.constexpr,
                  BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    """Online-softmax steps ``start .. end - 1``, each key masked to the query rows' ``limit``:
    the running max, sum and accumulator after them."""
    for step in range(start, end):
        page = _step_pages(table, step, offs_n, max_pages, num_pool_pages, PAGE, PAGES_PER_STEP)
        k = _load_keys(k_base, page, in_page, dims, dim_ok, s_kp, s_kt, True)
        prob, alpha, m_i, l_i = _scores(q, k, step, limit, m_i, l_i, offs_n, qk_scale, BLOCK_N, PRECISION)
        v = _load_values(v_base, page, in_page, dims, dim_ok, s_vp, s_vt, True)
        acc = acc * alpha[:, None] + tl.dot(prob.to(v.dtype), v, input_precision=PRECISION)
    return m_i, l_i, acc


@triton.jit
def _visible_scores(q, k, m_i, l_i, qk_scale, PRECISION: tl.constexpr):
    """:func:`_scores` over a step whose keys every row sees (no mask)."""
    s = tl.dot(q, k, input_precision=PRECISION) * qk_scale
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp2(m_i - m_new)
    prob = tl.exp2(s - m_new[:, None])
    return prob, alpha, m_new, l_i * alpha + tl.sum(prob, axis=1)


@triton.jit
def _log_sum_exp(m_i, l_i, has_keys):
    """A split's log2-sum-exp per query row (NEG_BIG where it saw no key: weight 0)."""
    return tl.where(has_keys, m_i + tl.log2(tl.where(has_keys, l_i, 1.0)), NEG_BIG)


@triton.jit
def _merge_partials(part_o_ptr, part_lse_ptr, rows, row_ok, num_rows, dims, mask, num_active,
                    NUM_SPLITS: tl.constexpr, HEAD_DIM: tl.constexpr, CACHE: tl.constexpr):
    """The merged output of flat (b, token, head) ``rows`` from the splits' normalised
    partials [S, rows, D] and log-sum-exps [S, rows], in split order; of each row only the
    first ``num_active`` (a count a row) splits are read (the rest weigh exactly 0 where
    written: the same bits)."""
    lse_max = tl.full(rows.shape, NEG_BIG, dtype=tl.float32)
    for split in tl.static_range(NUM_SPLITS):
        lse_max = tl.maximum(lse_max, tl.load(part_lse_ptr + split * num_rows + rows,
                                              mask=row_ok & (split < num_active), other=NEG_BIG,
                                              cache_modifier=CACHE))
    # The split holding the maximum weighs 1, so the denominator is never 0 (all
    # splits empty: every weight is 1 and every partial is 0).
    weight_sum = tl.zeros(rows.shape, dtype=tl.float32)
    acc = tl.zeros([rows.shape[0], dims.shape[0]], dtype=tl.float32)
    for split in tl.static_range(NUM_SPLITS):
        lse = tl.load(part_lse_ptr + split * num_rows + rows, mask=row_ok & (split < num_active), other=NEG_BIG,
                      cache_modifier=CACHE)
        weight = tl.exp2(lse - lse_max)
        part = tl.load(part_o_ptr + (split * num_rows + rows)[:, None] * HEAD_DIM + dims[None, :],
                       mask=mask & (split < num_active)[:, None], other=0.0, cache_modifier=CACHE)
        weight_sum += weight
        acc += part * weight[:, None]
    return acc / weight_sum[:, None]


@triton.jit
def _merge_if_last(counter, active, part_o_ptr, part_lse_ptr, flat, row_ok, num_rows, dims, store_ok, out_rows,
                   NUM_SPLITS: tl.constexpr, HEAD_DIM: tl.constexpr):
    """The in-kernel merge, after a split stored its partial: the split that counts last at
    ``counter`` (of ``active`` splits) merges flat rows ``flat`` into ``out_rows`` and resets
    the counter for the next launch. The CTA's partial stores, then one thread's device-scope
    release count: the split that counts last acquires them and reads them from L2 (.cg),
    never from a stale L1 line (CUTLASS's semaphore: barrier, then one release)."""
    tl.debug_barrier()
    if tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == active - 1:
        merged = _merge_partials(part_o_ptr, part_lse_ptr, flat, row_ok, num_rows, dims, store_ok,
                                 tl.zeros_like(flat) + active, NUM_SPLITS, HEAD_DIM, ".cg")
        tl.store(out_rows, merged.to(out_rows.dtype.element_ty), mask=store_ok)
        tl.atomic_xchg(counter, 0)


@triton.jit
def _store_merged(part_o_ptr, part_lse_ptr, out_at, rows, row_ok, num_rows, active, NUM_SPLITS: tl.constexpr,
                  HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    """Flat rows ``rows`` merged from their first ``active`` splits' partials, stored at each
    row's output ``out_at`` (a pointer a row)."""
    dims = tl.arange(0, BLOCK_D)
    mask = row_ok[:, None] & (dims < HEAD_DIM)[None, :]
    out = _merge_partials(part_o_ptr, part_lse_ptr, rows, row_ok, num_rows, dims, mask, active, NUM_SPLITS,
                          HEAD_DIM, "")
    tl.store(out_at[:, None] + dims[None, :], out.to(out_at.dtype.element_ty), mask=mask)


@triton.jit
def _merge_splits_kernel(
    part_o_ptr, part_lse_ptr, out_ptr, positions_ptr, kv_lens_ptr,
    num_queries, num_heads, num_rows, max_pages, min_steps,
    s_ob, s_oq, s_oh, s_pb,
    NUM_SPLITS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr,
    PAGE: tl.constexpr, BLOCK_N: tl.constexpr, DECODE_DIRECT: tl.constexpr, EARLY_METADATA: tl.constexpr,
    PDL: tl.constexpr,
):
    # DECODE_DIRECT: the attention kernel wrote the rows whose keys one split holds itself, and
    # the partials of the first `active` splits of the others (the same count from the same
    # metadata). EARLY_METADATA: the metadata is read before the PDL wait (no kernel of the
    # chain writes it: the attention kernel's preload condition).
    if not EARLY_METADATA:
        wait_for_inputs(PDL)
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)  # flat (b, token, head) over [B, Q, H]
    row_ok = rows < num_rows
    head = rows % num_heads
    token = (rows // num_heads) % num_queries
    b = rows // (num_heads * num_queries)
    if DECODE_DIRECT:
        position = tl.load(positions_ptr + b * s_pb, mask=row_ok, other=-1)
        num_steps, steps_per_split = _decode_steps(position, tl.load(kv_lens_ptr + b, mask=row_ok, other=0),
                                                   max_pages, min_steps, PAGE, BLOCK_N, NUM_SPLITS)
        active = _active_splits(num_steps, steps_per_split)
        row_ok = row_ok & (active > 1)
    else:
        active = tl.full(rows.shape, NUM_SPLITS, dtype=tl.int32)
    if EARLY_METADATA:
        wait_for_inputs(PDL)
    _store_merged(part_o_ptr, part_lse_ptr, out_ptr + (b * s_ob + token * s_oq + head * s_oh), rows, row_ok, num_rows,
                  active, NUM_SPLITS, HEAD_DIM, BLOCK_D)


@triton.jit
def _balanced_plan(positions_ptr, kv_lens_ptr, s_pb, batch_size, max_pages, min_steps, target_items,
                   NUM_KV_HEADS: tl.constexpr, NUM_SPLITS: tl.constexpr, PAGE: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_B: tl.constexpr):
    """Every decode row's split of its keys, from the whole batch's lengths (the balanced
    launch and its merge compute it alike): per row [BLOCK_B] its visible keys (limit), key
    steps, steps a split and splits. Rows are cut into splits of about the same number of
    steps, so that the batch's (row, kv head, split) items number about ``target_items``,
    never a split under ``min_steps`` steps (a row shorter than that stays whole) and never
    more than NUM_SPLITS; a padding row is one item (it writes zeros)."""
    rows = tl.arange(0, BLOCK_B)
    ok = rows < batch_size
    position = tl.load(positions_ptr + rows * s_pb, mask=ok, other=-1)
    kv_len = tl.minimum(tl.maximum(tl.load(kv_lens_ptr + rows, mask=ok, other=0), 0), max_pages * PAGE)
    limit = tl.where(ok, tl.maximum(tl.minimum(position + 1, kv_len), 0), 0)
    num_steps = tl.cdiv(limit, BLOCK_N)
    chunk = tl.maximum(tl.cdiv(tl.sum(num_steps, axis=0) * NUM_KV_HEADS, target_items), min_steps)
    wanted = tl.minimum(tl.cdiv(num_steps, chunk), NUM_SPLITS)
    steps_per_split = tl.cdiv(num_steps, tl.maximum(wanted, 1))
    # Equal splits of steps_per_split leave no split empty: cdiv(num_steps, steps_per_split).
    splits = tl.where(num_steps > 0, tl.cdiv(num_steps, tl.maximum(steps_per_split, 1)), 1)
    return limit, num_steps, steps_per_split, tl.where(ok, splits, 0)


@triton.jit
def _pick(values, lanes, lane):
    """``values[lane]`` of a [BLOCK_B] vector held across the program's threads."""
    return tl.sum(tl.where(lanes == lane, values, 0), axis=0)


@triton.jit
def _balanced_decode_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, part_o_ptr, part_lse_ptr, counter_ptr,
    positions_ptr, page_table_ptr, kv_lens_ptr,
    qk_scale, batch_size, num_heads, max_pages, num_pool_pages, min_steps, num_programs,
    s_qb, s_qh, s_ob, s_oh,
    s_kp, s_kt, s_kh,
    s_vp, s_vt, s_vh,
    s_pb, s_tb,
    NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_B: tl.constexpr, PAGE: tl.constexpr, PAGES_PER_STEP: tl.constexpr,
    BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr, PRECISION: tl.constexpr, EARLY_METADATA: tl.constexpr,
    MERGE_IN_KERNEL: tl.constexpr, PDL: tl.constexpr,
):
    # Decode (Q == 1) on a fixed grid of num_programs: the batch's (row, kv head, split) items,
    # row by row, are taken in turn (item i by program i % num_programs). A row of one split
    # is written here, the others' partials by the merge (_balanced_merge_kernel), or with
    # MERGE_IN_KERNEL by the split that stores its partial last (counted at counter_ptr, one
    # counter a (row, kv head), as _paged_attention_kernel's in-kernel merge).
    # EARLY_METADATA: the rows' positions and lengths are read before the PDL wait (no kernel
    # of the chain writes them: the preload's condition).
    if not EARLY_METADATA:
        wait_for_inputs(PDL)
    lanes = tl.arange(0, BLOCK_B)
    limit_b, steps_b, per_split_b, splits_b = _balanced_plan(
        positions_ptr, kv_lens_ptr, s_pb, batch_size, max_pages, min_steps, num_programs,
        NUM_KV_HEADS, NUM_SPLITS, PAGE, BLOCK_N, BLOCK_B)
    items_b = splits_b * NUM_KV_HEADS
    ends_b = tl.cumsum(items_b, axis=0)
    starts_b = ends_b - items_b
    num_items = tl.sum(items_b, axis=0)
    if EARLY_METADATA:
        wait_for_inputs(PDL)
    rows = tl.arange(0, BLOCK_M)
    row_ok = rows < GROUP  # query row r: head kv_head * GROUP + r of the row's one token
    token = rows // GROUP
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < HEAD_DIM
    store_ok = row_ok[:, None] & dim_ok[None, :]
    offs_n = tl.arange(0, BLOCK_N)
    in_page = offs_n % PAGE
    for item in range(tl.program_id(0), num_items, num_programs):
        b = tl.sum((ends_b <= item).to(tl.int32), axis=0)
        local = item - _pick(starts_b, lanes, b)
        kv_head = local % NUM_KV_HEADS
        split = local // NUM_KV_HEADS
        num_steps = _pick(steps_b, lanes, b)
        steps_per_split = _pick(per_split_b, lanes, b)
        limit = tl.where(row_ok, _pick(limit_b, lanes, b), 0)  # [BLOCK_M]
        head = kv_head * GROUP + rows % GROUP
        q = tl.load(q_ptr + b * s_qb + head[:, None] * s_qh + dims[None, :], mask=store_ok, other=0.0)
        k_base = k_ptr + kv_head * s_kh
        v_base = v_ptr + kv_head * s_vh
        table = page_table_ptr + b * s_tb
        m_i = tl.full([BLOCK_M], NEG_BIG, dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        first = split * steps_per_split
        m_i, l_i, acc = _masked_steps(q, k_base, v_base, table, first, tl.minimum(first + steps_per_split, num_steps),
                                      limit, m_i, l_i, acc, offs_n, in_page, dims, dim_ok, max_pages, num_pool_pages,
                                      qk_scale, s_kp, s_kt, s_vp, s_vt, PAGE, PAGES_PER_STEP, BLOCK_N, PRECISION)
        has_keys = l_i > 0.0
        out = acc / tl.where(has_keys, l_i, 1.0)[:, None]
        row_splits = _pick(splits_b, lanes, b)
        out_rows = out_ptr + b * s_ob + head[:, None] * s_oh + dims[None, :]
        if row_splits == 1:
            tl.store(out_rows, out.to(out_ptr.dtype.element_ty), mask=store_ok)
        else:
            _store_partial(out, m_i, l_i, has_keys, part_o_ptr, part_lse_ptr, split, batch_size, b, 1, token,
                           num_heads, head, dims, row_ok, store_ok, HEAD_DIM)
            if MERGE_IN_KERNEL:
                _merge_if_last(counter_ptr + b * NUM_KV_HEADS + kv_head, row_splits, part_o_ptr, part_lse_ptr,
                               b * num_heads + head, row_ok, batch_size * num_heads, dims, store_ok, out_rows,
                               NUM_SPLITS, HEAD_DIM)


@triton.jit
def _balanced_merge_kernel(
    part_o_ptr, part_lse_ptr, out_ptr, positions_ptr, kv_lens_ptr,
    batch_size, num_heads, num_rows, max_pages, min_steps, num_programs,
    s_ob, s_oh, s_pb,
    NUM_KV_HEADS: tl.constexpr, NUM_SPLITS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_B: tl.constexpr, PAGE: tl.constexpr, BLOCK_N: tl.constexpr,
    EARLY_METADATA: tl.constexpr, PDL: tl.constexpr,
):
    # The rows _balanced_decode_kernel split (the same plan from the same metadata), merged
    # from their splits' partials; rows of one split were written by it.
    if not EARLY_METADATA:
        wait_for_inputs(PDL)
    _, _, _, splits_b = _balanced_plan(positions_ptr, kv_lens_ptr, s_pb, batch_size, max_pages, min_steps,
                                       num_programs, NUM_KV_HEADS, NUM_SPLITS, PAGE, BLOCK_N, BLOCK_B)
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)  # flat (b, head) over [B, H]
    b = rows // num_heads
    head = rows % num_heads
    active = tl.sum(tl.where(b[:, None] == tl.arange(0, BLOCK_B)[None, :], splits_b[None, :], 0), axis=1)
    row_ok = (rows < num_rows) & (active > 1)
    if EARLY_METADATA:
        wait_for_inputs(PDL)
    _store_merged(part_o_ptr, part_lse_ptr, out_ptr + (b * s_ob + head * s_oh), rows, row_ok, num_rows, active,
                  NUM_SPLITS, HEAD_DIM, BLOCK_D)


# Finished-split counters of the in-kernel merge, per device. Each launch leaves them at
# zero. A larger set replaces a smaller one, which stays alive (graphs captured with it
# still point at it); none is ever allocated inside a graph capture.
_COUNTERS: dict[tuple[str, int | None], list[torch.Tensor]] = {}


def _counters(device: torch.device, needed: int) -> torch.Tensor | None:
    """Zeroed int32 counters, at least ``needed``; None inside a capture that would need new ones."""
    held = _COUNTERS.setdefault((device.type, device.index), [])
    if held and held[-1].numel() >= needed:
        return held[-1]
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return None
    held.append(torch.zeros(max(needed, 1024), dtype=torch.int32, device=device))
    return held[-1]


def choose_num_splits(batch_size: int, num_kv_heads: int, num_query_blocks: int, max_pages: int,
                      device: torch.device, *, waves: int = DECODE_WAVES) -> int:
    """Context splits for a launch, from static shapes only (graph-capturable).

    A grid of at least half of ``waves`` x SMs programs is left whole; a smaller one
    is split until it reaches that target, at most MAX_SPLITS and never more than Pmax.
    """
    programs = batch_size * num_kv_heads * num_query_blocks
    target = waves * sm_count(device)
    if 2 * programs > target:
        return 1
    return max(1, min(MAX_SPLITS, max_pages, -(-target // programs)))


@dataclass(frozen=True)
class AttentionLaunch:
    """Launch shape of the attention kernel (the benchmark sweeps it).

    block_m: query rows (token, group head) per program; 0 picks the default
    (the group padded to 16 for decode, 64 for prefill).
    """

    block_m: int = 0
    pages_per_step: int = 1  # keys per online-softmax step, in 64-token pages
    num_warps: int = 4
    num_stages: int = 3
    waves: int = DECODE_WAVES
    # With context splits: the last split to finish merges the partials (one launch less)
    # instead of the merge kernel. Slower on the H200 (tools/bench_step.py: 3.940-3.947
    # ms per step against 3.883-3.893 with the merge kernel), so off.
    merge_in_kernel: bool = False
    # Decode (Q == 1) grids that fit the GPU at once (PRELOAD_PROGRAMS_PER_SM): read the
    # metadata and each split's first K/V step before the PDL wait, so they load while
    # the qkv GEMV finishes (paged_decode_attention).
    preload: bool = True
    # Decode grids whose (row, kv head) programs alone cover at least half the SMs (batch
    # 9 and up of the Llama-3-8B heads): each split takes at least this many steps, so a
    # row shorter than splits x steps runs in fewer splits, the others finding no keys.
    # The split count stays static (graph capture); only the row's length decides. Off: with
    # the last split merging it won at 192 cached keys (batch 32 4.752 against 4.850 ms a
    # step) and lost at 1,024 (batch 64 6.976 against 6.822; TUNING.md, "Context splits").
    min_split_steps: int = 1
    # Split decode (Q == 1, the merge kernel after it): a row whose keys one split holds is
    # written by that split, and the merge kernel reads only the splits that hold keys; off,
    # every split stores a partial and the merge reads all of them (the same bits either way).
    # On: H100 calls on 2026-12-07 (tools/bench_step.py "serving" against "full_merge") read
    # -0.5% a step at batch 16 and 32, -0.2% at batch 1, within noise at 64 (TUNING.md).
    direct_single_split: bool = True
    # Steps every query row of the block sees whole (below the causal diagonal) run
    # without the visibility mask (prefill; a decode row's steps are all but the last).
    unmasked_steps: bool = False
    # Decode grids too large for the preload: a fixed grid of this many programs an SM takes
    # the batch's (row, kv head, split) items in turn, each row's split count chosen on the
    # device from the batch's lengths (_balanced_plan), so short rows take one split and no
    # merge, and long rows as many as fill the grid (merge_in_kernel: split rows merged by their
    # last split). 0: the static splits (choose_num_splits) with their merge. Off: on an H100
    # (2026-12-07) it tied them at 8-64 rows over 192 keys and lost 2.4-3.0% at batch 64 over
    # 1,024 (TUNING.md, "Balanced decode grid").
    balanced_programs_per_sm: int = 0
    # The balanced launch splits no row into parts of fewer key steps (64-key pages) than this.
    balanced_min_steps: int = 4
    # Its software pipeline and register cap (ptxas -maxnreg; 0: the compiler's choice). sm_90,
    # Llama-3-8B heads: 255 registers at 3 stages uncapped (two programs an SM), 168 at 2
    # stages (three); capped at 168, 3 stages spill 8 bytes.
    balanced_num_stages: int = 3
    balanced_max_registers: int = 0


# H200 sweeps: for decode 3 stages beat 2 and 4; two pages per step won 1.3 us at
# B=1 over 8k keys but lost 1 us at 1k keys, so one. For prefill 64 rows x 4 warps
# x 3 stages beat 128-row blocks, 8 warps and two pages per step everywhere but a
# 64-token chunk (Q=2048 fresh: 144 us vs 170; Q=512 over 4k: 117 us vs 159).
DECODE_LAUNCH = AttentionLaunch(num_warps=4, num_stages=3, waves=DECODE_WAVES)
PREFILL_LAUNCH = AttentionLaunch(block_m=64, num_warps=4, num_stages=3, waves=PREFILL_WAVES, unmasked_steps=True)


def _check(kernel: str, q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
           batch: AttentionBatch) -> None:
    require(q.dim() == 4, kernel, f"q must be [B, Q, H, D], got shape {tuple(q.shape)}")
    require(k_pool.dim() == 4 and k_pool.shape == v_pool.shape, kernel,
            f"k_pool and v_pool must both be [num_pages, 64, Hkv, D], got {tuple(k_pool.shape)} "
            f"and {tuple(v_pool.shape)}")
    b, nq, h, d = q.shape
    num_pages, page, hkv, dk = k_pool.shape
    require(page == PAGE_TOKENS, kernel, f"pages must hold {PAGE_TOKENS} tokens, got {page}")
    require(dk == d, kernel, f"q head_dim {d} != cache head_dim {dk}")
    require(hkv > 0 and h % hkv == 0, kernel, f"query heads {h} must be a multiple of kv heads {hkv}")
    require(d <= 256, kernel, f"head_dim {d} is above the supported 256")
    require(num_pages > 0, kernel, "the page pool is empty")
    for name, t in (("q", q), ("k_pool", k_pool), ("v_pool", v_pool)):
        require_float(kernel, name, t)
        require_inner_contiguous(kernel, name, t)
    require(k_pool.dtype == v_pool.dtype == q.dtype, kernel,
            f"q, k_pool, v_pool dtypes differ: {q.dtype}, {k_pool.dtype}, {v_pool.dtype}")
    require(tuple(batch.positions.shape) == (b, nq), kernel,
            f"positions must be [B, Q] = {(b, nq)}, got {tuple(batch.positions.shape)}")
    require(batch.page_table.dim() == 2 and batch.page_table.shape[0] == b and batch.page_table.shape[1] > 0,
            kernel, f"page_table must be [B={b}, Pmax>0], got {tuple(batch.page_table.shape)}")
    require(tuple(batch.kv_lens.shape) == (b,), kernel, f"kv_lens must be [B={b}], got {tuple(batch.kv_lens.shape)}")
    for name, t in (("positions", batch.positions), ("page_table", batch.page_table), ("kv_lens", batch.kv_lens)):
        require(t.dtype in (torch.int64, torch.int32), kernel, f"{name} must be int64 or int32, got {t.dtype}")
    require(batch.page_table.stride(1) == 1, kernel, "page_table rows must be contiguous")
    require(batch.kv_lens.is_contiguous(), kernel, "kv_lens must be contiguous")
    require_same_device(kernel, q=q, k_pool=k_pool, v_pool=v_pool, positions=batch.positions,
                        page_table=batch.page_table, kv_lens=batch.kv_lens)


def _launch(kernel: str, q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, batch: AttentionBatch,
            scale: float, *, launch: AttentionLaunch, num_splits: int | None,
            out: torch.Tensor | None = None) -> torch.Tensor:
    _check(kernel, q, k_pool, v_pool, batch)
    b, nq, h, d = q.shape
    num_pages, _, hkv, _ = k_pool.shape
    group = h // hkv
    max_pages = batch.page_table.shape[1]
    block_m = launch.block_m or (max(16, next_power_of_2(group)) if nq == 1 else 64)
    require(block_m >= 16 and block_m == next_power_of_2(block_m), kernel,
            f"block_m must be a power of two >= 16, got {block_m}")
    require(launch.pages_per_step in (1, 2, 4), kernel,
            f"pages_per_step must be 1, 2 or 4, got {launch.pages_per_step}")
    num_blocks = -(-nq * group // block_m)
    if num_splits is None:
        num_splits = choose_num_splits(b, hkv, num_blocks, max_pages, q.device, waves=launch.waves)
    require(1 <= num_splits <= MAX_SPLITS, kernel, f"num_splits must be in [1, {MAX_SPLITS}], got {num_splits}")
    if out is None:
        out = torch.empty((b, nq, h, d), dtype=q.dtype, device=q.device)
    require(tuple(out.shape) == (b, nq, h, d) and out.dtype == q.dtype and out.stride(3) == 1, kernel,
            f"out must be a [B, Q, H, D] = {(b, nq, h, d)} {q.dtype} view with contiguous heads")
    programs = num_blocks * b * hkv * num_splits
    require(launch.min_split_steps >= 1, kernel, f"min_split_steps must be at least 1, got {launch.min_split_steps}")
    min_steps = launch.min_split_steps if nq == 1 and 2 * num_blocks * b * hkv >= sm_count(q.device) else 1
    # Only a row's own key may land after the preload; a verification row's earlier positions
    # in the round are written by this step too (AttentionBatch.keys_this_step).
    preload = launch.preload and nq == 1 and batch.keys_this_step == 1 \
        and programs <= PRELOAD_PROGRAMS_PER_SM * sm_count(q.device)
    if nq == 1 and not preload and launch.balanced_programs_per_sm > 0:
        return _launch_balanced(q, k_pool, v_pool, batch, scale, launch, num_splits, out)
    counters = _counters(q.device, num_blocks * b * hkv) if num_splits > 1 and launch.merge_in_kernel else None
    if num_splits > 1:
        part_o = torch.empty((num_splits, b, nq, h, d), dtype=torch.float32, device=q.device)
        part_lse = torch.empty((num_splits, b, nq, h), dtype=torch.float32, device=q.device)
    else:
        part_o = part_lse = out  # unused by the kernel when NUM_SPLITS == 1
    block_d = max(16, next_power_of_2(d))
    pos, table = batch.positions, batch.page_table
    pdl = pdl_level(q)
    # Split decode rows whose keys one split holds skip the partials and the merge.
    decode_direct = launch.direct_single_split and num_splits > 1 and nq == 1 and counters is None
    _paged_attention_kernel[(num_blocks, b * hkv, num_splits)](
        q, k_pool, v_pool, out, part_o, part_lse, counters if counters is not None else out,
        pos, table, batch.kv_lens, batch.kv_lens, batch.kv_lens, batch.kv_lens, batch.kv_lens,
        float(scale) * LOG2_E, b, nq, h, max_pages, num_pages, min_steps,
        q.stride(0), q.stride(1), q.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        k_pool.stride(0), k_pool.stride(1), k_pool.stride(2),
        v_pool.stride(0), v_pool.stride(1), v_pool.stride(2),
        pos.stride(0), pos.stride(1), table.stride(0),
        NUM_KV_HEADS=hkv, GROUP=group, HEAD_DIM=d, BLOCK_D=block_d, BLOCK_M=block_m, PAGE=PAGE_TOKENS,
        PAGES_PER_STEP=launch.pages_per_step, BLOCK_N=PAGE_TOKENS * launch.pages_per_step,
        NUM_SPLITS=num_splits, PRECISION=dot_precision(q.dtype), MERGE_IN_KERNEL=counters is not None,
        DECODE_DIRECT=decode_direct, PRELOAD=preload, PDL=pdl, VARLEN=False, UNMASKED_STEPS=launch.unmasked_steps,
        num_warps=launch.num_warps, num_stages=launch.num_stages, **pdl_options(pdl),
    )
    if num_splits > 1 and counters is None:
        rows = b * nq * h
        block_r = MERGE_ROWS
        _merge_splits_kernel[(triton.cdiv(rows, block_r),)](
            part_o, part_lse, out, pos, batch.kv_lens, nq, h, rows, max_pages, min_steps,
            out.stride(0), out.stride(1), out.stride(2), pos.stride(0),
            NUM_SPLITS=num_splits, HEAD_DIM=d, BLOCK_D=block_d, BLOCK_R=block_r, PAGE=PAGE_TOKENS,
            BLOCK_N=PAGE_TOKENS * launch.pages_per_step, DECODE_DIRECT=decode_direct,
            EARLY_METADATA=decode_direct and launch.preload and batch.keys_this_step == 1, PDL=pdl, num_warps=4,
            **pdl_options(pdl),
        )
    return out


def _launch_balanced(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, batch: AttentionBatch,
                     scale: float, launch: AttentionLaunch, num_splits: int, out: torch.Tensor) -> torch.Tensor:
    """Decode attention on the balanced grid (AttentionLaunch.balanced_programs_per_sm): at most
    ``num_splits`` splits a row, the count chosen on the device; then the merge of split rows."""
    b, _, h, d = q.shape
    num_pages, _, hkv, _ = k_pool.shape
    group = h // hkv
    max_pages = batch.page_table.shape[1]
    require(launch.balanced_min_steps >= 1, "paged_decode_attention",
            f"balanced_min_steps must be at least 1, got {launch.balanced_min_steps}")
    programs = max(1, min(b * hkv * num_splits, launch.balanced_programs_per_sm * sm_count(q.device)))
    part_o = torch.empty((num_splits, b, 1, h, d), dtype=torch.float32, device=q.device)
    part_lse = torch.empty((num_splits, b, 1, h), dtype=torch.float32, device=q.device)
    block_d, block_b = max(16, next_power_of_2(d)), max(16, next_power_of_2(b))
    block_n = PAGE_TOKENS * launch.pages_per_step
    pos, table = batch.positions, batch.page_table
    pdl = pdl_level(q)
    early = launch.preload and batch.keys_this_step == 1
    # None inside a capture that would need new counters: the merge kernel then
    counters = _counters(q.device, b * hkv) if num_splits > 1 and launch.merge_in_kernel else None
    _balanced_decode_kernel[(programs,)](
        q, k_pool, v_pool, out, part_o, part_lse, counters if counters is not None else out, pos, table,
        batch.kv_lens,
        float(scale) * LOG2_E, b, h, max_pages, num_pages, launch.balanced_min_steps, programs,
        q.stride(0), q.stride(2), out.stride(0), out.stride(2),
        k_pool.stride(0), k_pool.stride(1), k_pool.stride(2),
        v_pool.stride(0), v_pool.stride(1), v_pool.stride(2),
        pos.stride(0), table.stride(0),
        NUM_KV_HEADS=hkv, GROUP=group, HEAD_DIM=d, BLOCK_D=block_d, BLOCK_M=max(16, next_power_of_2(group)),
        BLOCK_B=block_b, PAGE=PAGE_TOKENS, PAGES_PER_STEP=launch.pages_per_step, BLOCK_N=block_n,
        NUM_SPLITS=num_splits, PRECISION=dot_precision(q.dtype), EARLY_METADATA=early,
        MERGE_IN_KERNEL=counters is not None, PDL=pdl,
        num_warps=launch.num_warps, num_stages=launch.balanced_num_stages, **pdl_options(pdl),
        **({"maxnreg": launch.balanced_max_registers} if launch.balanced_max_registers and not INTERPRETED else {}),
    )
    if num_splits > 1 and counters is None:
        rows = b * h
        _balanced_merge_kernel[(triton.cdiv(rows, MERGE_ROWS),)](
            part_o, part_lse, out, pos, batch.kv_lens, b, h, rows, max_pages, launch.balanced_min_steps, programs,
            out.stride(0), out.stride(2), pos.stride(0),
            NUM_KV_HEADS=hkv, NUM_SPLITS=num_splits, HEAD_DIM=d, BLOCK_D=block_d, BLOCK_R=MERGE_ROWS,
            BLOCK_B=block_b, PAGE=PAGE_TOKENS, BLOCK_N=block_n, EARLY_METADATA=early, PDL=pdl, num_warps=4,
            **pdl_options(pdl),
        )
    return out


def paged_decode_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, batch: AttentionBatch,
                           scale: float, *, num_splits: int | None = None,
                           launch: AttentionLaunch | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """Decode attention, q ``[B, 1, H, D]`` -> ``[B, 1, H, D]`` (flash-decoding), written
    into ``out`` when given (a view with contiguous heads: a packed step's decode rows).

    One program per (row, kv head, split) holds all ``H / Hkv`` query heads of the
    group, padded to 16 rows for the tensor-core dot. ``num_splits`` overrides the
    static heuristic (:func:`choose_num_splits`); ``launch`` the launch shape (default
    DECODE_LAUNCH, read at call time).

    With ``launch.preload`` (the default), on a grid that fits the GPU at once (batch
    1 and 2 of the Llama-3-8B heads) and under programmatic dependent launch, the
    kernel reads ``batch``'s positions, kv_lens and page table and each split's first
    step of cached K/V *before* waiting on the kernel before it: at batch 1 those
    dependent loads (metadata, page id, K and V) were most of the attention's latency.
    So no kernel of the PDL chain before this one may write them, except the key at
    each row's own position (the step's new key, which the qkv projection writes):
    that row is read again after the wait. A decode step satisfies this: its
    metadata is written by slots.decode_inputs, and the forward's first launch
    (elementwise.embed_rms_norm) waits for it without programmatic dependence; its
    older keys were written by earlier steps. A verification step's flat rows are not:
    a row's earlier positions in the round are written by the same qkv launch, so a
    batch with ``keys_this_step`` above 1 is never preloaded.
    """
    require(q.dim() == 4 and q.shape[1] == 1, "paged_decode_attention", f"q must be [B, 1, H, D], got {tuple(q.shape)}")
    return _launch("paged_decode_attention", q, k_pool, v_pool, batch, scale, launch=launch or DECODE_LAUNCH,
                   num_splits=num_splits, out=out)


def paged_prefill_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, batch: AttentionBatch,
                            scale: float, *, num_splits: int | None = None,
                            launch: AttentionLaunch | None = None) -> torch.Tensor:
    """Chunked-prefill attention, q ``[B, Q, H, D]`` -> ``[B, Q, H, D]``.

    Causal by absolute position over the cached prefix and this chunk (whose K/V
    are already in the pool). Query rows are (token, group head) pairs in blocks of
    ``launch.block_m``; keys stream ``launch.pages_per_step`` pages per step.
    """
    return _launch("paged_prefill_attention", q, k_pool, v_pool, batch, scale, launch=launch or PREFILL_LAUNCH,
                   num_splits=num_splits)


def paged_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, batch: AttentionBatch,
                    scale: float) -> torch.Tensor:
    """Drop-in for ``paged_attention_reference``: decode kernel when Q == 1, else prefill.

    The dispatch reads only ``q.shape``, which is static per captured graph.
    """
    if q.dim() == 4 and q.shape[1] == 1:
        return paged_decode_attention(q, k_pool, v_pool, batch, scale)
    # A row whose chunk starts at position 0 has no cached prefix: its attention is the
    # chunk's own causal attention, which torch's flash kernel computes faster than the
    # paged kernel (TUNING.md: 91 against 146 us for a fresh 2048-token prompt) and exactly
    # as transformers does. The paged kernel serves the other rows; fresh rows get no keys
    # there (kv_len 0: nothing to read). Both run for every graph, so the choice stays a
    # per-row select on the device and the launch shapes stay static.
    fresh = batch.positions[:, 0] == 0
    own = fresh_sdpa_attention(q, k_pool, v_pool, batch, scale)
    prefix_only = replace(batch, kv_lens=torch.where(fresh, 0, batch.kv_lens))
    cached = paged_prefill_attention(q, k_pool, v_pool, prefix_only, scale)
    return torch.where(fresh.view(-1, 1, 1, 1), own, cached)


def _row_blocks(rows: PackedRows, group: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The query blocks of packed rows as (row, block in row) per program, on the device.

    A row of n tokens has ceil(n * group / block_m) blocks; together they number at most
    ceil(p * group / block_m) + R - 1, the static grid (spare programs get row R). Made once
    per step: the layers' launches share it (kept on ``rows``)."""
    key = (group, block_m)
    cached = getattr(rows, "_blocks", None)
    if cached is not None and cached[0] == key:
        return cached[1]
    p, r = rows.positions.shape[0], rows.q_len.shape[0]
    per_row = (rows.q_len * group + block_m - 1) // block_m
    ends = torch.cumsum(per_row, 0)
    index = torch.arange(-(-p * group // block_m) + r - 1, device=rows.q_len.device)
    block_row = torch.searchsorted(ends, index, right=True)
    block_idx = index - (ends - per_row)[block_row.clamp(max=r - 1)]
    rows._blocks = (key, (block_row, block_idx))
    return block_row, block_idx


def packed_rows_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, rows: PackedRows,
                          scale: float, *, launch: AttentionLaunch | None = None,
                          out: torch.Tensor | None = None) -> torch.Tensor:
    """Packed prefill rows, q ``[p, H, D]`` -> ``[p, H, D]`` (zeros where no row owns a token;
    with ``out``, written there, whose unowned tokens the caller has zeroed).

    Contract: :func:`flare.model.attention.packed_rows_reference`. One program per (query
    block, row, kv head) as for a chunk, the row's queries found at ``rows.q_start`` in the
    flat stream: only the blocks the rows hold are launched (:func:`_row_blocks`, a static grid
    of at most ceil(p * G / block_m) + R - 1 programs per kv head). No context splits (a
    packed step's rows fill the GPU by themselves).
    """
    kernel = "packed_rows_attention"
    launch = launch or PREFILL_LAUNCH
    require(q.dim() == 3, kernel, f"q must be [p, H, D], got shape {tuple(q.shape)}")
    p, h, d = q.shape
    r = rows.q_start.shape[0]
    require(tuple(rows.positions.shape) == (p,), kernel,
            f"positions must be [p] = {(p,)}, got {tuple(rows.positions.shape)}")
    for name, t in (("q_start", rows.q_start), ("q_len", rows.q_len)):
        require(tuple(t.shape) == (r,) and t.is_contiguous(), kernel, f"{name} must be a contiguous [R={r}]")
    flat = rows.positions.view(1, p)
    _check(kernel, q.view(1, p, h, d), k_pool, v_pool,
           AttentionBatch(positions=flat, write_index=flat, page_table=rows.page_table[:1], kv_lens=rows.kv_lens[:1]))
    require(rows.page_table.dim() == 2 and rows.page_table.shape[0] == r and rows.page_table.stride(1) == 1, kernel,
            f"page_table must be [R={r}, Pmax] with contiguous rows, got {tuple(rows.page_table.shape)}")
    require(tuple(rows.kv_lens.shape) == (r,) and rows.kv_lens.is_contiguous(), kernel,
            f"kv_lens must be a contiguous [R={r}]")
    num_pages, _, hkv, _ = k_pool.shape
    group = h // hkv
    block_m = launch.block_m or 64
    block_row, block_idx = _row_blocks(rows, group, block_m)
    if out is None:
        out = torch.zeros((p, h, d), dtype=q.dtype, device=q.device)
    require(tuple(out.shape) == (p, h, d) and out.dtype == q.dtype and out.stride(2) == 1, kernel,
            f"out must be a [p, H, D] = {(p, h, d)} {q.dtype} view with contiguous heads")
    pdl = pdl_level(q)
    _paged_attention_kernel[(block_row.shape[0], hkv, 1)](
        q, k_pool, v_pool, out, out, out, out,
        rows.positions, rows.page_table, rows.kv_lens, rows.q_start, rows.q_len, block_row, block_idx,
        float(scale) * LOG2_E, r, p, h, rows.page_table.shape[1], num_pages, 1,
        0, q.stride(0), q.stride(1),
        0, out.stride(0), out.stride(1),
        k_pool.stride(0), k_pool.stride(1), k_pool.stride(2),
        v_pool.stride(0), v_pool.stride(1), v_pool.stride(2),
        0, rows.positions.stride(0), rows.page_table.stride(0),
        NUM_KV_HEADS=hkv, GROUP=group, HEAD_DIM=d, BLOCK_D=max(16, next_power_of_2(d)), BLOCK_M=block_m,
        PAGE=PAGE_TOKENS, PAGES_PER_STEP=launch.pages_per_step, BLOCK_N=PAGE_TOKENS * launch.pages_per_step,
        NUM_SPLITS=1, PRECISION=dot_precision(q.dtype), MERGE_IN_KERNEL=False, DECODE_DIRECT=False, PRELOAD=False,
        PDL=pdl,
        VARLEN=True, UNMASKED_STEPS=launch.unmasked_steps, num_warps=launch.num_warps,
        num_stages=launch.num_stages, **pdl_options(pdl),
    )
    return out


def packed_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, batch: PackedBatch,
                     scale: float) -> torch.Tensor:
    """Drop-in for ``packed_attention_reference``: the packed rows with
    :func:`packed_rows_attention`, the decode cohort with the decode kernel (its own context
    splits; no preload, since this step's metadata comes from torch ops in the chain). Both
    write into one output: the packed rows' tokens zeroed first (tokens no row owns stay 0),
    the decode rows after them written whole by their kernel (no concatenation copy)."""
    p = batch.prefill.positions.shape[0]
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    out[0, :p].zero_()
    packed_rows_attention(q[0, :p], k_pool, v_pool, batch.prefill, scale, out=out[0, :p])
    if batch.decode is not None:
        paged_decode_attention(q[0, p:].unsqueeze(1), k_pool, v_pool, batch.decode, scale,
                               launch=replace(DECODE_LAUNCH, preload=False), out=out[0, p:].unsqueeze(1))
    return out


__all__ = ["AttentionLaunch", "DECODE_LAUNCH", "PREFILL_LAUNCH", "MAX_SPLITS", "PAGE_TOKENS", "choose_num_splits",
           "packed_attention", "packed_rows_attention", "paged_attention", "paged_decode_attention",
           "paged_prefill_attention"]
