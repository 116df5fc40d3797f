"""Triton kernels on CUDA at real sizes, and inside captured CUDA graphs.

Shapes are Llama-3-8B's (H=32, Hkv=8, D=128, hidden 4096, intermediate 14336,
vocab 128256) unless a test says otherwise. Every assertion message names the
kernel, the case and the error, so a failure read from a log is enough to act on.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)
pytest.importorskip("triton")
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.language.extra.cuda import gdc_launch_dependents  # noqa: E402

from flare.model import decoder, kernels, layers  # noqa: E402
from flare.model.kernels import (  # noqa: E402
    DECODE_LAUNCH,
    PREFILL_LAUNCH,
    GemvConfig,
    _common,
    add_rms_norm,
    choose_num_splits,
    gemv,  # noqa: E402
    linear,
    linear_float,
    linear_qkv_rope_write,
    linear_silu,
    linear_small_m,
    paged_attention,
    paged_decode_attention,
    paged_prefill_attention,
    qkv_rope_write,
    rms_norm,
    silu_mul,
)
from tests.gpu.graphs import capture  # noqa: E402
from tests.kernels.paged_cases import build_case, check_attention, tolerance  # noqa: E402

pytestmark = pytest.mark.gpu
DEV = torch.device("cuda")
H, HKV, D, HIDDEN, INTER, VOCAB = 32, 8, 128, 4096, 14336, 128256
PMAX = 128  # 8k context


def _lens(n: int, high: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(1, high + 1, (n,), generator=gen).tolist()


# -- attention -----------------------------------------------------------------

@pytest.mark.parametrize("b", [1, 8, 64])
def test_decode_llama3_shapes(b):
    lens = _lens(b, PMAX * 64, seed=b)
    lens[0] = PMAX * 64  # one row at the full context
    padding = (b - 1,) if b > 1 else ()
    case = build_case(kv_lens=lens, q_len=1, num_heads=H, num_kv_heads=HKV, head_dim=D, max_pages=PMAX,
                      dtype=torch.bfloat16, device=DEV, seed=b, shared_pages=min(lens) // 64, padding_rows=padding)
    splits = choose_num_splits(b, HKV, 1, PMAX, DEV)
    out = paged_decode_attention(case.q, case.k_pool, case.v_pool, case.batch, case.scale)
    check_attention(f"paged_decode_attention (auto splits={splits})", out, case)
    ref = case.reference()
    for forced in (1, 16):
        out = paged_decode_attention(case.q, case.k_pool, case.v_pool, case.batch, case.scale, num_splits=forced)
        check_attention(f"paged_decode_attention (splits={forced})", out, case, ref)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("heads, kv_heads, head_dim", [(14, 2, 64), (16, 2, 96), (32, 32, 128)],
                         ids=["group7-d64", "group8-d96", "mha-d128"])
def test_decode_other_layouts(dtype, heads, kv_heads, head_dim):
    case = build_case(kv_lens=_lens(6, 4000, seed=heads), q_len=1, num_heads=heads, num_kv_heads=kv_heads,
                      head_dim=head_dim, max_pages=64, dtype=dtype, device=DEV, seed=3)
    out = paged_attention(case.q, case.k_pool, case.v_pool, case.batch, case.scale)
    check_attention("paged_attention (decode)", out, case)


def test_decode_long_context():
    case = build_case(kv_lens=[32768, 20001], q_len=1, num_heads=H, num_kv_heads=HKV, head_dim=D, max_pages=512,
                      dtype=torch.bfloat16, device=DEV, seed=4, shared_pages=100)
    check_attention("paged_decode_attention (32k)", paged_decode_attention(
        case.q, case.k_pool, case.v_pool, case.batch, case.scale), case)


@pytest.mark.parametrize("b, q_len, lens, num_new", [
    (1, 64, [7000], None),  # short chunk after a long prefix: context splits
    (1, 512, [3512], None),
    (1, 2048, [2048], None),  # first chunk of a prompt
    (4, 128, [128, 4000, 70, 0], [128, 128, 6, 0]),  # ragged, padding tokens and a padding row
], ids=["q64-prefix7k", "q512-prefix3k", "q2048-fresh", "b4-ragged"])
def test_prefill(b, q_len, lens, num_new):
    padding = tuple(i for i, n in enumerate(lens) if n == 0)
    case = build_case(kv_lens=lens, num_new=num_new, q_len=q_len, num_heads=H, num_kv_heads=HKV, head_dim=D,
                      max_pages=PMAX, dtype=torch.bfloat16, device=DEV, seed=q_len, padding_rows=padding)
    out = paged_prefill_attention(case.q, case.k_pool, case.v_pool, case.batch, case.scale)
    check_attention("paged_prefill_attention", out, case)
    # the steps every row of a block sees whole skip the mask: the same sums, which the
    # compiled kernels may round differently (the interpreter shows them bit-equal)
    assert PREFILL_LAUNCH.unmasked_steps
    masked = paged_prefill_attention(case.q, case.k_pool, case.v_pool, case.batch, case.scale,
                                     launch=replace(PREFILL_LAUNCH, unmasked_steps=False))
    check_attention("paged_prefill_attention (masked steps)", masked, case)
    real = case.real_rows.view(-1, 1) & (case.batch.positions < case.batch.kv_lens.view(-1, 1))
    assert (out[real].float() - masked[real].float()).abs().max() <= tolerance(out.dtype)[0]


def test_prefill_fp32_and_head_dim_64():
    case = build_case(kv_lens=[900, 300], q_len=256, num_heads=16, num_kv_heads=4, head_dim=64, max_pages=16,
                      dtype=torch.float32, device=DEV, seed=9, shared_pages=2)
    check_attention("paged_prefill_attention (fp32)", paged_prefill_attention(
        case.q, case.k_pool, case.v_pool, case.batch, case.scale), case)


# -- elementwise -----------------------------------------------------------------

def _assert_close(kernel: str, got: torch.Tensor, want: torch.Tensor) -> None:
    ulp = torch.finfo(want.dtype).eps
    err = (got.float() - want.float()).abs()
    bound = ulp * (1 + want.float().abs())
    exact = float((got == want).float().mean())
    assert got.shape == want.shape and got.dtype == want.dtype, f"{kernel}: {got.shape}/{got.dtype} vs {want.shape}"
    assert bool((err <= bound).all()) and exact >= 0.97, (
        f"{kernel} {tuple(want.shape)} {want.dtype}: max abs error {float(err.max()):.3e}, "
        f"{int((err > bound).sum())} elements above one ulp, {exact:.2%} bit-identical")


def _rope_tables(positions: torch.Tensor, head_dim: int, theta: float = 500000.0):
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=DEV).float() / head_dim))
    freqs = positions.float()[..., None] * inv_freq
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


@pytest.mark.parametrize("rows", [1, 64, 2048])
def test_norms(rows):
    gen = torch.Generator(device=DEV).manual_seed(rows)
    x = torch.randn(rows, HIDDEN, generator=gen, device=DEV).bfloat16()
    residual = (3 * torch.randn(rows, HIDDEN, generator=gen, device=DEV)).bfloat16()
    w = torch.randn(HIDDEN, generator=gen, device=DEV).bfloat16()
    _assert_close("rms_norm", rms_norm(x, w, 1e-5), layers.rms_norm(x, w, 1e-5))
    normed, new_residual = add_rms_norm(x, residual, w, 1e-5)
    assert torch.equal(new_residual, residual + x), "add_rms_norm: residual is not the exact bf16 sum"
    _assert_close("add_rms_norm", normed, layers.rms_norm(residual + x, w, 1e-5))
    if rows > 1:  # as a prefill chunk [1, Q, N]: transformers' norm bit for bit
        chunk, chunk_residual = x.view(1, rows, HIDDEN), residual.view(1, rows, HIDDEN)
        assert torch.equal(rms_norm(chunk, w, 1e-5), layers.rms_norm(chunk, w, 1e-5)), f"rms_norm, {rows} tokens"
        normed, new_residual = add_rms_norm(chunk, chunk_residual, w, 1e-5)
        assert torch.equal(new_residual, chunk_residual + chunk)
        assert torch.equal(normed, layers.rms_norm(chunk_residual + chunk, w, 1e-5)), f"add_rms_norm, {rows} tokens"


@pytest.mark.parametrize("width", [576, 896, 1536, 2048, 3584, 4096, 5120])
def test_prefill_variance_is_torch_reduction_bit_for_bit(width):
    """The prefill norms sum the squares in the order torch's CUDA reduction does
    (elementwise.torch_reduce_lanes): the variance equals transformers' bit for bit at every
    modelled launch shape, from one row (the whole block on it) to rows past a wave."""
    from flare.model.kernels.elementwise import ordered_variance, torch_reduce_lanes

    gen = torch.Generator(device=DEV).manual_seed(width)
    checked = 0
    for rows in (1, 2, 3, 5, 8, 15, 16, 17, 63, 100, 511, 512, 2048, 2049):
        if not torch_reduce_lanes(rows, width):
            continue
        spread = torch.exp(3 * torch.randn(rows, width, generator=gen, device=DEV))
        x = (torch.randn(rows, width, generator=gen, device=DEV) * spread).bfloat16()
        want = x.view(1, rows, width).float().pow(2).mean(-1, keepdim=True).view(rows)
        got = ordered_variance(x.view(1, rows, width)).view(rows)
        assert torch.equal(got, want), f"{rows} rows of {width}: {int((got != want).sum())} variances differ"
        checked += 1
    assert checked >= 10


@pytest.mark.parametrize("b, q_len", [(64, 1), (1, 512)])
@pytest.mark.parametrize("norm", [False, True], ids=["llama", "qwen3"])
def test_qkv_rope_write_rounds_as_the_composite(b, q_len, norm):
    """RoPE without a q/k norm is bit-identical to the torch composite (transformers'
    rounding); with Qwen3's per-head norm the fp32 sums may add in another order."""
    gen = torch.Generator(device=DEV).manual_seed(q_len)
    qkv = torch.randn(b, q_len, (H + 2 * HKV) * D, generator=gen, device=DEV).bfloat16()
    positions = torch.randint(0, 8192, (b, q_len), generator=gen, device=DEV)
    write_index = torch.randperm(b * q_len, generator=gen, device=DEV).view(b, q_len) + 64
    cos, sin = _rope_tables(torch.arange(8192, device=DEV), D)
    qn, kn = (torch.randn(D, generator=gen, device=DEV).bfloat16() for _ in range(2)) if norm else (None, None)
    pages = (b * q_len + 64) // 64 + 1
    want_k, want_v = (torch.zeros(pages, 64, HKV, D, device=DEV, dtype=torch.bfloat16) for _ in range(2))
    got_k, got_v = want_k.clone(), want_v.clone()
    want_q = decoder.qkv_rope_write(qkv, H, qn, kn, 1e-6, cos, sin, positions, write_index, want_k, want_v)
    got_q = qkv_rope_write(qkv, H, qn, kn, 1e-6, cos, sin, positions, write_index, got_k, got_v)
    assert torch.equal(got_v, want_v), "qkv_rope_write: v must be copied exactly"
    if norm:
        _assert_close("qkv_rope_write q", got_q, want_q)
        _assert_close("qkv_rope_write k", got_k, want_k)
    else:
        assert torch.equal(got_q, want_q), f"q: {float((got_q == want_q).float().mean()):.2%} bit-identical"
        assert torch.equal(got_k, want_k), f"k: {float((got_k == want_k).float().mean()):.2%} bit-identical"


