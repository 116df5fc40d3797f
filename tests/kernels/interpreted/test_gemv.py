"""linear_small_m against a float64 F.linear, under the interpreter."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from flare.model.kernels import MAX_ROWS, GemvConfig, KernelInputError, default_config, gemv, linear, linear_small_m
from flare.model.kernels.gemv import ROUTED_ROWS, prefers_small_m, routes_rows


def check_linear(got: torch.Tensor, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, label: str) -> None:
    want = F.linear(x.double(), w.double(), None if bias is None else bias.double())
    assert got.shape == want.shape and got.dtype == x.dtype, f"linear_small_m [{label}]: shape/dtype {got.shape}"
    err = float((got.double() - want).norm() / want.norm())
    # fp32 accumulation; bf16 adds the output rounding (2^-9 relative).
    allowed = 1e-6 if x.dtype == torch.float32 else 4e-3
    assert err <= allowed, f"linear_small_m [{label}]: relative L2 error {err:.2e} > {allowed:.0e}"


CONFIGS = [
    GemvConfig(block_n=32, block_k=128, mode="dot"),
    GemvConfig(block_n=64, block_k=64, split_k=3, mode="swap"),
    GemvConfig(block_n=16, block_k=256, split_k=2, mode="dot"),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("m", [1, 3, 20, MAX_ROWS])
@pytest.mark.parametrize("config", CONFIGS, ids=["dot", "swap-split3", "dot-split2"])
def test_tensor_core_modes(dtype, m, config):
    gen = torch.Generator().manual_seed(m)
    # N and K both off the tile grid (ragged last tiles and splits).
    x = torch.randn(m, 320, generator=gen).to(dtype)
    w = torch.randn(100, 320, generator=gen).to(dtype)
    bias = torch.randn(100, generator=gen).to(dtype) if m != 3 else None
    check_linear(linear_small_m(x, w, bias, config=config), x, w, bias, f"M={m} {dtype} {config}")


@pytest.mark.parametrize("config", [GemvConfig(block_n=16, block_k=128, mode="fma"),
                                    GemvConfig(block_n=32, block_k=64, split_k=4, mode="fma"),
                                    GemvConfig(block_n=16, block_k=128, mode="fma", k_fold=8),
                                    GemvConfig(block_n=32, block_k=64, split_k=4, mode="fma", k_fold=4,
                                               max_registers=80)],
                         ids=["fma", "fma-split4", "fma-fold8", "fma-split4-fold4"])
@pytest.mark.parametrize("m", [1, 3, 8])
def test_fma_mode(config, m):
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(m, 1, 512, generator=gen).bfloat16()  # leading dims flatten to rows
    w = torch.randn(96, 512, generator=gen).bfloat16()
    bias = torch.randn(96, generator=gen).bfloat16()
    got = linear_small_m(x, w, bias, config=config)
    assert got.shape == (m, 1, 96)
    check_linear(got, x, w, bias, f"M={m} {config}")
    if m > 1:  # each row is the product it would be alone, up to the order of the sums
        alone = linear_small_m(x[1:2], w, bias, config=config)
        torch.testing.assert_close(got[1:2].float(), alone.float(), rtol=8e-3, atol=1e-2)


def test_default_config_for_llama3_8b_shapes():
    cpu = torch.device("cpu")  # 132 SMs assumed
    for n, k in [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (128256, 4096)]:
        for m in (1, 2, 3, 8):
            cfg = default_config(m, n, k, cpu)
            programs = -(-n // cfg.block_n) * cfg.split_k
            assert programs >= 132 // 2, f"{(m, n, k)}: {cfg} launches only {programs} programs"
            assert cfg.block_k * cfg.split_k <= k and cfg.num_stages >= 3
            assert (cfg.mode == "fma") == (m <= gemv.FMA_ROWS), cfg
            # 3..8 rows: the o projection splits K in two, its last program reducing
            splits = 2 if (n, k) == (4096, 4096) and m > gemv.FMA_ROWS else 1
            assert (cfg.split_k, cfg.last_reduces or splits == 1) == (splits, True), f"{(m, n, k)}: {cfg}"
    # The qkv product (its RoPE epilogue) folds its accumulator under a register cap at batch 1 only.
    rope = default_config(1, 6144, 4096, cpu, gemv.EPILOGUE_ROPE)
    assert (rope.k_fold, rope.max_registers, rope.num_warps) == (8, gemv.ROPE_MAX_REGISTERS, 2), rope
    assert (default_config(1, 6144, 4096, cpu).k_fold, default_config(3, 6144, 4096, cpu, gemv.EPILOGUE_ROPE).k_fold,
            default_config(2, 6144, 4096, cpu, gemv.EPILOGUE_ROPE).max_registers) == (1, 1, 0)
    # Wide rows: up to 32 the narrow shapes split K (four ways from K = 8,192) with the last
    # program reducing, so the epilogues stay fused; past 32 no split.
    for m in (9, 16, 32):
        for n, k, splits in ((6144, 4096, 2), (4096, 4096, 2), (4096, 14336, 4)):
            cfg = default_config(m, n, k, cpu)
            assert (cfg.block_n, cfg.split_k, cfg.last_reduces, cfg.pdl) == (128, splits, True, True), (m, n, cfg)
        assert default_config(m, 28672, 4096, cpu).split_k == 1
    for n, k in [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (128256, 4096)]:
        cfg = default_config(64, n, k, cpu)
        assert cfg.split_k == 1, cfg
    # The tensor-core tiles (past two rows) run under PDL, load nothing before their wait and let
    # the next kernel start after their K loop; the FMA tiles preload a tile and let it start at once.
    for m in (3, 8, 9, 32, 64):
        for n, k in [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]:
            cfg = default_config(m, n, k, cpu)
            assert (cfg.pdl, cfg.preload_tiles, cfg.trigger_after_loop) == (True, 0, True), (m, n, cfg)
    for m in (1, 2):
        one = default_config(m, 4096, 4096, cpu)
        assert (one.pdl, one.preload_tiles, one.trigger_after_loop) == (True, 1, False), one
    two = [default_config(2, n, k, cpu) for n, k in [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]]
    assert [(c.block_n, c.block_k, c.num_warps, c.k_fold) for c in two] == [(4, 1024, 4, 8), (8, 1024, 4, 8),
                                                                           (4, 1024, 4, 8), (8, 1024, 4, 8)], two
    # A small model's narrow layer splits K so the grid still covers the GPU.
    narrow = default_config(3, 896, 4864, cpu)  # the tensor-core tiles (two rows take the FMA ones)
    assert narrow.split_k > 1 and -(-896 // narrow.block_n) * narrow.split_k >= 132 // 2, narrow


def test_default_config_runs():
    gen = torch.Generator().manual_seed(10)
    for m in (1, 4):
        x = torch.randn(m, 256, generator=gen).bfloat16()
        w = torch.randn(48, 256, generator=gen).bfloat16()
        check_linear(linear_small_m(x, w), x, w, None, f"default M={m}")


def test_selector_routes_only_small_batches_on_cuda():
    cuda = torch.device("cuda")
    assert prefers_small_m(1, 4096, 4096, torch.bfloat16, cuda)
    # 1..64 rows (9..64 in the wide tiles); past 64 the tiles lost to cuBLAS call for call
    assert [m for m in range(1, MAX_ROWS + 2) if routes_rows(m)] == [*range(1, 65)], ROUTED_ROWS
    assert prefers_small_m(64, 4096, 4096, torch.bfloat16, cuda)
    assert prefers_small_m(16, 4096, 4096, torch.bfloat16, cuda)
    assert not prefers_small_m(65, 4096, 4096, torch.bfloat16, cuda)
    assert not prefers_small_m(1, 4096, 4096, torch.float32, cuda)
    assert not prefers_small_m(1, 4096, 4096, torch.bfloat16, torch.device("cpu"))
    # On the CPU the selector is F.linear itself.
    x, w = torch.randn(2, 16).bfloat16(), torch.randn(8, 16).bfloat16()
    assert torch.equal(linear(x, w), F.linear(x, w))


def test_bad_inputs_raise_typed_errors():
    w = torch.randn(8, 16)
    with pytest.raises(KernelInputError, match=r"x must have 1\.\.128 rows, got 129"):
        linear_small_m(torch.randn(129, 16), w)
    with pytest.raises(KernelInputError, match=r"x must be \[\.\.\., K=16\]"):
        linear_small_m(torch.randn(2, 15), w)
    with pytest.raises(KernelInputError, match="share a float dtype"):
        linear_small_m(torch.randn(2, 16).bfloat16(), w)
    with pytest.raises(KernelInputError, match=r"mode 'fma' takes 1\.\.8 rows, got 9"):
        linear_small_m(torch.randn(9, 16), w, config=GemvConfig(mode="fma"))
    with pytest.raises(KernelInputError, match="k_fold must be"):
        linear_small_m(torch.randn(2, 16), w, config=GemvConfig(mode="swap", k_fold=8))
    with pytest.raises(KernelInputError, match="k_fold must be"):
        linear_small_m(torch.randn(1, 16), w, config=GemvConfig(mode="fma", k_fold=3))
    with pytest.raises(KernelInputError, match="max_registers must be"):
        linear_small_m(torch.randn(1, 16), w, config=GemvConfig(mode="fma", max_registers=300))
    with pytest.raises(KernelInputError, match="out_dtype must be"):
        linear_small_m(torch.randn(2, 16), w, out_dtype=torch.float16)
    with pytest.raises(KernelInputError, match="bias must be"):
        linear_small_m(torch.randn(2, 16), w, torch.randn(9))


@pytest.mark.parametrize("config", [GemvConfig(block_n=4, block_k=128, num_warps=2, num_stages=3, mode="fma"),
                                    GemvConfig(block_n=32, block_k=64, mode="swap")], ids=["fma", "swap"])
def test_linear_silu_epilogue_matches_unfused(config):
    """The gate/up GEMV with the SiLU-mul epilogue rounds as layers.silu_mul(linear(x, w)) does."""
    from flare.model import layers
    from flare.model.kernels import linear_silu_small_m

    gen = torch.Generator().manual_seed(21)
    m = 3
    inter = 50  # off the tile grid: the last program holds padding outputs
    x = torch.randn(m, 256, generator=gen).bfloat16()
    w = (torch.randn(2 * inter, 256, generator=gen) / 8).bfloat16()
    got = linear_silu_small_m(x, w, config=config)
    want = layers.silu_mul(linear_small_m(x, w, config=config))
    assert got.shape == (m, inter) and got.dtype == torch.bfloat16
    assert torch.equal(got, want), f"{config}: {(got.float() - want.float()).abs().max()}"
    with pytest.raises(KernelInputError, match="no K split"):
        linear_silu_small_m(x, w, config=GemvConfig(block_n=32, block_k=64, split_k=2, mode="swap"))


def test_float32_output_holds_the_rounded_product():
    gen = torch.Generator().manual_seed(22)
    x = torch.randn(1, 256, generator=gen).bfloat16()
    w = torch.randn(100, 256, generator=gen).bfloat16()
    cfg = GemvConfig(block_n=4, block_k=128, num_warps=2, num_stages=3, mode="fma")
    got = linear_small_m(x, w, config=cfg, out_dtype=torch.float32)
    assert got.dtype == torch.float32
    assert torch.equal(got, linear_small_m(x, w, config=cfg).float())


@pytest.mark.parametrize("config", [GemvConfig(block_n=4, block_k=64, num_warps=2, num_stages=3, mode="fma"),
                                    GemvConfig(block_n=16, block_k=64, mode="swap")], ids=["fma", "swap"])
def test_qkv_rope_epilogue_matches_the_decoder_composite(config):
    """The qkv GEMV with RoPE and the K/V scatter as its epilogue writes what
    decoder.qkv_rope_write(linear(x, w, bias)) writes (q, and k/v in the pools only at
    the write indices)."""
    from flare.model import decoder
    from flare.model.kernels import fuses_qkv_rope, linear_qkv_rope_small_m

    gen = torch.Generator().manual_seed(23)
    heads, kv_heads, d, hidden = 4, 2, 16, 128
    b = 3
    x = torch.randn(b, 1, hidden, generator=gen).bfloat16()
    w = (torch.randn((heads + 2 * kv_heads) * d, hidden, generator=gen) / 8).bfloat16()
    bias = torch.randn(w.shape[0], generator=gen).bfloat16()
    angles = torch.randn(40, d, generator=gen)
    cos, sin = angles.cos(), angles.sin()
    positions = torch.tensor([[5], [39], [0]])[:b]
    write_index = torch.tensor([[70], [3], [129]])[:b]  # flat (page * 64 + offset) slots in a 3-page pool
    assert fuses_qkv_rope(x, w, d, config)
    pools = [torch.zeros(3, 64, kv_heads, d).bfloat16() for _ in range(2)]
    want_pools = [p.clone() for p in pools]
    got = linear_qkv_rope_small_m(x, w, bias, heads, cos, sin, positions, write_index, *pools, config=config)
    want = decoder.qkv_rope_write(linear_small_m(x, w, bias, config=config), heads, None, None, 1e-6, cos, sin,
                                  positions, write_index, *want_pools)
    assert got.shape == (b, 1, heads, d) and torch.equal(got, want), f"{config}: q"
    for name, pool, want_pool in zip("kv", pools, want_pools):
        assert torch.equal(pool, want_pool), f"{config}: {name} pool"
    assert int((pools[0].abs().sum(-1) > 0).sum()) == b * kv_heads, "k must be written at the write indices only"
    with pytest.raises(KernelInputError, match="head_dim / 2 a multiple"):
        linear_qkv_rope_small_m(x, w, bias, heads, cos, sin, positions, write_index, *pools,
                                config=GemvConfig(block_n=32, block_k=64, mode="swap"))
