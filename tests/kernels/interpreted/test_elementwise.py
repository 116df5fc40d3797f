"""Fused elementwise kernels against flare.model.layers, under the interpreter.

The kernels keep the reference's rounding points, so in bf16 nearly every element
is bit-identical; the rest differ by one bf16 ulp (fp32 sums in another order).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from flare.model import decoder, layers
from flare.model.kernels import KernelInputError, add_rms_norm, embed_rms_norm, qkv_rope_write, rms_norm, silu_mul


def assert_matches(kernel: str, got: torch.Tensor, want: torch.Tensor) -> None:
    """Same shape and dtype, within one ulp everywhere; in bf16 bit-identical almost everywhere.

    fp32 results differ in the last bits (sums in another order), so only the
    tolerance applies there; a bf16 result rounded at a different point than the
    reference would miss the bit-identical fraction.
    """
    assert got.shape == want.shape and got.dtype == want.dtype, \
        f"{kernel}: got {tuple(got.shape)} {got.dtype}, want {tuple(want.shape)} {want.dtype}"
    low_precision = want.dtype != torch.float32
    ulp = torch.finfo(want.dtype).eps * (1 if low_precision else 8)
    torch.testing.assert_close(got.float(), want.float(), rtol=ulp, atol=ulp,
                               msg=lambda m: f"{kernel} {tuple(want.shape)} {want.dtype}: {m}")
    if low_precision:
        exact = float((got == want).float().mean())
        assert exact >= 0.97, f"{kernel}: only {exact:.1%} of elements are bit-identical to the reference"


def _qkv_head_view(dtype, b=2, t=3, heads=4, kv_heads=2, d=32, seed=0):
    """q as the decoder slices it out of the fused projection: a strided [B, T, H, D] view."""
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(b, t, (heads + 2 * kv_heads) * d, generator=gen).to(dtype)
    return qkv[..., :heads * d].view(b, t, heads, d)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_rms_norm_rows_and_strided_heads(dtype):
    gen = torch.Generator().manual_seed(1)
    x = (3 * torch.randn(5, 200, generator=gen)).to(dtype)  # width not a power of two
    w = torch.randn(200, generator=gen).to(dtype)
    assert_matches("rms_norm", rms_norm(x, w, 1e-6), layers.rms_norm(x, w, 1e-6))
    q = _qkv_head_view(dtype)  # q/k norm of Qwen3: per head, over D
    wq = torch.randn(32, generator=gen).to(dtype)
    assert not q.is_contiguous()
    assert_matches("rms_norm", rms_norm(q, wq, 1e-6), layers.rms_norm(q, wq, 1e-6))


def test_rms_norm_promotes_like_the_reference():
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(3, 64, generator=gen).bfloat16()
    w = torch.randn(64, generator=gen)  # fp32 weight: the reference's output is fp32
    assert_matches("rms_norm", rms_norm(x, w, 1e-5), layers.rms_norm(x, w, 1e-5))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_add_rms_norm_returns_normed_and_new_residual(dtype):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, 96, generator=gen).to(dtype)
    residual = (4 * torch.randn(2, 3, 96, generator=gen)).to(dtype)
    w = torch.randn(96, generator=gen).to(dtype)
    normed, new_residual = add_rms_norm(x, residual, w, 1e-6)
    want_residual = residual + x
    assert torch.equal(new_residual, want_residual), "add_rms_norm: the new residual must be the exact sum"
    assert_matches("add_rms_norm", normed, layers.rms_norm(want_residual, w, 1e-6))


def test_prefill_norms_take_torch_variance():
    """A prefill chunk [B, Q > 1, N] takes torch's variance (bit-exact on the GPU:
    tests/gpu); here the values and the new residual are checked."""
    gen = torch.Generator().manual_seed(8)
    x = torch.randn(3, 7, 256, generator=gen).bfloat16()  # 3 rows of 7 tokens
    residual = (2 * torch.randn(3, 7, 256, generator=gen)).bfloat16()
    w = torch.randn(256, generator=gen).bfloat16()
    assert_matches("rms_norm", rms_norm(x, w, 1e-5), layers.rms_norm(x, w, 1e-5))
    normed, new_residual = add_rms_norm(x, residual, w, 1e-5)
    assert torch.equal(new_residual, residual + x)
    assert_matches("add_rms_norm", normed, layers.rms_norm(residual + x, w, 1e-5))


def cuda_order_mean_of_squares(x: torch.Tensor, lanes: int) -> np.ndarray:
    """``x.float().pow(2).mean(-1)`` for rows [rows, N] summed as torch's CUDA reduce kernel
    sums a contiguous fp32 row (elementwise.torch_reduce_lanes): lane l accumulates vectors
    l, l + lanes, ... of 4 elements, one fp32 accumulator per vector element, combined
    ((a0 + a1) + a2) + a3; then lane l plus lane l + n / 2 until one is left."""
    sq = x.float().numpy().astype(np.float32) ** 2
    rows, width = sq.shape
    vectors = sq.reshape(rows, width // 4, 4)
    acc = np.zeros((rows, lanes, 4), np.float32)
    for start in range(0, width // 4, lanes):
        take = min(lanes, width // 4 - start)
        acc[:, :take] += vectors[:, start:start + take]
    lane = ((acc[..., 0] + acc[..., 1]) + acc[..., 2]) + acc[..., 3]
    while lane.shape[1] > 1:
        half = lane.shape[1] // 2
        lane = lane[:, :half] + lane[:, half:]
    factor = np.float32(rows) / np.float32(rows * width)
    return lane[:, 0] * factor


@pytest.mark.parametrize("rows,width", [(1, 1024), (3, 576), (9, 768), (21, 256), (40, 1280)],
                         ids=["one-row-256-lanes", "3-rows", "9-rows", "21-rows", "40-rows-ragged-last-step"])
def test_prefill_variance_sums_in_torch_cuda_order(rows, width):
    """The prefill norms' variance is summed in torch's CUDA order (bit-exact against torch
    on the GPU: tests/gpu); under the interpreter, against that order written out in numpy."""
    from flare.model.kernels.elementwise import ordered_variance, torch_reduce_lanes

    gen = torch.Generator().manual_seed(rows)
    # Magnitudes spread over decades, so an order change moves the fp32 sums.
    x = (torch.randn(rows, width, generator=gen) * torch.exp(3 * torch.randn(rows, width, generator=gen))).bfloat16()
    lanes = torch_reduce_lanes(rows, width)
    assert lanes
    got = ordered_variance(x).numpy()
    want = cuda_order_mean_of_squares(x, lanes)
    assert np.array_equal(got, want), f"{int((got != want).sum())} of {rows} rows differ"
    # and the order is not tl.sum's or numpy's: the check would catch a change of order
    plain = (x.float() ** 2).mean(-1).numpy()
    assert rows < 9 or not np.array_equal(plain, want)


def test_torch_reduce_lanes_follows_the_launch_shape():
    from flare.model.kernels.elementwise import torch_reduce_lanes

    assert torch_reduce_lanes(2048, 4096) == 32  # 16 rows a block, a warp a row
    assert torch_reduce_lanes(1, 4096) == 512  # one row: the whole block on it
    assert torch_reduce_lanes(4, 4096) == 128
    assert torch_reduce_lanes(8, 128) == 0  # 128 and narrower: not vectorized
    assert torch_reduce_lanes(64, 8192) == 0  # 256 values a thread: split across warps
    assert torch_reduce_lanes(64, 4098) == 0  # not whole vectors


@pytest.mark.parametrize("shape", [(3, 2, 600), (4, 2 * 1100)], ids=["3d", "2d-two-blocks"])
def test_silu_mul(shape):
    gen = torch.Generator().manual_seed(6)
    gate_up = (2 * torch.randn(*shape, generator=gen)).bfloat16()
    assert_matches("silu_mul", silu_mul(gate_up), layers.silu_mul(gate_up))


def _qkv_case(dtype, *, norm, b=3, nq=2, heads=4, kv_heads=2, d=48, pages=5, page_tokens=4, seed=7):
    gen = torch.Generator().manual_seed(seed)
    qkv = (2 * torch.randn(b, nq, (heads + 2 * kv_heads) * d, generator=gen)).to(dtype)
    norms = (torch.randn(d, generator=gen).to(dtype), torch.randn(d, generator=gen).to(dtype)) if norm else (None, None)
    angles = torch.outer(torch.arange(64.0), torch.rand(d // 2, generator=gen))
    table = torch.cat([angles, angles], dim=-1)
    positions = torch.randint(0, 64, (b, nq), generator=gen)
    # Distinct cache slots except the last row, a padding row written to the scratch page.
    slots = torch.randperm((pages - 1) * page_tokens, generator=gen)[:b * nq] + page_tokens
    write_index = slots.view(b, nq).clone()
    write_index[-1] = torch.arange(nq)
    pool = (torch.randn(pages, page_tokens, kv_heads, d, generator=gen)).to(dtype)
    return qkv, heads, norms, table.cos(), table.sin(), positions, write_index, pool


@pytest.mark.parametrize("per_program", [None, 4], ids=["launch-default", "4-tokens-a-program"])
@pytest.mark.parametrize("norm", [False, True], ids=["llama", "qk-norm"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_qkv_rope_write_matches_the_decoder_composite(dtype, norm, per_program, monkeypatch):
    if per_program:  # large steps give each program several tokens (6 tokens: a full and a partial program)
        from flare.model.kernels import elementwise

        monkeypatch.setattr(elementwise, "QKV_MANY_TOKENS", 1)
        monkeypatch.setattr(elementwise, "QKV_TOKENS_PER_PROGRAM", per_program)
    qkv, heads, (qn, kn), cos, sin, positions, write_index, pool = _qkv_case(dtype, norm=norm)
    want_k, want_v = pool.clone(), (pool + 1).clone()
    got_k, got_v = want_k.clone(), want_v.clone()
    want_q = decoder.qkv_rope_write(qkv, heads, qn, kn, 1e-6, cos, sin, positions, write_index, want_k, want_v)
    got_q = qkv_rope_write(qkv, heads, qn, kn, 1e-6, cos, sin, positions, write_index, got_k, got_v)
    assert_matches("qkv_rope_write q", got_q, want_q)
    assert_matches("qkv_rope_write k pool", got_k, want_k)
    assert torch.equal(got_v, want_v), "qkv_rope_write: v must be copied exactly"
    untouched = torch.ones(pool.shape[0] * pool.shape[1], dtype=torch.bool)
    untouched[write_index.reshape(-1)] = False
    assert torch.equal(got_k.flatten(0, 1)[untouched], pool.flatten(0, 1)[untouched]), \
        "qkv_rope_write: only the written slots may change"


def test_qkv_rope_write_rejects_mismatched_shapes():
    qkv, heads, _, cos, sin, positions, write_index, pool = _qkv_case(torch.float32, norm=False)
    with pytest.raises(KernelInputError, match="qkv_rope_write: qkv width"):
        qkv_rope_write(qkv, heads + 1, None, None, 1e-6, cos, sin, positions, write_index, pool, pool.clone())
    with pytest.raises(KernelInputError, match="positions must be int64"):
        qkv_rope_write(qkv, heads, None, None, 1e-6, cos, sin, positions[:, :1], write_index, pool, pool.clone())
    with pytest.raises(KernelInputError, match="q_norm and k_norm come together"):
        qkv_rope_write(qkv, heads, torch.ones(48), None, 1e-6, cos, sin, positions, write_index, pool, pool.clone())
    with pytest.raises(KernelInputError, match="k_pool must be contiguous"):
        qkv_rope_write(qkv, heads, None, None, 1e-6, cos, sin, positions, write_index, pool.bfloat16(), pool)


def test_bad_inputs_raise_typed_errors():
    x = torch.randn(2, 8)
    with pytest.raises(KernelInputError, match=r"rms_norm: weight must be \[8\]"):
        rms_norm(x, torch.ones(9), 1e-6)
    with pytest.raises(KernelInputError, match="add_rms_norm: residual must match"):
        add_rms_norm(x, torch.randn(2, 9), torch.ones(8), 1e-6)
    with pytest.raises(KernelInputError, match="silu_mul: gate_up must be"):
        silu_mul(torch.randn(2, 7))
    with pytest.raises(KernelInputError, match="contiguous last dimension"):
        rms_norm(torch.randn(8, 2).t(), torch.ones(8), 1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_embed_rms_norm_gathers_and_normalises_in_one_launch(dtype):
    """A decode step's tokens: the norm kernel gathers the embedding rows itself and gives
    the embedding and rms_norm's output bit for bit (ids past the table are clamped);
    a prefill chunk goes through torch's gather and the chunk norm."""
    gen = torch.Generator().manual_seed(21)
    table = torch.randn(50, 96, generator=gen).to(dtype)
    w = (1 + torch.randn(96, generator=gen) / 4).to(dtype)
    tokens = torch.tensor([[3], [49], [0], [7]])
    normed, x = embed_rms_norm(tokens, table, w, 1e-6)
    want_x = torch.nn.functional.embedding(tokens, table)
    assert x.shape == (4, 1, 96) and torch.equal(x, want_x)
    assert torch.equal(normed, rms_norm(want_x, w, 1e-6))
    far, _ = embed_rms_norm(torch.tensor([[60], [-2]]), table, w, 1e-6)
    assert torch.equal(far, rms_norm(table[[49, 0]].view(2, 1, 96), w, 1e-6))
    chunk = torch.randint(0, 50, (2, 5), generator=gen)
    normed, x = embed_rms_norm(chunk, table, w, 1e-6)
    want_x = torch.nn.functional.embedding(chunk, table)
    assert torch.equal(x, want_x) and torch.equal(normed, rms_norm(want_x, w, 1e-6))
    ref_normed, ref_x = decoder.embed_rms_norm(tokens, table, w, 1e-6)
    torch.testing.assert_close(embed_rms_norm(tokens, table, w, 1e-6)[0], ref_normed,
                               **({"rtol": 1e-2, "atol": 1e-2} if dtype == torch.bfloat16 else {}))
    with pytest.raises(KernelInputError, match="tokens must be"):
        embed_rms_norm(tokens.view(-1), table, w, 1e-6)
    with pytest.raises(KernelInputError, match="weight must be"):
        embed_rms_norm(tokens, table, w[:95], 1e-6)