@pytest.mark.parametrize("rows", [1, 64, 512])
def test_silu_mul(rows):
    gen = torch.Generator(device=DEV).manual_seed(rows)
    gate_up = (2 * torch.randn(rows, 2 * INTER, generator=gen, device=DEV)).bfloat16()
    _assert_close("silu_mul", silu_mul(gate_up), layers.silu_mul(gate_up))


# -- GEMV ------------------------------------------------------------------------

LLAMA_LINEARS = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336),
                 "lm_head": (VOCAB, 4096)}


def _check_linear(label: str, got: torch.Tensor, x: torch.Tensor, w: torch.Tensor, bias=None) -> None:
    want = x.float() @ w.float().t()
    if bias is not None:
        want += bias.float()
    err = float((got.float() - want).norm() / want.norm())
    assert got.dtype == x.dtype and err <= 4e-3, f"{label}: relative L2 error {err:.2e} (allowed 4e-3)"


@pytest.mark.parametrize("name", list(LLAMA_LINEARS))
def test_linear_small_m_llama3_shapes(name):
    n, k = LLAMA_LINEARS[name]
    gen = torch.Generator(device=DEV).manual_seed(n)
    w = (torch.randn(n, k, generator=gen, device=DEV) / math.sqrt(k)).bfloat16()
    bias = torch.randn(n, generator=gen, device=DEV).bfloat16() if name == "qkv" else None
    for m in (1, 2, 4, 8, 16, 33, 64, 128):  # the wide rows' tensor-core tiles too
        x = torch.randn(m, k, generator=gen, device=DEV).bfloat16()
        _check_linear(f"linear_small_m {name} M={m} N={n} K={k}", linear_small_m(x, w, bias), x, w, bias)
    for cfg in (GemvConfig(mode="swap", block_n=64, block_k=128), GemvConfig(mode="dot", split_k=4, block_n=32),
                GemvConfig(mode="swap", block_n=32, block_k=256, num_stages=5)):
        x = torch.randn(3, k, generator=gen, device=DEV).bfloat16()
        _check_linear(f"linear_small_m {name} M=3 {cfg}", linear_small_m(x, w, bias, config=cfg), x, w, bias)


