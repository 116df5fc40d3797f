"""Paged KV cache and the reference attention over it.

The cache holds ``num_pages`` pages of ``PAGE_TOKENS`` positions per layer:
``k[layer]`` and ``v[layer]`` are ``[num_pages, P, Hkv, D]``. Physical page 0 is
a scratch page: padding tokens write there and padding page-table entries point
there, so every index a step uses is valid and no branch is needed. Logical
page IDs from the prefix cache map to physical pages ``id + 1``.

A step is rectangular: ``B`` rows of ``Q`` query tokens (a prefill chunk is
``B=1, Q=t``; a decode step is ``B=b, Q=1``), or packed (a MIXED step,
:class:`PackedBatch`): one flat stream of prefill tokens in variable-length rows,
then a decode cohort's tokens. Each row attends over the pages
listed in its page-table row, up to ``kv_lens[b]`` positions, causally by
absolute position. This reference gathers the row's pages and runs a masked
softmax; the CUDA path replaces it with Triton kernels of the same contract.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..config import PAGE_TOKENS

SCRATCH_PAGE = 0


@dataclass
class KVCache:
    """Per-layer page pools. ``k[i]``/``v[i]``: [num_pages, P, Hkv, D]."""

    k: list[torch.Tensor]
    v: list[torch.Tensor]

    @classmethod
    def allocate(cls, num_layers: int, num_pages: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device) -> "KVCache":
        shape = (num_pages, PAGE_TOKENS, num_kv_heads, head_dim)
        return cls(
            k=[torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)],
            v=[torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)],
        )

    @property
    def num_pages(self) -> int:
        return self.k[0].shape[0]

    @staticmethod
    def bytes_per_page(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        elem = torch.empty((), dtype=dtype).element_size()
        return 2 * num_layers * PAGE_TOKENS * num_kv_heads * head_dim * elem


@dataclass
class AttentionBatch:
    """Per-step attention metadata (all int64, static shapes).

    positions:   [B, Q] absolute position of each query token
    write_index: [B, Q] flat cache slot (page * P + offset) each token's K/V goes to
    page_table:  [B, Pmax] physical pages of each row (SCRATCH_PAGE past the end)
    kv_lens:     [B] valid cached positions per row after this step's writes
    keys_this_step: how many of a row's last keys this step writes before its attention
                 reads them (static): 1 for a decode row, its own; up to the width for a
                 verification step's flat rows, whose earlier positions in the same round
                 are other rows of the step
    """

    positions: torch.Tensor
    write_index: torch.Tensor
    page_table: torch.Tensor
    kv_lens: torch.Tensor
    keys_this_step: int = 1


@dataclass
class PackedRows:
    """Variable-length prefill rows of a packed step (all int64, static shapes).

    Row ``r`` owns the flat query tokens ``[q_start[r], q_start[r] + q_len[r])``; padding
    rows have ``q_len`` 0 and padding tokens (past the last row) belong to no row.

    positions:  [p] absolute position of each flat prefill token
    q_start:    [R] first flat token of each row
    q_len:      [R] tokens of each row
    page_table: [R, Pmax] physical pages of each row
    kv_lens:    [R] valid cached positions per row after this step's writes
    """

    positions: torch.Tensor
    q_start: torch.Tensor
    q_len: torch.Tensor
    page_table: torch.Tensor
    kv_lens: torch.Tensor


@dataclass
class PackedBatch:
    """A MIXED step's metadata: the flat stream ``[1, N]`` is ``p`` packed prefill tokens
    (``prefill``) followed by ``w`` decode tokens (``decode``: a ``[w, 1]`` decode batch,
    None when w is 0). ``positions`` and ``write_index`` cover the whole stream, so every
    per-token operation of the forward runs on it unchanged; only attention reads the rows."""

    positions: torch.Tensor  # [1, N]
    write_index: torch.Tensor  # [1, N]
    prefill: PackedRows
    decode: AttentionBatch | None


def write_kv(k_pool: torch.Tensor, v_pool: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             write_index: torch.Tensor) -> None:
    """Scatter this step's keys/values [B, Q, Hkv, D] into the page pool."""
    flat = write_index.reshape(-1)
    k_pool.view(-1, *k_pool.shape[2:]).index_copy_(0, flat, k.reshape(-1, *k.shape[2:]))
    v_pool.view(-1, *v_pool.shape[2:]).index_copy_(0, flat, v.reshape(-1, *v.shape[2:]))


