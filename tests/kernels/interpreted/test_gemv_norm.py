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
    GemvConfig,
    KernelInputError,
    NormedRows,
    gemv,
    linear,
    linear_add_rms_norm,
    linear_add_rms_norm_small_m,
    linear_float,
    linear_qkv_rope_small_m,
    linear_qkv_rope_write,
    linear_silu,
    linear_silu_small_m,
    linear_small_m,
)
from flare.model.spec import ModelSpec

FMA = GemvConfig(block_n=4, block_k=64, num_warps=2, num_stages=3, mode="fma")
FMA8 = GemvConfig(block_n=8, block_k=64, num_warps=4, num_stages=3, mode="fma")  # batch 1's o and down
FOLD = GemvConfig(block_n=4, block_k=64, num_warps=2, num_stages=3, mode="fma", k_fold=8)
FOLD8 = GemvConfig(block_n=8, block_k=64, num_warps=4, num_stages=3, mode="fma", k_fold=8)
SWAP = GemvConfig(block_n=16, block_k=64, mode="swap")
DOT = GemvConfig(block_n=32, block_k=128, mode="dot")
EPS = 1e-5


def _normed_f64(h: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    hd = h.double()
    return hd * torch.rsqrt(hd.pow(2).mean(-1, keepdim=True) + EPS) * g.double()


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want).norm() / want.norm())