def test_linear_selector():
    gen = torch.Generator(device=DEV).manual_seed(0)
    w = torch.randn(1024, 4096, generator=gen, device=DEV).bfloat16()
    x = torch.randn(1, 8, 4096, generator=gen, device=DEV).bfloat16()
    assert torch.equal(linear(x, w), linear_small_m(x, w)), "linear: M=8 must route to linear_small_m"
    x = torch.randn(128, 4096, generator=gen, device=DEV).bfloat16()
    assert not gemv.routes_rows(128) and torch.equal(linear(x, w), F.linear(x, w)), \
        "linear: M=128 must go to F.linear"
    x = torch.randn(16, 4096, generator=gen, device=DEV).bfloat16()
    assert torch.equal(linear(x, w), linear_small_m(x, w)), "linear: M=16 must route to linear_small_m"
    x = torch.randn(1, 64, 4096, generator=gen, device=DEV).bfloat16()
    assert torch.equal(linear(x, w), linear_small_m(x, w)), "linear: M=64 must route to linear_small_m"


# -- CUDA graphs -----------------------------------------------------------------

def _refill_case(case, lens: list[int], seed: int) -> None:
    """New q, lengths, positions and page tables written into the captured tensors."""
    fresh = build_case(kv_lens=lens, q_len=case.q.shape[1], num_heads=case.q.shape[2],
                       num_kv_heads=case.k_pool.shape[2], head_dim=case.q.shape[3],
                       max_pages=case.batch.page_table.shape[1], dtype=case.q.dtype, device=DEV, seed=seed,
                       spare_pages=case.k_pool.shape[0] - 1 - sum(-(-n // 64) for n in lens))
    for dst, src in ((case.q, fresh.q), (case.k_pool, fresh.k_pool), (case.v_pool, fresh.v_pool),
                     (case.batch.positions, fresh.batch.positions), (case.batch.page_table, fresh.batch.page_table),
                     (case.batch.kv_lens, fresh.batch.kv_lens)):
        dst.copy_(src)
    case.real_rows = fresh.real_rows
    case.label = fresh.label


@pytest.mark.parametrize("b, q_len", [(1, 1), (8, 1), (2, 128)], ids=["decode-b1", "decode-b8", "prefill-b2"])
def test_attention_graph_replay(b, q_len):
    lens = [4000 + 100 * i for i in range(b)]
    case = build_case(kv_lens=lens, q_len=q_len, num_heads=H, num_kv_heads=HKV, head_dim=D, max_pages=PMAX,
                      dtype=torch.bfloat16, device=DEV, seed=11, spare_pages=64 * b)
    graph, out = capture(lambda: paged_attention(case.q, case.k_pool, case.v_pool, case.batch, case.scale))
    for step, new_lens in enumerate([[8000 - 300 * i for i in range(b)], [65 + i for i in range(b)]]):
        _refill_case(case, new_lens, seed=20 + step)
        graph.replay()
        torch.cuda.synchronize()
        check_attention(f"paged_attention replay {step}", out, case)


def _split_replays(b: int, launch, seed: int):
    """One captured decode-attention graph under ``launch`` over a split context, replayed as
    the rows' lengths change (long, short, back): yields (replay, out, args, case) after each."""
    lens = [4000 + 50 * i for i in range(b)]
    case = build_case(kv_lens=lens, q_len=1, num_heads=H, num_kv_heads=HKV, head_dim=D, max_pages=PMAX,
                      dtype=torch.bfloat16, device=DEV, seed=seed, spare_pages=64 * b)
    args = (case.q, case.k_pool, case.v_pool, case.batch, case.scale)
    assert choose_num_splits(b, HKV, 1, PMAX, DEV) > 1, "the case must split the context"
    graph, out = capture(lambda: paged_decode_attention(*args, launch=launch))
    for step, new_lens in enumerate([[8000 - 100 * i for i in range(b)], [65 + i for i in range(b)], lens]):
        _refill_case(case, new_lens, seed=seed + 30 + step)
        graph.replay()
        torch.cuda.synchronize()
        yield step, out, args, case


@pytest.mark.parametrize("b", [1, 8, 64])
def test_decode_merge_in_kernel_graph_replay(b):
    """The context-split merge done by the last split (counters, fence, acq_rel count) gives
    the merge kernel's output bit for bit on every replay of one graph, as lengths change."""
    launch = replace(DECODE_LAUNCH, merge_in_kernel=True, balanced_programs_per_sm=0)
    for step, out, args, case in _split_replays(b, launch, seed=12):
        assert torch.equal(out, paged_decode_attention(*args)), f"B={b} replay {step}: differs from the merge kernel"
        check_attention(f"merge in kernel B={b} replay {step}", out, case)


@pytest.mark.parametrize("merge_in_kernel", [False, True], ids=["merge_kernel", "merge_in_kernel"])
@pytest.mark.parametrize("b", [16, 64])
def test_decode_min_split_steps_graph_replay(b, merge_in_kernel):
    """A minimum of steps a split (AttentionLaunch.min_split_steps) on one captured graph as
    the rows' lengths change: short rows take one split, long rows all of them."""
    launch = replace(DECODE_LAUNCH, min_split_steps=4, merge_in_kernel=merge_in_kernel, balanced_programs_per_sm=0)
    for step, out, args, case in _split_replays(b, launch, seed=13):
        check_attention(f"min 4 steps a split B={b} replay {step}", out, case)
        if step == 1:  # every row within one split: the unsplit kernel's output
            assert torch.equal(out, paged_decode_attention(*args, num_splits=1))



@pytest.mark.parametrize("min_steps", [1, 4])
@pytest.mark.parametrize("b", [1, 64])
def test_decode_direct_rows_graph_replay(b, min_steps):
    """Split decode rows that one split holds (written by it, skipped by the merge) and rows
    merged from only the splits holding keys give, on every replay of one graph as the
    lengths change, what every split storing a partial and the merge reading all gives."""
    launch = replace(DECODE_LAUNCH, min_split_steps=min_steps, direct_single_split=True, balanced_programs_per_sm=0)
    for step, out, args, case in _split_replays(b, launch, seed=14):
        full = paged_decode_attention(*args, launch=replace(launch, direct_single_split=False))
        assert torch.equal(out, full), f"B={b} replay {step}: differs from the full merge"
        check_attention(f"direct rows B={b} min {min_steps} replay {step}", out, case)

@pytest.mark.parametrize("per_sm, stages, merge_in_kernel", [(2, 3, False), (3, 2, False), (2, 3, True)])
@pytest.mark.parametrize("b", [4, 16, 64])
def test_decode_balanced_grid_graph_replay(b, per_sm, stages, merge_in_kernel):
    """The balanced decode grid (each row's split count chosen on the device) on one captured
    graph as the rows' lengths change (long rows split and merged, short ones whole): the
    reference on every replay, and the same output replay after replay of the same lengths."""
    launch = replace(DECODE_LAUNCH, balanced_programs_per_sm=per_sm, balanced_min_steps=4,
                     balanced_num_stages=stages, merge_in_kernel=merge_in_kernel)
    for step, out, args, case in _split_replays(b, launch, seed=15):
        check_attention(f"balanced B={b} replay {step}", out, case)
        assert torch.equal(out, paged_decode_attention(*args, launch=launch)), f"B={b} replay {step}: eager differs"


@triton.jit
def _late_writer_kernel(k_ptr, v_ptr, rows_ptr, k_src_ptr, v_src_ptr, busy_ptr, num_busy, row_width,
                        BLOCK: tl.constexpr):
    """Lets the next kernel start at once (a PDL primary), reads ``busy_ptr`` for a while,
    then writes the K/V rows at flat pool rows ``rows_ptr`` (what a qkv projection does)."""
    gdc_launch_dependents()
    offs = tl.arange(0, BLOCK)
    total = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, num_busy, BLOCK):
        total += tl.load(busy_ptr + start + offs, mask=start + offs < num_busy, other=0.0)
    delay = tl.sum(total, axis=0) * 0.0  # keeps the loop: the writes depend on it
    row = tl.load(rows_ptr + tl.program_id(0)).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < row_width
    src = tl.program_id(0) * row_width + cols
    k = tl.load(k_src_ptr + src, mask=ok, other=0.0).to(tl.float32) + delay
    v = tl.load(v_src_ptr + src, mask=ok, other=0.0).to(tl.float32) + delay
    tl.store(k_ptr + row * row_width + cols, k.to(k_ptr.dtype.element_ty), mask=ok)
    tl.store(v_ptr + row * row_width + cols, v.to(v_ptr.dtype.element_ty), mask=ok)


@pytest.mark.parametrize("b", [1, 2])
def test_decode_preload_reads_the_new_key_after_the_wait(b):
    """Decode attention loads each split's first K/V step before its PDL wait; the key at
    the row's own position, written by the kernel before (here a slow one), is read again
    after it. Control: an older key written the same way is missed, so the kernel did
    start early and the first check was not vacuous."""
    assert _common.pdl_level(torch.empty(1, device=DEV)) == 2, "the test needs PDL (sm_90)"
    # The new key in a split's first step (70) and in a later one (1270: 20 steps, 2 a split).
    lens = [70 + 1200 * i for i in range(b)]
    case = build_case(kv_lens=lens, q_len=1, num_heads=H, num_kv_heads=HKV, head_dim=D, max_pages=PMAX,
                      dtype=torch.bfloat16, device=DEV, seed=31)
    table, width = case.batch.page_table, HKV * D
    gen = torch.Generator(device=DEV).manual_seed(32)
    busy = torch.randn(1 << 22, generator=gen, device=DEV)  # 16 MB read by one program: well over 100 us

    def run(keys: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Garbage at each row's key ``keys[row]``, the slow writer fixing it, attention."""
        keys_t = torch.tensor(keys, device=DEV)
        rows = table.gather(1, (keys_t // 64).view(-1, 1)).view(-1) * 64 + keys_t % 64
        k_flat, v_flat = case.k_pool.view(-1, width), case.v_pool.view(-1, width)
        k_new = torch.randn(b, width, generator=gen, device=DEV).bfloat16()
        v_new = torch.randn(b, width, generator=gen, device=DEV).bfloat16()
        k_flat[rows] = float("nan")
        v_flat[rows] = float("nan")
        torch.cuda.synchronize()
        _late_writer_kernel[(b,)](case.k_pool, case.v_pool, rows, k_new, v_new, busy, busy.numel(), width,
                                  BLOCK=triton.next_power_of_2(width), num_warps=4)
        out = paged_decode_attention(case.q, case.k_pool, case.v_pool, case.batch, case.scale)
        torch.cuda.synchronize()
        return out, case.reference()

    out, ref = run([n - 1 for n in lens])
    check_attention("paged_decode_attention after a late write of the new key", out, case, ref)
    stale, ref = run([n - 2 for n in lens])  # an older key, in the same step
    assert not torch.isfinite(stale.float()).all() or not torch.equal(stale, ref), \
        "an older key written after the attention started was seen: the preload did not run before the wait"


def test_embed_rms_norm_in_a_graph_matches_embedding_then_norm():
    """The decode step's first launch gathers the embedding rows and normalises them,
    bit for bit what F.embedding and the norm kernel give, on every replay."""
    gen = torch.Generator(device=DEV).manual_seed(9)
    table = torch.randn(1000, HIDDEN, generator=gen, device=DEV).bfloat16()
    w = torch.randn(HIDDEN, generator=gen, device=DEV).bfloat16()
    tokens = torch.zeros(8, 1, dtype=torch.int64, device=DEV)
    graph, (normed, x) = capture(lambda: kernels.embed_rms_norm(tokens, table, w, 1e-5))
    for ids in ([5, 999, 0, 17, 17, 400, 3, 2], [1, 2, 3, 4, 5, 6, 7, 8]):
        tokens.copy_(torch.tensor(ids, device=DEV).view(8, 1))
        graph.replay()
        torch.cuda.synchronize()
        want_x = F.embedding(tokens, table)
        assert torch.equal(x, want_x) and torch.equal(normed, kernels.rms_norm(want_x, w, 1e-5))


def test_elementwise_and_gemv_graph_replay():
    gen = torch.Generator(device=DEV).manual_seed(5)
    x = torch.empty(4, HIDDEN, device=DEV, dtype=torch.bfloat16)
    residual = torch.empty_like(x)
    w_norm = torch.randn(HIDDEN, generator=gen, device=DEV).bfloat16()
    w_down = (torch.randn(HIDDEN, INTER, generator=gen, device=DEV) / math.sqrt(INTER)).bfloat16()
    w_gu = (torch.randn(2 * INTER, HIDDEN, generator=gen, device=DEV) / math.sqrt(HIDDEN)).bfloat16()
    positions = torch.empty(4, 1, dtype=torch.int64, device=DEV)
    qkv = torch.empty(4, 1, (H + 2 * HKV) * D, device=DEV, dtype=torch.bfloat16)
    write_index = torch.arange(4, device=DEV).view(4, 1) + 64
    k_pool, v_pool = (torch.zeros(3, 64, HKV, D, device=DEV, dtype=torch.bfloat16) for _ in range(2))
    cos, sin = _rope_tables(torch.arange(8192, device=DEV), D)
    split = GemvConfig(mode="dot", split_k=4, block_n=64)

    def step():
        normed, new_residual = add_rms_norm(x, residual, w_norm, 1e-5)
        gate_up = linear_small_m(normed, w_gu)
        act = silu_mul(gate_up)
        hidden = linear_small_m(act, w_down, config=split)
        q = qkv_rope_write(qkv, H, None, None, 1e-6, cos, sin, positions, write_index, k_pool, v_pool)
        return normed, new_residual, gate_up, act, hidden, q, rms_norm(x, w_norm, 1e-5)

    for t in (x, residual, qkv):
        t.copy_(torch.randn(t.shape, generator=gen, device=DEV))
    positions.copy_(torch.randint(0, 8192, positions.shape, generator=gen, device=DEV))
    graph, outs = capture(step)
    for replay in range(2):
        for t in (x, residual, qkv):
            t.copy_(torch.randn(t.shape, generator=gen, device=DEV))
        positions.copy_(torch.randint(0, 8192, positions.shape, generator=gen, device=DEV))
        graph.replay()
        torch.cuda.synchronize()
        normed, new_residual, gate_up, act, hidden, roped, plain = outs
        want_residual = residual + x
        assert torch.equal(new_residual, want_residual), f"replay {replay}: add_rms_norm residual"
        _assert_close(f"replay {replay}: add_rms_norm", normed, layers.rms_norm(want_residual, w_norm, 1e-5))
        _assert_close(f"replay {replay}: rms_norm", plain, layers.rms_norm(x, w_norm, 1e-5))
        want_k, want_v = torch.zeros_like(k_pool), torch.zeros_like(v_pool)
        want_q = decoder.qkv_rope_write(qkv, H, None, None, 1e-6, cos, sin, positions, write_index, want_k, want_v)
        assert torch.equal(roped, want_q) and torch.equal(k_pool, want_k) and torch.equal(v_pool, want_v), \
            f"replay {replay}: qkv_rope_write"
        _check_linear(f"replay {replay}: gate_up (M=4)", gate_up, normed, w_gu)
        _assert_close(f"replay {replay}: silu_mul", act, layers.silu_mul(gate_up))
        _check_linear(f"replay {replay}: down (M=4, split_k=4)", hidden, act, w_down)


def test_linear_silu_and_float_logits_match_unfused():
    """The gate/up GEMV's SiLU-mul epilogue and the float32 logits are bit-identical to the
    unfused launches at the Llama-3-8B shapes (same accumulation, same rounding points)."""
    gen = torch.Generator(device=DEV).manual_seed(8)
    w = (torch.randn(2 * INTER, HIDDEN, generator=gen, device=DEV) / math.sqrt(HIDDEN)).bfloat16()
    head = (torch.randn(VOCAB, HIDDEN, generator=gen, device=DEV) / math.sqrt(HIDDEN)).bfloat16()
    for m in (1, 2, 8):
        x = torch.randn(m, HIDDEN, generator=gen, device=DEV).bfloat16()
        same = gemv.default_config(m, *w.shape, DEV, gemv.EPILOGUE_GLU)  # the same accumulation order
        assert torch.equal(linear_silu(x, w), silu_mul(linear_small_m(x, w, config=same))), f"linear_silu M={m}"
        assert torch.equal(linear_float(x, head), linear_small_m(x, head).float()), f"linear_float M={m}"
    x = torch.randn(16, HIDDEN, generator=gen, device=DEV).bfloat16()  # cuBLAS path
    assert torch.equal(linear_silu(x, w), silu_mul(F.linear(x, w)))


@pytest.mark.parametrize("b", [1, 2, 8])
def test_linear_qkv_rope_matches_unfused(b):
    """The qkv GEMV with the RoPE / K/V scatter epilogue against linear_small_m + qkv_rope_write
    at the Llama-3-8B shape, in a graph: within an ulp (the fused kernel accumulates without
    multiply-add contraction), k and v written only at the write indices."""
    gen = torch.Generator(device=DEV).manual_seed(30 + b)
    w = (torch.randn((H + 2 * HKV) * D, HIDDEN, generator=gen, device=DEV) / math.sqrt(HIDDEN)).bfloat16()
    x = torch.randn(b, 1, HIDDEN, generator=gen, device=DEV).bfloat16()
    cos, sin = _rope_tables(torch.arange(8192, device=DEV), D)
    positions = torch.randint(0, 8192, (b, 1), generator=gen, device=DEV)
    write_index = (torch.randperm(4 * 64, generator=gen, device=DEV)[:b] + 64).view(b, 1)
    pools = [torch.zeros(5, 64, HKV, D, device=DEV, dtype=torch.bfloat16) for _ in range(2)]
    want_pools = [p.clone() for p in pools]
    graph, q = capture(lambda: linear_qkv_rope_write(x, w, None, H, None, None, 1e-5, cos, sin, positions,
                                                     write_index, *pools))
    graph.replay()
    torch.cuda.synchronize()
    want_q = qkv_rope_write(linear_small_m(x, w), H, None, None, 1e-5, cos, sin, positions, write_index, *want_pools)
    _assert_close(f"linear_qkv_rope_write B={b} q", q, want_q)
    for name, pool, want in zip("kv", pools, want_pools):
        written = want.abs().sum(-1) > 0
        assert torch.equal(pool.abs().sum(-1) > 0, written), f"B={b}: {name} written at other slots"
        _assert_close(f"linear_qkv_rope_write B={b} {name}", pool[written], want[written])


@pytest.mark.parametrize("pdl", ["on", "off"])
def test_gemv_chain_in_graph(pdl, monkeypatch):
    """Dependent GEMVs, with and without programmatic dependent launch, in one graph.

    Each layer reads the previous layer's output, with a torch op in between, so a
    kernel reading x before its grid dependency would see stale or half-written
    activations on some replay.
    """
    monkeypatch.setattr(_common, "pdl_mode", pdl)
    gen = torch.Generator(device=DEV).manual_seed(7)
    ws = [(torch.randn(4096, 4096, generator=gen, device=DEV) / 64).bfloat16() for _ in range(6)]
    x = torch.empty(2, 4096, device=DEV, dtype=torch.bfloat16)
    configs = [GemvConfig(mode="swap", block_n=32, block_k=256, num_stages=5),
               GemvConfig(mode="dot", block_n=64, block_k=128, num_stages=4)]

    def chain():
        h = x
        for i, w in enumerate(ws):
            h = linear_small_m(h, w, config=configs[i % 2])
            if i == 2:
                h = h * 0.5  # a kernel without PDL in the middle of the chain
        return h

    x.copy_(torch.randn(x.shape, generator=gen, device=DEV))
    graph, out = capture(chain)
    for replay in range(3):
        x.copy_(torch.randn(x.shape, generator=gen, device=DEV))
        graph.replay()
        torch.cuda.synchronize()
        want = x.float()
        for i, w in enumerate(ws):
            want = (want.bfloat16().float() @ w.float().t())
            if i == 2:
                want = want.bfloat16().float() * 0.5
        err = float((out.float() - want).norm() / want.norm())
        assert err <= 2e-2, f"GEMV chain (PDL {pdl}) replay {replay}: relative L2 error {err:.2e} (allowed 2e-2)"



# Wide rows with K split and the last program of each tile reducing (GemvConfig.last_reduces):
# the fused epilogues on a split product, the ticket counters shared by the launches of a graph.
SPLIT_TILES = {(HIDDEN, HIDDEN): {"mode": "swap", "block_n": 128, "block_k": 64, "num_stages": 6, "split_k": 4,
                                  "last_reduces": True},
               (HIDDEN, INTER): {"mode": "swap", "block_n": 128, "block_k": 64, "num_stages": 6, "split_k": 8,
                                 "last_reduces": True, "pdl": False},
               (2 * INTER, HIDDEN): {"split_k": 2, "last_reduces": True},
               (VOCAB, HIDDEN): {"split_k": 2, "last_reduces": True}}


@pytest.mark.parametrize("m, tiles", [(1, {}), (4, {}), (64, SPLIT_TILES)], ids=["1", "4", "64-split"])
def test_fused_norms_and_residual_adds_in_graph(m, tiles, monkeypatch):
    """One decoder layer's small-batch chain with the residual adds in the o and down GEMVs
    and the norms inside the next GEMVs (linear_add_rms_norm -> NormedRows), in a graph,
    replayed on new inputs: within bf16 rounding of the torch composite."""
    monkeypatch.setattr(gemv, "WIDE_ROW_OVERRIDES", tiles)
    monkeypatch.setattr(gemv, "ROUTED_ROWS", ((1, 64),))
    gen = torch.Generator(device=DEV).manual_seed(40 + m)

    def weight(n, k):
        return (torch.randn(n, k, generator=gen, device=DEV) / math.sqrt(k)).bfloat16()

    w_o, w_gate_up, w_down, head = weight(HIDDEN, HIDDEN), weight(2 * INTER, HIDDEN), weight(HIDDEN, INTER), \
        weight(VOCAB, HIDDEN)
    g_mlp, g_final = [(1 + torch.randn(HIDDEN, generator=gen, device=DEV) / 4).bfloat16() for _ in range(2)]
    attn = torch.empty(m, 1, HIDDEN, device=DEV, dtype=torch.bfloat16)
    residual = torch.empty_like(attn)

    def chain(ops):
        y, h = ops.linear_add_rms_norm(attn, w_o, residual, g_mlp, 1e-5)
        y, h = ops.linear_add_rms_norm(ops.linear_silu(y, w_gate_up), w_down, h, g_final, 1e-5)
        return h, ops.linear_float(y, head)

    fused = decoder.cuda_ops()
    assert isinstance(fused.linear_add_rms_norm(attn, w_o, residual, g_mlp, 1e-5)[0], kernels.NormedRows), \
        "batch <= 8 norms must be left to the next GEMV"
    graph, (out_h, out_logits) = capture(lambda: chain(fused))
    for replay in range(3):
        attn.copy_(torch.randn(attn.shape, generator=gen, device=DEV))
        residual.copy_(torch.randn(residual.shape, generator=gen, device=DEV) * 4)
        graph.replay()
        torch.cuda.synchronize()
        want_h, want_logits = chain(decoder.DecoderOps())
        for label, got, want in (("hidden", out_h, want_h), ("logits", out_logits, want_logits)):
            err = float((got.float() - want.float()).norm() / want.float().norm())
            assert err <= 1e-2, f"fused norms M={m} replay {replay} {label}: relative L2 error {err:.2e}"
    assert all(int(t.abs().sum()) == 0 for t in gemv.ticket_counters()), "split tickets left set"
