"""The GEMV's fused RMSNorm input and residual epilogue, and the decoder wiring that uses them.

Under the interpreter on CPU tensors; the small-batch route is normally CUDA-only,
so the selector tests widen ``prefers_small_m`` to the CPU.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from flare.model import decoder, layers
from flare.model.attention import PAGE_TOKENS, AttentionBatch, KVCache
from flare.model.checkpoint import random_runtime_weights
from flare.model.decoder import Decoder, DecoderOps, cuda_ops
from flare.model.kernels import (
    GemvConfig, KernelInputError, NormedRows, gemv, linear, linear_float, linear_qkv_rope_small_m,
    linear_qkv_rope_write, linear_residual, linear_silu, linear_silu_small_m, linear_small_m, rms_norm_deferred,
)
from flare.model.spec import ModelSpec

FMA = GemvConfig(block_n=4, block_k=64, num_warps=2, num_stages=3, mode="fma")
SWAP = GemvConfig(block_n=16, block_k=64, mode="swap")
DOT = GemvConfig(block_n=32, block_k=128, mode="dot")
EPS = 1e-5


def _normed_f64(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    xd = x.double()
    return xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + EPS) * g.double()


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want).norm() / want.norm())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("config", [FMA, SWAP, DOT], ids=["fma", "swap", "dot"])
def test_fused_norm_is_the_norm_then_the_product(dtype, config):
    gen = torch.Generator().manual_seed(31)
    m = 1 if config.mode == "fma" else 5
    # K off the tile grid (a ragged last tile), rows of very different scales.
    x = (torch.randn(m, 200, generator=gen) * torch.logspace(-1, 2, m)[:, None]).to(dtype)
    g = (1 + torch.randn(200, generator=gen) / 4).to(dtype)
    w = torch.randn(72, 200, generator=gen).to(dtype)
    bias = torch.randn(72, generator=gen).to(dtype)
    got = linear_small_m(x, w, bias, config=config, norm=(g, EPS))
    want = F.linear(_normed_f64(x, g), w.double(), bias.double())
    assert got.dtype == dtype and got.shape == want.shape
    err = _rel_err(got, want)
    assert err <= (1e-5 if dtype == torch.float32 else 4e-3), f"{config}: relative error {err:.2e}"


@pytest.mark.parametrize("config", [FMA, SWAP], ids=["fma", "swap"])
def test_residual_epilogue_rounds_as_the_torch_sum(config):
    gen = torch.Generator().manual_seed(32)
    m = 1 if config.mode == "fma" else 3
    x = torch.randn(m, 1, 192, generator=gen).bfloat16()
    w = (torch.randn(100, 192, generator=gen) / 8).bfloat16()
    residual = torch.randn(m, 1, 100, generator=gen).bfloat16()
    got = linear_small_m(x, w, config=config, residual=residual)
    assert got.shape == residual.shape and got.data_ptr() != residual.data_ptr()
    assert torch.equal(got, residual + linear_small_m(x, w, config=config))
    with pytest.raises(KernelInputError, match="residual must be a contiguous"):
        linear_small_m(x, w, config=config, residual=residual[..., :99])
    with pytest.raises(KernelInputError, match="residual must be a contiguous"):
        linear_small_m(x, w, config=config, residual=residual, out_dtype=torch.float32)


def test_fused_norm_in_the_glu_and_rope_epilogues():
    gen = torch.Generator().manual_seed(33)
    x = torch.randn(1, 1, 128, generator=gen).bfloat16() * 7
    g = (1 + torch.randn(128, generator=gen) / 4).bfloat16()
    normed = layers.rms_norm(x, g, EPS)
    # GLU: against the composite over the normalised rows (which rounds them once more).
    gate_up = (torch.randn(2 * 40, 128, generator=gen) / 8).bfloat16()
    got = linear_silu_small_m(x, gate_up, config=FMA, norm=(g, EPS))
    want = layers.silu_mul(F.linear(_normed_f64(x, g), gate_up.double()))
    assert _rel_err(got, want) <= 1e-2
    assert _rel_err(got, linear_silu_small_m(normed, gate_up, config=FMA).double()) <= 1e-2
    # RoPE/KV scatter: q and the written k/v rows match the composite's to bf16 rounding.
    heads, kv_heads, d = 4, 2, 16
    w = (torch.randn((heads + 2 * kv_heads) * d, 128, generator=gen) / 8).bfloat16()
    angles = torch.randn(40, d, generator=gen)
    cos, sin = angles.cos(), angles.sin()
    pos, widx = torch.tensor([[7]]), torch.tensor([[65]])
    pools = [torch.zeros(2, 64, kv_heads, d).bfloat16() for _ in range(2)]
    want_pools = [p.clone() for p in pools]
    q = linear_qkv_rope_small_m(x, w, None, heads, cos, sin, pos, widx, *pools, config=FMA, norm=(g, EPS))
    want_q = decoder.qkv_rope_write(F.linear(_normed_f64(x, g), w.double()).bfloat16(), heads, None, None, EPS,
                                    cos, sin, pos, widx, *want_pools)
    assert _rel_err(q, want_q.double()) <= 1e-2
    for got_pool, want_pool in zip(pools, want_pools):
        assert _rel_err(got_pool, want_pool.double()) <= 1e-2
        assert torch.equal(got_pool != 0, want_pool != 0), "k/v written at the write index only"


def test_fused_norm_needs_an_unsplit_k_and_a_matching_weight():
    x, w = torch.randn(2, 256).bfloat16(), torch.randn(64, 256).bfloat16()
    g = torch.ones(256).bfloat16()
    with pytest.raises(KernelInputError, match="unsplit K"):
        linear_small_m(x, w, norm=(g, EPS), config=GemvConfig(block_n=32, block_k=64, split_k=2, mode="swap"))
    with pytest.raises(KernelInputError, match="norm weight must be"):
        linear_small_m(x, w, norm=(torch.ones(255).bfloat16(), EPS), config=SWAP)
    with pytest.raises(KernelInputError, match="norm weight must be"):
        linear_small_m(x, w, norm=(torch.ones(256), EPS), config=SWAP)


@pytest.fixture
def small_m_on_cpu(monkeypatch):
    """Route half-precision products of at most MAX_ROWS rows to the GEMV on the CPU too."""
    def prefers(m, n, k, dtype, device):
        return dtype in (torch.bfloat16, torch.float16) and 1 <= m <= gemv.MAX_ROWS and k % 8 == 0

    monkeypatch.setattr(gemv, "prefers_small_m", prefers)


def test_selectors_fuse_a_deferred_norm(small_m_on_cpu):
    gen = torch.Generator().manual_seed(34)
    x = torch.randn(1, 1, 256, generator=gen).bfloat16() * 3
    g = (1 + torch.randn(256, generator=gen) / 4).bfloat16()
    deferred = rms_norm_deferred(x, g, EPS)
    assert isinstance(deferred, NormedRows)
    w = (torch.randn(96, 256, generator=gen) / 8).bfloat16()
    want = F.linear(_normed_f64(x, g), w.double())
    assert _rel_err(linear(deferred, w), want) <= 4e-3
    logits = linear_float(deferred, w)
    assert logits.dtype == torch.float32 and _rel_err(logits, want) <= 4e-3
    assert _rel_err(linear_silu(deferred, w), layers.silu_mul(want)) <= 1e-2
    # Too many rows for the GEMV: the norm runs as its own kernel, then F.linear.
    many = torch.randn(12, 256, generator=gen).bfloat16()
    eager = rms_norm_deferred(many, g, EPS)
    assert isinstance(eager, torch.Tensor)
    torch.testing.assert_close(eager, layers.rms_norm(many, g, EPS), rtol=1e-2, atol=1e-2)
    # A deferred norm whose product would split K is materialised first.
    long_x = torch.randn(1, 4096, generator=gen).bfloat16()
    long_g = (1 + torch.randn(4096, generator=gen) / 4).bfloat16()
    narrow = (torch.randn(16, 4096, generator=gen) / 8).bfloat16()
    assert gemv.default_config(1, 16, 4096, x.device).split_k > 1
    got = linear(rms_norm_deferred(long_x, long_g, EPS), narrow)
    assert _rel_err(got, F.linear(_normed_f64(long_x, long_g), narrow.double())) <= 1e-2


def test_linear_residual_adds_in_the_gemv_or_leaves_the_sum_pending(small_m_on_cpu):
    gen = torch.Generator().manual_seed(35)
    x = torch.randn(2, 1, 128, generator=gen).bfloat16()
    w = (torch.randn(96, 128, generator=gen) / 8).bfloat16()
    residual = torch.randn(2, 1, 96, generator=gen).bfloat16()
    summed, pending = linear_residual(x, w, residual)
    assert pending is None and torch.equal(summed, residual + linear_small_m(x, w))
    many_x, many_res = torch.randn(3, 4, 128, generator=gen).bfloat16(), torch.randn(3, 4, 96, generator=gen).bfloat16()
    same, pending = linear_residual(many_x, w, many_res)
    assert same is many_res and torch.equal(pending, F.linear(many_x, w))
    # A Qwen3-style q/k norm cannot ride in the GEMV: the deferred norm is materialised.
    heads, kv_heads, d = 2, 1, 32
    wq = (torch.randn((heads + 2 * kv_heads) * d, 128, generator=gen) / 8).bfloat16()
    g, qk_norm = torch.ones(128).bfloat16(), torch.ones(d).bfloat16()
    cos, sin = torch.ones(8, d), torch.zeros(8, d)
    args = (cos, sin, torch.tensor([[1], [2]]), torch.tensor([[3], [4]]))
    pools = [torch.zeros(1, 64, kv_heads, d).bfloat16() for _ in range(2)]
    q = linear_qkv_rope_write(rms_norm_deferred(x, g, EPS), wq, None, heads, qk_norm, qk_norm, EPS, *args, *pools)
    want_pools = [torch.zeros_like(p) for p in pools]
    want = decoder.qkv_rope_write(F.linear(layers.rms_norm(x, g, EPS), wq), heads, qk_norm, qk_norm, EPS, *args,
                                  *want_pools)
    torch.testing.assert_close(q, want, rtol=2e-2, atol=2e-2)


def _spec() -> ModelSpec:
    return ModelSpec(family="llama", architecture="test", vocab_size=97, hidden_size=128, intermediate_size=192,
                     num_layers=2, num_heads=4, num_kv_heads=2, head_dim=32, rms_norm_eps=1e-6,
                     rope_theta=10000.0, max_position_embeddings=256, tie_word_embeddings=False,
                     qkv_bias=False, qk_norm=False)


def test_decode_step_runs_every_norm_inside_the_gemvs(small_m_on_cpu, monkeypatch):
    """A bf16 decode step with cuda_ops: no norm or residual-add kernel runs on its own,
    and the logits match the torch ops' to bf16 rounding."""
    spec = _spec()
    weights = random_runtime_weights(spec, scale=0.2, dtype=torch.bfloat16, seed=36)
    gen = torch.Generator().manual_seed(37)
    prompt = torch.randint(0, spec.vocab_size, (2, 40), generator=gen)
    step = torch.randint(0, spec.vocab_size, (2, 1), generator=gen)
    table = torch.tensor([[1], [2]])

    def batch(start: int, q_len: int) -> AttentionBatch:
        positions = torch.full((2, 1), start) + torch.arange(q_len).view(1, -1)
        pages = table.gather(1, positions // PAGE_TOKENS)
        return AttentionBatch(positions=positions, write_index=pages * PAGE_TOKENS + positions % PAGE_TOKENS,
                              page_table=table, kv_lens=positions[:, -1] + 1)

    results = []
    for fused, ops in ((False, DecoderOps()), (True, cuda_ops())):
        model = Decoder(spec, weights, max_positions=PAGE_TOKENS, ops=ops)
        kv = KVCache.allocate(spec.num_layers, 3, spec.num_kv_heads, spec.head_dim, torch.bfloat16,
                              torch.device("cpu"))
        model.forward(prompt, batch(0, 40), kv, torch.tensor([39, 39]))  # 80 rows: the unfused path
        with monkeypatch.context() as patched:
            if fused:
                def refuse(*args, **kwargs):
                    raise AssertionError("a norm ran as its own kernel in a small-batch step")
                patched.setattr(gemv, "rms_norm", refuse)
                patched.setattr(gemv, "add_rms_norm", refuse)
            hidden = model.forward(step, batch(40, 1), kv)
            logits = model.logits(hidden)
        results.append((hidden, logits, kv))
    (want_h, want_l, want_kv), (got_h, got_l, got_kv) = results
    assert got_h.shape == want_h.shape == (2, spec.hidden_size) and got_l.shape == (2, spec.vocab_size)
    assert _rel_err(got_h, want_h.double()) <= 2e-2
    assert _rel_err(got_l, want_l.double()) <= 2e-2
    for i in range(spec.num_layers):
        assert _rel_err(got_kv.k[i], want_kv.k[i].double()) <= 2e-2
        assert _rel_err(got_kv.v[i], want_kv.v[i].double()) <= 2e-2