def _sublayer(m: int, hidden: int, dtype: torch.dtype, seed: int):
    """A sublayer output x, its projection into the residual stream and the next norm weight."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, 1, 96, generator=gen).to(dtype)
    w = (torch.randn(hidden, 96, generator=gen) / 8).to(dtype)
    # Rows of very different scales: the norm must be per row.
    residual = (torch.randn(m, 1, hidden, generator=gen) * torch.logspace(-1, 2, m)[:, None, None]).to(dtype)
    g = (1 + torch.randn(hidden, generator=gen) / 4).to(dtype)
    return x, w, residual, g


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("config", [FMA, FMA8, SWAP], ids=["fma", "fma8", "swap"])
def test_add_norm_epilogue_writes_the_residual_sum_and_the_norm_inputs(dtype, config):
    m = 3  # the FMA tiles hold every row's accumulator too
    x, w, residual, g = _sublayer(m, 200, dtype, seed=31)  # 200: a ragged last program
    normed = linear_add_rms_norm_small_m(x, w, residual, g, EPS, config=config)
    assert isinstance(normed, NormedRows) and normed.weight is g and normed.eps == EPS
    h = normed.x
    assert h.shape == residual.shape and h.dtype == dtype
    assert torch.equal(h, residual + linear_small_m(x, w, config=config)), "h must round as the torch sum"
    assert torch.equal(normed.scaled, (h.float() * g.float()).to(dtype))
    programs = -(-200 // config.block_n)
    assert normed.squares.shape == (m, programs) and normed.squares.dtype == torch.float32
    torch.testing.assert_close(normed.squares.sum(-1), h.float().pow(2).sum(-1).view(m), rtol=1e-5, atol=0)
    torch.testing.assert_close(normed.materialize(), layers.rms_norm(h, g, EPS))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("producer, consumer", [(FMA, FMA), (FMA8, FMA), (FOLD8, FOLD), (SWAP, SWAP), (SWAP, DOT)],
                         ids=["fma", "fma8", "fold8", "swap", "dot"])
def test_gemv_normalises_its_normed_rows_input(dtype, producer, consumer):
    m = 3
    x, w, residual, g = _sublayer(m, 200, dtype, seed=32)
    normed = linear_add_rms_norm_small_m(x, w, residual, g, EPS, config=producer)
    gen = torch.Generator().manual_seed(33)
    w2 = torch.randn(72, 200, generator=gen).to(dtype)
    bias = torch.randn(72, generator=gen).to(dtype)
    got = linear_small_m(normed, w2, bias, config=consumer)
    want = F.linear(_normed_f64(normed.x, g), w2.double(), bias.double())
    assert got.shape == want.shape and got.dtype == dtype
    err = _rel_err(got, want)
    assert err <= (1e-5 if dtype == torch.float32 else 4e-3), f"{consumer}: relative error {err:.2e}"


@pytest.mark.parametrize("config, m", [(FMA, 1), (FOLD, 1), (FOLD, 5), (SWAP, 40)],
                         ids=["fma", "fold8", "fold8-5-rows", "swap-40-rows"])
def test_normed_rows_in_the_glu_rope_and_logits_epilogues(config, m):
    x, w, residual, g = _sublayer(m, 128, torch.bfloat16, seed=34)
    normed = linear_add_rms_norm_small_m(x, w, residual, g, EPS, config=config)
    want_in = _normed_f64(normed.x, g)
    gen = torch.Generator().manual_seed(35)
    gate_up = (torch.randn(2 * 40, 128, generator=gen) / 8).bfloat16()
    got = linear_silu_small_m(normed, gate_up, config=config)
    assert _rel_err(got, layers.silu_mul(F.linear(want_in, gate_up.double()))) <= 1e-2
    head = (torch.randn(50, 128, generator=gen) / 8).bfloat16()
    logits = linear_small_m(normed, head, config=config, out_dtype=torch.float32)
    assert logits.dtype == torch.float32 and _rel_err(logits, F.linear(want_in, head.double())) <= 4e-3
    # RoPE/KV scatter: q and the written k/v rows match the composite's to bf16 rounding.
    heads, kv_heads, d = 4, 2, 16
    wq = (torch.randn((heads + 2 * kv_heads) * d, 128, generator=gen) / 8).bfloat16()
    angles = torch.randn(40, d, generator=gen)
    cos, sin = angles.cos(), angles.sin()
    pos = torch.arange(m).view(m, 1) % 40  # each row its own position and cache slot
    widx = 64 + 2 * torch.arange(m).view(m, 1)
    untouched = 8192.0  # no k or v value comes near it
    pools = [torch.full((3, 64, kv_heads, d), untouched).bfloat16() for _ in range(2)]
    want_pools = [p.clone() for p in pools]
    q = linear_qkv_rope_small_m(normed, wq, None, heads, cos, sin, pos, widx, *pools, config=config)
    want_q = decoder.qkv_rope_write(F.linear(want_in, wq.double()).bfloat16(), heads, None, None, EPS,
                                    cos, sin, pos, widx, *want_pools)
    assert _rel_err(q, want_q.double()) <= 1e-2
    for got_pool, want_pool in zip(pools, want_pools):
        assert _rel_err(got_pool, want_pool.double()) <= 1e-2
        assert torch.equal(got_pool == untouched, want_pool == untouched), "k/v written at the write index only"


def test_bad_norm_inputs_raise_typed_errors():
    x, w, residual, g = _sublayer(2, 64, torch.bfloat16, seed=36)
    with pytest.raises(KernelInputError, match="residual must be a contiguous"):
        linear_add_rms_norm_small_m(x, w, residual[..., :63], g, EPS, config=SWAP)
    with pytest.raises(KernelInputError, match="norm weight must be"):
        linear_add_rms_norm_small_m(x, w, residual, g.float(), EPS, config=SWAP)
    with pytest.raises(KernelInputError, match="unsplit K"):
        linear_add_rms_norm_small_m(x, w, residual, g, EPS, config=GemvConfig(block_n=16, block_k=32, split_k=2))
    normed = linear_add_rms_norm_small_m(x, w, residual, g, EPS, config=SWAP)
    w2 = torch.randn(32, 64).bfloat16()
    with pytest.raises(KernelInputError, match="fused norm needs an unsplit K"):
        linear_small_m(normed, w2, config=GemvConfig(block_n=16, block_k=32, split_k=2))
    with pytest.raises(KernelInputError, match="partial squares must be"):
        linear_small_m(NormedRows(normed.x, g, EPS, normed.scaled, normed.squares[:1]), w2, config=SWAP)


@pytest.fixture
def small_m_on_cpu(monkeypatch):
    """Route half-precision products of ROUTED_ROWS's row counts to the GEMV on the CPU too."""
    def prefers(m, n, k, dtype, device):
        return dtype in (torch.bfloat16, torch.float16) and gemv.routes_rows(m) and k % 8 == 0

    monkeypatch.setattr(gemv, "prefers_small_m", prefers)


