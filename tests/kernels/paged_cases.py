"""Paged-attention test cases shared by the interpreter tests and tests/gpu.

Pure torch (no triton): builds page pools, page tables and step metadata the way
flare/model/programs.py lays them out, and compares a kernel's output with
``paged_attention_reference`` with a message that names the case.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flare.config import PAGE_TOKENS
from flare.model.attention import AttentionBatch, paged_attention_reference


@dataclass
class PagedCase:
    """One attention step: inputs, and which rows are real (padding rows are not)."""

    q: torch.Tensor  # [B, Q, H, D]
    k_pool: torch.Tensor  # [num_pages, 64, Hkv, D]
    v_pool: torch.Tensor
    batch: AttentionBatch
    scale: float
    real_rows: torch.Tensor  # [B] bool
    label: str

    def reference(self) -> torch.Tensor:
        return paged_attention_reference(self.q, self.k_pool, self.v_pool, self.batch, self.scale)


def build_case(*, kv_lens: list[int], q_len: int, num_heads: int, num_kv_heads: int, head_dim: int,
               max_pages: int, dtype: torch.dtype, device: torch.device | str = "cpu", seed: int = 0,
               num_new: list[int] | None = None, shared_pages: int = 0, padding_rows: tuple[int, ...] = (),
               spare_pages: int = 3) -> PagedCase:
    """A step over a random page pool.

    Row ``b`` holds ``kv_lens[b]`` cached positions (this step's ``num_new[b]`` tokens
    included) in pages drawn at random from the pool; rows after the first share its
    first ``shared_pages`` pages (a reused prefix). Page-table entries past a row's
    length point at the scratch page 0, which holds random data like every other
    page so reading it unmasked would show. Query ``i`` of row ``b`` sits at position
    ``kv_lens[b] - num_new[b] + i``; queries past ``num_new[b]`` are padding tokens
    (positions at or past the row's length, clamped to the context). Padding rows
    have kv_len 0, garbage positions and an all-scratch page table.
    """
    gen = torch.Generator().manual_seed(seed)
    b = len(kv_lens)
    num_new = list(num_new) if num_new is not None else [min(q_len, n) for n in kv_lens]
    context = max_pages * PAGE_TOKENS
    need = [-(-n // PAGE_TOKENS) for n in kv_lens]
    assert all(n <= max_pages for n in need), "kv_lens exceed the page table"
    num_pages = 1 + sum(need) + spare_pages
    order = (torch.randperm(num_pages - 1, generator=gen) + 1).tolist()
    table = torch.zeros(b, max_pages, dtype=torch.int64)
    for row in range(b):
        for p in range(need[row]):
            if row > 0 and p < shared_pages and p < need[0]:
                table[row, p] = table[0, p]
            else:
                table[row, p] = order.pop()
    positions = torch.empty(b, q_len, dtype=torch.int64)
    for row in range(b):
        start = kv_lens[row] - num_new[row]
        positions[row] = (start + torch.arange(q_len)).clamp(max=context - 1)
    lens = torch.tensor(kv_lens, dtype=torch.int64)
    real = torch.ones(b, dtype=torch.bool)
    for row in padding_rows:
        lens[row] = 0
        table[row] = 0
        positions[row] = torch.randint(-1000, 1 << 20, (q_len,), generator=gen)
        real[row] = False
    dev = torch.device(device)
    # Pools are drawn on the target device (gigabytes at real sizes).
    data_gen = torch.Generator(device=dev).manual_seed(seed)
    shape = (num_pages, PAGE_TOKENS, num_kv_heads, head_dim)
    k_pool = torch.randn(shape, generator=data_gen, device=dev).to(dtype)
    v_pool = torch.randn(shape, generator=data_gen, device=dev).to(dtype)
    q = torch.randn(b, q_len, num_heads, head_dim, generator=data_gen, device=dev).to(dtype)
    write_index = torch.zeros(b, q_len, dtype=torch.int64)  # unused by attention
    batch = AttentionBatch(*(t.to(dev) for t in (positions, write_index, table, lens)))
    label = (f"B={b} Q={q_len} H={num_heads} Hkv={num_kv_heads} D={head_dim} Pmax={max_pages} {dtype} "
             f"kv_lens={kv_lens} num_new={num_new} shared_pages={shared_pages} padding_rows={padding_rows}")
    return PagedCase(q=q, k_pool=k_pool, v_pool=v_pool, batch=batch,
                     scale=head_dim ** -0.5, real_rows=real.to(dev), label=label)


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """(max abs error, relative L2 error) allowed against the fp32 reference.

    bf16/fp16 kernels round the probabilities to the value dtype before P @ V (as
    FlashAttention does) and the output to the activation dtype.
    """
    if dtype == torch.float32:
        return 5e-5, 1e-5
    if dtype == torch.float16:
        return 4e-3, 2e-3
    return 2e-2, 8e-3


def check_attention(kernel: str, out: torch.Tensor, case: PagedCase, ref: torch.Tensor | None = None) -> None:
    """Assert ``out`` matches the reference on the real tokens of real rows and is finite everywhere."""
    ref = case.reference() if ref is None else ref
    assert out.shape == ref.shape and out.dtype == ref.dtype, \
        f"{kernel} [{case.label}]: got {tuple(out.shape)} {out.dtype}, want {tuple(ref.shape)} {ref.dtype}"
    assert torch.isfinite(out.float()).all(), f"{kernel} [{case.label}]: non-finite output"
    # Compared: every query of a real row that is a real token (position < kv_len). A
    # padding token's output is never read (its K/V go to the scratch page and nothing
    # samples from it), so it need only be finite: the prefill dispatch computes a fresh
    # row's padding queries over stale keys of the row's own pages.
    real = case.real_rows.view(-1, 1) & (case.batch.positions < case.batch.kv_lens.view(-1, 1))
    if not bool(real.any()):
        return
    got, want = out[real].float(), ref[real].float()
    err = (got - want).abs()
    max_abs, max_rel = tolerance(out.dtype)
    rel = float(err.norm() / want.norm().clamp_min(1e-30))
    worst = tuple(int(i) for i in torch.nonzero(err == err.max())[0].tolist())
    assert float(err.max()) <= max_abs and rel <= max_rel, (
        f"{kernel} [{case.label}]: max abs error {float(err.max()):.3e} (allowed {max_abs:.1e}) at real-token index "
        f"{worst}, relative L2 error {rel:.3e} (allowed {max_rel:.1e})")
