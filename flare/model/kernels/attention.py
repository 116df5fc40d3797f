"""Paged attention over the KV page pool: decode (Q == 1) and chunked prefill.

Contract: :func:`flare.model.attention.paged_attention_reference`. Query ``i`` of
row ``b`` at absolute position ``p`` attends to cached keys ``j`` with
``j <= p`` and ``j < kv_lens[b]``; keys live in pages ``page_table[b, j // 64]``
of ``k_pool``/``v_pool`` ``[num_pages, 64, Hkv, D]``.

One kernel serves both shapes. A program owns one (row, kv head) pair and a
block of ``BLOCK_M`` query rows, where a query row is a (query token, head of
the GQA group) pair: row ``r`` is token ``r // G`` and head ``kv_head * G + r % G``,
so each K/V page is read once per group rather than once per query head. It walks
the row's pages one at a time (BLOCK_N = one 64-token page) with an online
softmax in fp32 (FlashAttention-2's rescaled accumulator).

When (row, kv head, query block) programs alone cannot fill the GPU (decode at
small batch, a short prefill chunk over a long prefix) the context is split into
``num_splits`` parts (flash-decoding): the split count is chosen on the host
from static shapes only, while each split's page range is computed on the device
from the row's actual length, so short rows do not leave most splits idle and
the launch stays graph-capturable. Each split writes a normalised partial output
and its log-sum-exp; a second kernel merges them.

Padding rows (kv_lens 0, garbage positions) read no pages past the clamped
length and produce zeros; page ids are clamped into the pool, so no index can
leave it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...config import PAGE_TOKENS
from ..attention import AttentionBatch
from ._common import (
    dot_precision, next_power_of_2, require, require_float, require_inner_contiguous, require_same_device,
    sm_count,
)

MAX_SPLITS = 16
MERGE_ROWS = 16  # (b, token, head) rows per merge program
LOG2_E = 1.4426950408889634  # 1 / ln 2: scores are kept in log2 units for exp2
# Stand-in for -inf that keeps exp2 differences finite (no inf - inf = NaN).
NEG_BIG = -1.0e30


@triton.jit
def _paged_attention_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, part_o_ptr, part_lse_ptr,
    positions_ptr, page_table_ptr, kv_lens_ptr,
    qk_scale, batch_size, num_queries, num_heads, max_pages, num_pool_pages,
    s_qb, s_qq, s_qh,
    s_ob, s_oq, s_oh,
    s_kp, s_kt, s_kh,
    s_vp, s_vt, s_vh,
    s_pb, s_pq, s_tb,
    NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, PAGE: tl.constexpr, NUM_SPLITS: tl.constexpr, PRECISION: tl.constexpr,
):
    block = tl.program_id(0)
    pair = tl.program_id(1)
    split = tl.program_id(2)
    b = pair // NUM_KV_HEADS
    kv_head = pair % NUM_KV_HEADS

    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    token = rows // GROUP
    head = kv_head * GROUP + rows % GROUP
    row_ok = token < num_queries
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < HEAD_DIM

    q = tl.load(q_ptr + b * s_qb + token[:, None] * s_qq + head[:, None] * s_qh + dims[None, :],
                mask=row_ok[:, None] & dim_ok[None, :], other=0.0)  # [BLOCK_M, BLOCK_D]

    # Visible keys of each query row: j < min(position + 1, kv_len), clamped into the
    # page table so padding rows with garbage metadata stay in bounds.
    kv_len = tl.load(kv_lens_ptr + b)
    kv_len = tl.minimum(tl.maximum(kv_len, 0), max_pages * PAGE)
    position = tl.load(positions_ptr + b * s_pb + token * s_pq, mask=row_ok, other=-1)
    limit = tl.minimum(position + 1, kv_len)
    limit = tl.where(row_ok, tl.maximum(limit, 0), 0)  # [BLOCK_M]
    num_pages = tl.cdiv(tl.max(limit, axis=0), PAGE)
    pages_per_split = tl.cdiv(num_pages, NUM_SPLITS)
    first = split * pages_per_split
    last = tl.minimum(first + pages_per_split, num_pages)

    m_i = tl.full([BLOCK_M], NEG_BIG, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    offs_t = tl.arange(0, PAGE)
    k_base = k_ptr + kv_head * s_kh
    v_base = v_ptr + kv_head * s_vh
    table = page_table_ptr + b * s_tb
    for p in range(first, last):
        page = tl.load(table + p).to(tl.int64)
        page = tl.minimum(tl.maximum(page, 0), num_pool_pages - 1)
        k = tl.load(k_base + page * s_kp + offs_t[None, :] * s_kt + dims[:, None],
                    mask=dim_ok[:, None], other=0.0)  # [BLOCK_D, PAGE]
        s = tl.dot(q, k, input_precision=PRECISION) * qk_scale  # [BLOCK_M, PAGE], log2 units
        visible = (p * PAGE + offs_t)[None, :] < limit[:, None]
        s = tl.where(visible, s, NEG_BIG)
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        prob = tl.where(visible, tl.exp2(s - m_new[:, None]), 0.0)
        l_i = l_i * alpha + tl.sum(prob, axis=1)
        v = tl.load(v_base + page * s_vp + offs_t[:, None] * s_vt + dims[None, :],
                    mask=dim_ok[None, :], other=0.0)  # [PAGE, BLOCK_D]
        acc = acc * alpha[:, None] + tl.dot(prob.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new

    has_keys = l_i > 0.0
    out = acc / tl.where(has_keys, l_i, 1.0)[:, None]
    store_ok = row_ok[:, None] & dim_ok[None, :]
    if NUM_SPLITS == 1:
        tl.store(out_ptr + b * s_ob + token[:, None] * s_oq + head[:, None] * s_oh + dims[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=store_ok)
    else:
        # Partials are [S, B, Q, H, D] (and [S, B, Q, H] for the log-sum-exp), contiguous.
        part_row = ((split * batch_size + b) * num_queries + token) * num_heads + head
        tl.store(part_o_ptr + part_row[:, None] * HEAD_DIM + dims[None, :], out, mask=store_ok)
        lse = tl.where(has_keys, m_i + tl.log2(tl.where(has_keys, l_i, 1.0)), NEG_BIG)
        tl.store(part_lse_ptr + part_row, lse, mask=row_ok)


@triton.jit
def _merge_splits_kernel(
    part_o_ptr, part_lse_ptr, out_ptr,
    num_queries, num_heads, num_rows,
    s_ob, s_oq, s_oh,
    NUM_SPLITS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)  # flat (b, token, head) over [B, Q, H]
    row_ok = rows < num_rows
    head = rows % num_heads
    token = (rows // num_heads) % num_queries
    b = rows // (num_heads * num_queries)
    dims = tl.arange(0, BLOCK_D)
    mask = row_ok[:, None] & (dims < HEAD_DIM)[None, :]

    lse_max = tl.full([BLOCK_R], NEG_BIG, dtype=tl.float32)
    for split in tl.static_range(NUM_SPLITS):
        lse_max = tl.maximum(lse_max, tl.load(part_lse_ptr + split * num_rows + rows, mask=row_ok, other=NEG_BIG))
    # The split holding the maximum weighs 1, so the denominator is never 0 (all
    # splits empty: every weight is 1 and every partial is 0).
    weight_sum = tl.zeros([BLOCK_R], dtype=tl.float32)
    acc = tl.zeros([BLOCK_R, BLOCK_D], dtype=tl.float32)
    for split in tl.static_range(NUM_SPLITS):
        lse = tl.load(part_lse_ptr + split * num_rows + rows, mask=row_ok, other=NEG_BIG)
        weight = tl.exp2(lse - lse_max)
        part = tl.load(part_o_ptr + (split * num_rows + rows)[:, None] * HEAD_DIM + dims[None, :],
                       mask=mask, other=0.0)
        weight_sum += weight
        acc += part * weight[:, None]
    out = acc / weight_sum[:, None]
    tl.store(out_ptr + (b * s_ob + token * s_oq + head * s_oh)[:, None] + dims[None, :],
             out.to(out_ptr.dtype.element_ty), mask=mask)


def choose_num_splits(batch_size: int, num_kv_heads: int, num_query_blocks: int, max_pages: int,
                      device: torch.device) -> int:
    """Context splits for a launch, from static shapes only (graph-capturable).

    Split until (row, kv head, query block, split) programs make about two waves of
    the GPU's multiprocessors, at most MAX_SPLITS and never more than Pmax.
    """
    programs = batch_size * num_kv_heads * num_query_blocks
    target = 2 * sm_count(device)
    if programs >= target // 2:
        return 1
    return max(1, min(MAX_SPLITS, max_pages, -(-target // programs)))


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
            scale: float, *, block_m: int, num_warps: int, num_stages: int,
            num_splits: int | None) -> torch.Tensor:
    _check(kernel, q, k_pool, v_pool, batch)
    b, nq, h, d = q.shape
    num_pages, _, hkv, _ = k_pool.shape
    group = h // hkv
    max_pages = batch.page_table.shape[1]
    num_blocks = -(-nq * group // block_m)
    if num_splits is None:
        num_splits = choose_num_splits(b, hkv, num_blocks, max_pages, q.device)
    require(1 <= num_splits <= MAX_SPLITS, kernel, f"num_splits must be in [1, {MAX_SPLITS}], got {num_splits}")
    out = torch.empty((b, nq, h, d), dtype=q.dtype, device=q.device)
    if num_splits > 1:
        part_o = torch.empty((num_splits, b, nq, h, d), dtype=torch.float32, device=q.device)
        part_lse = torch.empty((num_splits, b, nq, h), dtype=torch.float32, device=q.device)
    else:
        part_o = part_lse = out  # unused by the kernel when NUM_SPLITS == 1
    block_d = max(16, next_power_of_2(d))
    pos, table = batch.positions, batch.page_table
    _paged_attention_kernel[(num_blocks, b * hkv, num_splits)](
        q, k_pool, v_pool, out, part_o, part_lse,
        pos, table, batch.kv_lens,
        float(scale) * LOG2_E, b, nq, h, max_pages, num_pages,
        q.stride(0), q.stride(1), q.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        k_pool.stride(0), k_pool.stride(1), k_pool.stride(2),
        v_pool.stride(0), v_pool.stride(1), v_pool.stride(2),
        pos.stride(0), pos.stride(1), table.stride(0),
        NUM_KV_HEADS=hkv, GROUP=group, HEAD_DIM=d, BLOCK_D=block_d, BLOCK_M=block_m, PAGE=PAGE_TOKENS,
        NUM_SPLITS=num_splits, PRECISION=dot_precision(q.dtype),
        num_warps=num_warps, num_stages=num_stages,
    )
    if num_splits > 1:
        rows = b * nq * h
        block_r = MERGE_ROWS
        _merge_splits_kernel[(triton.cdiv(rows, block_r),)](
            part_o, part_lse, out, nq, h, rows,
            out.stride(0), out.stride(1), out.stride(2),
            NUM_SPLITS=num_splits, HEAD_DIM=d, BLOCK_D=block_d, BLOCK_R=block_r, num_warps=4,
        )
    return out


def paged_decode_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, batch: AttentionBatch,
                           scale: float, *, num_splits: int | None = None) -> torch.Tensor:
    """Decode attention, q ``[B, 1, H, D]`` -> ``[B, 1, H, D]`` (flash-decoding).

    One program per (row, kv head, split) holds all ``H / Hkv`` query heads of the
    group, padded to 16 rows for the tensor-core dot. ``num_splits`` overrides the
    static heuristic (:func:`choose_num_splits`).
    """
    require(q.dim() == 4 and q.shape[1] == 1, "paged_decode_attention", f"q must be [B, 1, H, D], got {tuple(q.shape)}")
    group = q.shape[2] // max(1, k_pool.shape[2]) if k_pool.dim() == 4 else 1
    return _launch("paged_decode_attention", q, k_pool, v_pool, batch, scale,
                   block_m=max(16, next_power_of_2(group)), num_warps=4, num_stages=3, num_splits=num_splits)


def paged_prefill_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, batch: AttentionBatch,
                            scale: float, *, num_splits: int | None = None) -> torch.Tensor:
    """Chunked-prefill attention, q ``[B, Q, H, D]`` -> ``[B, Q, H, D]``.

    Causal by absolute position over the cached prefix and this chunk (whose K/V
    are already in the pool). Query rows are (token, group head) pairs in blocks of
    64; keys stream one page per step.
    """
    return _launch("paged_prefill_attention", q, k_pool, v_pool, batch, scale,
                   block_m=64, num_warps=4, num_stages=2, num_splits=num_splits)


def paged_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, batch: AttentionBatch,
                    scale: float) -> torch.Tensor:
    """Drop-in for ``paged_attention_reference``: decode kernel when Q == 1, else prefill.

    The dispatch reads only ``q.shape``, which is static per captured graph.
    """
    if q.dim() == 4 and q.shape[1] == 1:
        return paged_decode_attention(q, k_pool, v_pool, batch, scale)
    return paged_prefill_attention(q, k_pool, v_pool, batch, scale)


__all__ = ["paged_attention", "paged_decode_attention", "paged_prefill_attention", "choose_num_splits",
           "MAX_SPLITS", "PAGE_TOKENS"]