def test_selectors_take_normed_rows_or_materialise_them(small_m_on_cpu):
    x, w, residual, g = _sublayer(1, 4096, torch.bfloat16, seed=37)
    normed, h = linear_add_rms_norm(x, w, residual, g, EPS)
    assert isinstance(normed, NormedRows) and h is normed.x
    want_in = _normed_f64(h, g)
    gen = torch.Generator().manual_seed(38)
    w2 = (torch.randn(96, 4096, generator=gen) / 64).bfloat16()
    want = F.linear(want_in, w2.double())
    assert _rel_err(linear(normed, w2), want) <= 4e-3
    logits = linear_float(normed, w2)
    assert logits.dtype == torch.float32 and _rel_err(logits, want) <= 4e-3
    assert _rel_err(linear_silu(normed, w2), layers.silu_mul(want)) <= 1e-2
    # A product that would split K (a narrow layer at batch 1) gets the norm computed first.
    narrow = (torch.randn(16, 4096, generator=gen) / 64).bfloat16()
    assert gemv.default_config(1, 16, 4096, h.device).split_k > 1
    assert _rel_err(linear(normed, narrow), F.linear(want_in, narrow.double())) <= 1e-2
    # More rows than the GEMV takes: the product, then one add+norm kernel.
    assert not gemv.routes_rows(gemv.MAX_ROWS)
    many_x, _, many_res, _ = _sublayer(gemv.MAX_ROWS, 4096, torch.bfloat16, seed=39)
    y, h = linear_add_rms_norm(many_x, w, many_res, g, EPS)
    assert isinstance(y, torch.Tensor) and torch.equal(h, many_res + F.linear(many_x, w))
    torch.testing.assert_close(y, layers.rms_norm(h, g, EPS), rtol=1e-2, atol=1e-2)
    # A Qwen3-style q/k norm needs whole heads: the qkv selector materialises the input norm.
    heads, kv_heads, d = 2, 1, 32
    wq = (torch.randn((heads + 2 * kv_heads) * d, 4096, generator=gen) / 64).bfloat16()
    qk_norm = torch.ones(d).bfloat16()
    cos, sin = torch.ones(8, d), torch.zeros(8, d)
    args = (cos, sin, torch.tensor([[1]]), torch.tensor([[3]]))
    pools = [torch.zeros(1, 64, kv_heads, d).bfloat16() for _ in range(2)]
    want_pools = [torch.zeros_like(p) for p in pools]
    q = linear_qkv_rope_write(normed, wq, None, heads, qk_norm, qk_norm, EPS, *args, *pools)
    want_q = decoder.qkv_rope_write(F.linear(normed.materialize(), wq), heads, qk_norm, qk_norm, EPS, *args,
                                    *want_pools)
    torch.testing.assert_close(q, want_q, rtol=2e-2, atol=2e-2)


def _spec() -> ModelSpec:
    return ModelSpec(family="llama", architecture="test", vocab_size=97, hidden_size=128, intermediate_size=192,
                     num_layers=2, num_heads=4, num_kv_heads=2, head_dim=32, rms_norm_eps=1e-6,
                     rope_theta=10000.0, max_position_embeddings=256, tie_word_embeddings=False,
                     qkv_bias=False, qk_norm=False)


def test_decode_step_runs_every_norm_inside_the_gemvs(small_m_on_cpu, monkeypatch):
    """A bf16 decode step with cuda_ops: between the first norm and the final one no norm
    runs on its own, and the step is as close to a float32 forward as the torch ops' bf16
    step is (the fused norm only moves a rounding)."""
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

    results = {}
    for name, ops, dtype in (("fp32", DecoderOps(), torch.float32), ("torch", DecoderOps(), torch.bfloat16),
                             ("fused", cuda_ops(), torch.bfloat16)):
        model = Decoder(spec, {k: v.to(dtype) for k, v in weights.items()}, max_positions=PAGE_TOKENS, ops=ops)
        kv = KVCache.allocate(spec.num_layers, 3, spec.num_kv_heads, spec.head_dim, dtype, torch.device("cpu"))
        model.forward(prompt, batch(0, 40), kv, torch.tensor([39, 39]))  # 80 rows: the unfused path
        with monkeypatch.context() as patched:
            if name == "fused":
                def refuse(*args, **kwargs):
                    raise AssertionError("a norm ran as its own kernel in a small-batch step")
                patched.setattr(gemv, "rms_norm", refuse)
                patched.setattr(gemv, "add_rms_norm", refuse)
            hidden = model.forward(step, batch(40, 1), kv)
        results[name] = hidden, model.logits(hidden), kv
    assert results["fused"][0].shape == (2, spec.hidden_size) and results["fused"][1].shape == (2, spec.vocab_size)
    want_h, want_l, want_kv = (t.double() if isinstance(t, torch.Tensor) else t for t in results["fp32"])
    errors = {}
    for name in ("torch", "fused"):
        h, lg, kv = results[name]
        errors[name] = [_rel_err(h, want_h), _rel_err(lg, want_l)]
        errors[name] += [_rel_err(pool[i], want_pool[i].double())
                         for pool, want_pool in ((kv.k, want_kv.k), (kv.v, want_kv.v)) for i in range(spec.num_layers)]
    for got, ref in zip(errors["fused"], errors["torch"]):
        assert got <= 1.25 * ref + 1e-3, f"fused step error vs float32 {errors['fused']}, torch bf16 {errors['torch']}"