def paged_attention_reference(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                              batch: AttentionBatch, scale: float) -> torch.Tensor:
    """Masked attention over gathered pages. q: [B, Q, H, D] -> [B, Q, H, D]."""
    b, nq, h, d = q.shape
    hkv = k_pool.shape[2]
    group = h // hkv
    ctx = batch.page_table.shape[1] * PAGE_TOKENS
    # [B, Pmax, P, Hkv, D] -> [B, Hkv, C, D]
    keys = k_pool[batch.page_table].reshape(b, ctx, hkv, d).transpose(1, 2)
    values = v_pool[batch.page_table].reshape(b, ctx, hkv, d).transpose(1, 2)
    # Group query heads by their kv head: [B, Hkv, group*Q, D]
    qg = q.reshape(b, nq, hkv, group, d).permute(0, 2, 3, 1, 4).reshape(b, hkv, group * nq, d)
    scores = torch.matmul(qg.float(), keys.float().transpose(-1, -2)) * scale  # [B, Hkv, G*Q, C]
    key_pos = torch.arange(ctx, device=q.device)
    visible = (key_pos.view(1, 1, ctx) <= batch.positions.unsqueeze(-1)) & (
        key_pos.view(1, 1, ctx) < batch.kv_lens.view(b, 1, 1))  # [B, Q, C]
    visible = visible.unsqueeze(1).expand(b, group, nq, ctx).reshape(b, 1, group * nq, ctx)
    scores = scores.masked_fill(~visible, torch.finfo(torch.float32).min)
    probs = torch.softmax(scores, dim=-1)
    out = torch.matmul(probs, values.float())  # [B, Hkv, G*Q, D]
    out = out.reshape(b, hkv, group, nq, d).permute(0, 3, 1, 2, 4).reshape(b, nq, h, d)
    return out.to(q.dtype)


def fresh_sdpa_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                         batch: AttentionBatch, scale: float) -> torch.Tensor:
    """Attention as transformers' sdpa path computes it, for rows that start at position 0.

    Causal ``scaled_dot_product_attention`` over each row's first Q cached positions,
    with no prefix and no padding: the same call, layout and dtype as transformers
    makes for one unpadded sequence. The CUDA prefill dispatch
    (:func:`flare.model.kernels.paged_attention`) uses it for rows without a cached
    prefix; parity checks swap it in to separate attention's rounding from the rest.
    """
    b, nq, h, d = q.shape
    hkv = k_pool.shape[2]
    pages = batch.page_table[:, :-(-nq // PAGE_TOKENS)]  # the pages holding positions 0..Q-1
    keys = k_pool[pages].reshape(b, -1, hkv, d)[:, :nq].transpose(1, 2)
    values = v_pool[pages].reshape(b, -1, hkv, d)[:, :nq].transpose(1, 2)
    out = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, is_causal=True, scale=scale,
                                         enable_gqa=True)
    return out.transpose(1, 2)


def packed_rows_reference(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, rows: PackedRows,
                          scale: float) -> torch.Tensor:
    """Attention of packed prefill rows, q ``[p, H, D]`` -> ``[p, H, D]`` (zeros for padding
    tokens): each row as its own one-row chunk of :func:`paged_attention_reference`. It
    reads the row bounds on the host, so it is the eager reference only (the CUDA path
    captures :func:`flare.model.kernels.packed_attention`)."""
    out = torch.zeros_like(q)
    for r, (start, n) in enumerate(zip(rows.q_start.tolist(), rows.q_len.tolist())):
        if n <= 0:
            continue
        row = AttentionBatch(positions=rows.positions[start:start + n].view(1, n), write_index=rows.positions,
                             page_table=rows.page_table[r:r + 1], kv_lens=rows.kv_lens[r:r + 1])
        out[start:start + n] = paged_attention_reference(q[start:start + n].unsqueeze(0), k_pool, v_pool, row,
                                                         scale)[0]
    return out


def packed_attention_reference(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                               batch: PackedBatch, scale: float) -> torch.Tensor:
    """Attention of a packed step, q ``[1, N, H, D]`` -> ``[1, N, H, D]``: the prefill rows,
    then the decode cohort as a ``[w, 1]`` decode batch."""
    p = batch.prefill.positions.shape[0]
    parts = [packed_rows_reference(q[0, :p], k_pool, v_pool, batch.prefill, scale)]
    if batch.decode is not None:
        parts.append(paged_attention_reference(q[0, p:].unsqueeze(1), k_pool, v_pool, batch.decode, scale)[:, 0])
    return torch.cat(parts).unsqueeze(0)
