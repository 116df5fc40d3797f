"""Split K with the last program reducing (GemvConfig.last_reduces), under the interpreter.

Each epilogue (plain, float32 logits, residual + norm producer, norm consumer, SiLU-mul,
RoPE with the K/V scatter) must give what the same tiles give with K whole, to fp32
summation order, and leave the ticket counters at zero for the next launch.
"""

from __future__ import annotations

import pytest
import torch

from flare.model import decoder, layers
from flare.model.kernels import (
    GemvConfig,
    KernelInputError,
    gemv,
    linear_add_rms_norm_small_m,
    linear_qkv_rope_small_m,
    linear_silu_small_m,
    linear_small_m,
)

EPS = 1e-5


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want.double()).norm() / want.double().norm())


def _split(cfg: GemvConfig, splits: int) -> GemvConfig:
    return GemvConfig(**{**cfg.__dict__, "split_k": splits, "last_reduces": True})


def _tickets_clear() -> bool:
    return all(int(t.abs().sum()) == 0 for t in gemv.ticket_counters())


WHOLE = [GemvConfig(block_n=16, block_k=64, mode="swap"), GemvConfig(block_n=32, block_k=32, mode="dot"),
         GemvConfig(block_n=8, block_k=64, num_warps=2, mode="fma")]


@pytest.mark.parametrize("splits", [2, 3, 4])
@pytest.mark.parametrize("cfg", WHOLE, ids=["swap", "dot", "fma"])
def test_plain_and_float_products_match_the_unsplit_tiles(cfg, splits):
    m = 5
    gen = torch.Generator().manual_seed(splits)
    x = torch.randn(m, 320, generator=gen).bfloat16()  # 320: K tiles that do not divide evenly into the splits
    w = (torch.randn(100, 320, generator=gen) / 8).bfloat16()
    bias = torch.randn(100, generator=gen).bfloat16()
    want = linear_small_m(x, w, bias, config=cfg)
    got = linear_small_m(x, w, bias, config=_split(cfg, splits))
    assert got.shape == want.shape and _rel_err(got, want) <= 4e-3
    assert torch.equal(got, linear_small_m(x, w, bias, config=_split(cfg, splits))), "deterministic"
    logits = linear_small_m(x, w, config=_split(cfg, splits), out_dtype=torch.float32)
    assert logits.dtype == torch.float32 and _rel_err(logits, linear_small_m(x, w, config=cfg).float()) <= 4e-3
    assert _tickets_clear()


@pytest.mark.parametrize("cfg", WHOLE[:2], ids=["swap", "dot"])
def test_fused_epilogues_take_a_split_k(cfg):
    gen = torch.Generator().manual_seed(41)
    m, hidden = 6, 128
    x = torch.randn(m, 1, 256, generator=gen).bfloat16()
    w = (torch.randn(hidden, 256, generator=gen) / 8).bfloat16()
    residual = torch.randn(m, 1, hidden, generator=gen).bfloat16()
    g = (1 + torch.randn(hidden, generator=gen) / 4).bfloat16()
    split = _split(cfg, 4)

    # The residual + norm producer: h, h * g and the partial squares.
    whole = linear_add_rms_norm_small_m(x, w, residual, g, EPS, config=cfg)
    normed = linear_add_rms_norm_small_m(x, w, residual, g, EPS, config=split)
    assert _rel_err(normed.x, whole.x) <= 4e-3
    torch.testing.assert_close(normed.squares.sum(-1), normed.x.float().pow(2).sum(-1).view(m), rtol=1e-5, atol=0)
    torch.testing.assert_close(normed.materialize(), layers.rms_norm(normed.x, g, EPS))

    # The norm's consumers: SiLU-mul, the plain product and RoPE with the K/V scatter.
    gate_up = (torch.randn(80, hidden, generator=gen) / 8).bfloat16()
    silu = linear_silu_small_m(normed, gate_up, config=split)
    assert _rel_err(silu, linear_silu_small_m(normed, gate_up, config=cfg)) <= 1e-2
    head = (torch.randn(50, hidden, generator=gen) / 8).bfloat16()
    assert _rel_err(linear_small_m(normed, head, config=split), linear_small_m(normed, head, config=cfg)) <= 4e-3

    heads, kv_heads, d = 4, 2, 16
    wq = (torch.randn((heads + 2 * kv_heads) * d, hidden, generator=gen) / 8).bfloat16()
    angles = torch.randn(40, d, generator=gen)
    cos, sin = angles.cos(), angles.sin()
    pos = torch.arange(m).view(m, 1) * 3
    widx = 64 + 2 * torch.arange(m).view(m, 1)
    untouched = 8192.0
    rope_cfg = GemvConfig(**{**split.__dict__, "block_n": 16})  # rotation pairs tile each head
    pools = [torch.full((3, 64, kv_heads, d), untouched).bfloat16() for _ in range(2)]
    want_pools = [p.clone() for p in pools]
    q = linear_qkv_rope_small_m(normed, wq, None, heads, cos, sin, pos, widx, *pools, config=rope_cfg)
    want_q = decoder.qkv_rope_write(linear_small_m(normed, wq, config=cfg), heads, None, None, EPS,
                                    cos, sin, pos, widx, *want_pools)
    assert _rel_err(q, want_q) <= 1e-2
    for got_pool, want_pool in zip(pools, want_pools):
        assert torch.equal(got_pool == untouched, want_pool == untouched), "k/v written at the write index only"
        assert _rel_err(got_pool.float(), want_pool.float()) <= 1e-2
    assert _tickets_clear()


def test_a_split_without_the_last_program_reducing_still_refuses_the_fused_epilogues():
    gen = torch.Generator().manual_seed(42)
    x = torch.randn(3, 128, generator=gen).bfloat16()
    w = torch.randn(64, 128, generator=gen).bfloat16()
    summed = GemvConfig(block_n=16, block_k=32, split_k=2, mode="swap")
    with pytest.raises(KernelInputError, match="no K split"):
        linear_silu_small_m(x, w, config=summed)
    with pytest.raises(KernelInputError, match="unsplit K"):
        linear_add_rms_norm_small_m(x, w, torch.zeros(3, 64).bfloat16(), torch.ones(64).bfloat16(), EPS, config=summed)
    assert torch.equal(linear_silu_small_m(x, w, config=_split(summed, 2)),
                       linear_silu_small_m(x, w, config=_split(summed, 2)))
