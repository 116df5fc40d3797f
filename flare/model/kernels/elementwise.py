"""Fused elementwise kernels: RMSNorm, add + RMSNorm, SiLU-mul, and the whole
qkv-to-attention stretch of a layer (q/k norm, rotate-half RoPE, KV scatter) in one launch.

Each matches the torch function of the same name in :mod:`flare.model.layers`
including its rounding points (fp32 math, a cast to the activation dtype where
the reference casts). Two compiler defaults would break that and are turned off:
multiply-add contraction (``enable_fp_fusion=False``; with it LLVM turns a rounded
product followed by a sum into one bf16 FMA, which skips the product's rounding:
H200, 2026-11-30, 20% of RoPE outputs one ulp off transformers'), and approximate
exp / division / rsqrt (libdevice's and the correctly rounded division, the ones
torch's CUDA kernels call). A prefill chunk's norms take their variance from torch's
own reduction (see _norm); decode norms and Qwen3's per-head q/k norm sum in another
order than torch, which moves a bf16 result by an ulp only rarely. They
read strided inputs (a head slice of the fused qkv projection) without a copy
when the leading dimensions can be viewed as [outer, inner] rows, and always
write fresh contiguous outputs.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.language.extra import libdevice

from ._common import (
    next_power_of_2,
    pdl_level,
    pdl_options,
    require,
    require_float,
    require_inner_contiguous,
    require_same_device,
    wait_for_inputs,
)

# exp and rsqrt come from libdevice: torch's CUDA kernels call the CUDA math library's
# expf and rsqrtf, which libdevice holds. (Under the interpreter, tests/kernels'
# compatibility shim maps them to NumPy's, accurate anyway.)


@triton.jit
def silu(g):
    """F.silu of float32 ``g`` as torch's CUDA kernel computes it: x / (1 + exp(-x)), divided exactly."""
    return tl.math.div_rn(g, 1.0 + libdevice.exp(-g))


# Elements a norm program keeps in registers: whole rows, several at a time when short.
_NORM_TILE = 4096
_MAX_NORM_WIDTH = 65536
_SILU_BLOCK = 1024
NORM_WARPS_WIDE = 8  # warps of a norm program holding 4,096+ elements (tools/bench_step.py varies it)


@triton.jit
def _rms_norm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, var_ptr, tokens_ptr,
    num_rows, inner, width, inv_width, eps, vocab,
    s_xo, s_xi, s_ro, s_ri,
    HAS_RESIDUAL: tl.constexpr, HAS_VARIANCE: tl.constexpr, SQUARES_ONLY: tl.constexpr, GATHER: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, PDL: tl.constexpr,
):
    wait_for_inputs(PDL)
    # SQUARES_ONLY: the first half of a prefill norm (see _norm): the residual sum, if
    # any, and the fp32 squares into var_ptr ([rows, width]); nothing is normalised.
    # GATHER: row r is x_ptr's row tokens_ptr[r] (an embedding lookup, clamped into the
    # vocab), and the gathered rows also go to res_out_ptr.
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_N)
    row_ok = rows < num_rows
    col_ok = cols < width
    mask = row_ok[:, None] & col_ok[None, :]
    out_offs = rows.to(tl.int64)[:, None] * width + cols[None, :]
    if GATHER:
        token = tl.load(tokens_ptr + rows, mask=row_ok, other=0)
        token = tl.minimum(tl.maximum(token, 0), vocab - 1).to(tl.int64)
        x = tl.load(x_ptr + (token * s_xo)[:, None] + cols[None, :], mask=mask, other=0.0)
        tl.store(res_out_ptr + out_offs, x, mask=mask)
    else:
        # Rows of a strided [outer, inner, width] view.
        outer = (rows // inner).to(tl.int64)
        within = rows % inner
        x = tl.load(x_ptr + (outer * s_xo + within * s_xi)[:, None] + cols[None, :], mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + (outer * s_ro + within * s_ri)[:, None] + cols[None, :], mask=mask, other=0.0)
        # The reference adds in the activation dtype: round the sum before normalising.
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
        tl.store(res_out_ptr + out_offs, x, mask=mask)
    xf = x.to(tl.float32)
    if SQUARES_ONLY:
        tl.store(var_ptr + out_offs, xf * xf, mask=mask)
    else:
        if HAS_VARIANCE:  # the mean of squares, as torch reduced it
            rstd = libdevice.rsqrt(tl.load(var_ptr + rows, mask=row_ok, other=1.0) + eps)
        else:
            rstd = libdevice.rsqrt(tl.sum(xf * xf, axis=1) * inv_width + eps)
        normed = (xf * rstd[:, None]).to(x.dtype).to(tl.float32)  # layers.rms_norm casts before the weight
        w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        tl.store(out_ptr + out_offs, (normed * w[None, :]).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _fold_halves(v, n: tl.constexpr, BLOCK_R: tl.constexpr):
    """[BLOCK_R, n] -> [BLOCK_R, n / 2]: lane i plus lane i + n / 2."""
    lo, hi = tl.split(tl.permute(tl.reshape(v, (BLOCK_R, 2, n // 2)), (0, 2, 1)))
    return lo + hi


@triton.jit
def _rms_norm_ordered_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, var_ptr,
    num_rows, inner, width, factor, eps,
    s_xo, s_xi, s_ro, s_ri,
    HAS_RESIDUAL: tl.constexpr, VARIANCE_OUT: tl.constexpr, LANES: tl.constexpr, STEPS: tl.constexpr,
    FOLDS: tl.constexpr, BLOCK_R: tl.constexpr, PDL: tl.constexpr,
):
    """RMSNorm of a prefill chunk's rows with the mean of squares summed in the order of
    torch's CUDA reduction of ``x.float().pow(2).mean(-1)`` (see torch_reduce_lanes): LANES
    threads share a row, lane l reading 4-element vectors l, l + LANES, ... into four
    accumulators (one per vector element) combined left to right; then the lanes fold in
    halves (lane l plus lane l + n / 2) down to one, through shared memory and then the
    warp's shuffles. The sum times ``factor`` (1 / width as torch computes it) is the
    variance. A chunk of LANES vectors is one loop step."""
    wait_for_inputs(PDL)
    CHUNK: tl.constexpr = LANES * 4
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < num_rows
    outer = (rows // inner).to(tl.int64)
    within = rows % inner
    x_row = (outer * s_xo + within * s_xi)[:, None]
    r_row = (outer * s_ro + within * s_ri)[:, None]
    out_row = rows.to(tl.int64)[:, None] * width
    # Every chunk's loads are issued before the first sum waits on one (a load-then-add per
    # chunk left 32 memory latencies in a row: 48 us over 2,048 tokens, H200).
    xs = ()
    rs = ()
    for step in tl.static_range(STEPS):
        cols = step * CHUNK + tl.arange(0, CHUNK)
        mask = row_ok[:, None] & (cols < width)[None, :]
        xs = xs + (tl.load(x_ptr + x_row + cols[None, :], mask=mask, other=0.0),)
        if HAS_RESIDUAL:
            rs = rs + (tl.load(res_ptr + r_row + cols[None, :], mask=mask, other=0.0),)
    acc = tl.zeros((BLOCK_R, CHUNK), tl.float32)
    kept = ()  # the row's chunks (the residual sums), held for the normalisation
    for step in tl.static_range(STEPS):
        x = xs[step]
        if HAS_RESIDUAL:
            cols = step * CHUNK + tl.arange(0, CHUNK)
            mask = row_ok[:, None] & (cols < width)[None, :]
            # The reference adds in the activation dtype: round the sum before normalising.
            x = (x.to(tl.float32) + rs[step].to(tl.float32)).to(x.dtype)
            tl.store(res_out_ptr + out_row + cols[None, :], x, mask=mask)
        kept = kept + (x,)
        xf = x.to(tl.float32)
        acc += xf * xf  # masked columns add an exact 0: a lane past the row's end keeps its sum
    v01, v23 = tl.split(tl.reshape(acc, (BLOCK_R, LANES, 2, 2)))  # vector elements (0, 2) and (1, 3)
    v0, v2 = tl.split(v01)
    v1, v3 = tl.split(v23)
    lane = ((v0 + v1) + v2) + v3
    for i in tl.static_range(FOLDS):  # shared memory down to a warp, then its shuffles: halves each time
        lane = _fold_halves(lane, LANES >> i, BLOCK_R)
    variance = tl.reshape(lane, (BLOCK_R,)) * factor
    if VARIANCE_OUT:
        tl.store(var_ptr + rows, variance, mask=row_ok)
    rstd = libdevice.rsqrt(variance + eps)
    for step in tl.static_range(STEPS):
        cols = step * CHUNK + tl.arange(0, CHUNK)
        col_ok = cols < width
        mask = row_ok[:, None] & col_ok[None, :]
        x = kept[step]
        normed = (x.to(tl.float32) * rstd[:, None]).to(x.dtype).to(tl.float32)  # rounded before the weight
        w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        tl.store(out_ptr + out_row + cols[None, :], (normed * w[None, :]).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rotate_half(x1, x2, c1, c2, s1, s2, dtype: tl.constexpr):
    """``x * cos + rotate_half(x) * sin`` with rotate_half(x) = [-x2, x1], rounded as
    layers.apply_rope (transformers) rounds: the float32 tables to ``dtype``, then each
    product and each sum. x1/x2 are float32 holding ``dtype`` values.
    """
    c1 = c1.to(dtype).to(tl.float32)
    c2 = c2.to(dtype).to(tl.float32)
    s1 = s1.to(dtype).to(tl.float32)
    s2 = s2.to(dtype).to(tl.float32)
    a1 = (x1 * c1).to(dtype).to(tl.float32)
    b1 = (x2 * s1).to(dtype).to(tl.float32)
    a2 = (x2 * c2).to(dtype).to(tl.float32)
    b2 = (x1 * s2).to(dtype).to(tl.float32)
    return (a1 - b1).to(dtype), (a2 + b2).to(dtype)


@triton.jit
def _silu_mul_kernel(
    gu_ptr, out_ptr, width, s_go,
    BLOCK: tl.constexpr, PDL: tl.constexpr,
):
    wait_for_inputs(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < width
    gate = tl.load(gu_ptr + row * s_go + cols, mask=ok, other=0.0)
    up = tl.load(gu_ptr + row * s_go + width + cols, mask=ok, other=0.0)
    g = gate.to(tl.float32)
    # F.silu rounds to the activation dtype before the product, as the reference does.
    act = silu(g).to(gate.dtype).to(tl.float32)
    tl.store(out_ptr + row * width + cols, (act * up.to(tl.float32)).to(out_ptr.dtype.element_ty), mask=ok)


# Steps of at least this many tokens give each qkv_rope_write program this many tokens.
QKV_MANY_TOKENS = 256
QKV_TOKENS_PER_PROGRAM = 8


@triton.jit
def _qkv_rope_write_kernel(
    qkv_ptr, qn_ptr, kn_ptr, cos_ptr, sin_ptr, pos_ptr, widx_ptr, q_ptr, k_pool_ptr, v_pool_ptr,
    inner, num_heads, num_kv, half, eps, num_tokens,
    s_xo, s_xi, s_cos, s_sin,
    HAS_NORM: tl.constexpr, BLOCK_HALF: tl.constexpr, TOKENS: tl.constexpr, PDL: tl.constexpr,
):
    wait_for_inputs(PDL)
    # One program per (TOKENS tokens, head) over the q heads then the k heads; a k program
    # also moves the matching v head. Large prefill steps take several tokens a program: one
    # a program left a 2,048-token step 82k one-warp programs (3.2 ms of 54 on the H200).
    head = tl.program_id(1)
    for i in range(TOKENS):
        token = tl.program_id(0) * TOKENS + i
        if token < num_tokens:
            _qkv_rope_write_token(qkv_ptr, qn_ptr, kn_ptr, cos_ptr, sin_ptr, pos_ptr, widx_ptr, q_ptr, k_pool_ptr,
                                  v_pool_ptr, inner, num_heads, num_kv, half, eps, s_xo, s_xi, s_cos, s_sin,
                                  token, head, HAS_NORM, BLOCK_HALF)


@triton.jit
def _qkv_rope_write_token(
    qkv_ptr, qn_ptr, kn_ptr, cos_ptr, sin_ptr, pos_ptr, widx_ptr, q_ptr, k_pool_ptr, v_pool_ptr,
    inner, num_heads, num_kv, half, eps, s_xo, s_xi, s_cos, s_sin, token, head,
    HAS_NORM: tl.constexpr, BLOCK_HALF: tl.constexpr,
):
    cols = tl.arange(0, BLOCK_HALF)
    ok = cols < half
    d = 2 * half
    row = qkv_ptr + (token // inner).to(tl.int64) * s_xo + (token % inner) * s_xi
    x1 = tl.load(row + head * d + cols, mask=ok, other=0.0)
    x2 = tl.load(row + head * d + half + cols, mask=ok, other=0.0)
    dtype = x1.dtype
    x1 = x1.to(tl.float32)
    x2 = x2.to(tl.float32)
    is_q = head < num_heads
    if HAS_NORM:
        # layers.rms_norm: fp32 statistics, cast to the activation dtype, then the weight.
        rstd = libdevice.rsqrt((tl.sum(x1 * x1, axis=0) + tl.sum(x2 * x2, axis=0)) / d + eps)
        if is_q:
            w1 = tl.load(qn_ptr + cols, mask=ok, other=0.0).to(tl.float32)
            w2 = tl.load(qn_ptr + half + cols, mask=ok, other=0.0).to(tl.float32)
        else:
            w1 = tl.load(kn_ptr + cols, mask=ok, other=0.0).to(tl.float32)
            w2 = tl.load(kn_ptr + half + cols, mask=ok, other=0.0).to(tl.float32)
        x1 = ((x1 * rstd).to(dtype).to(tl.float32) * w1).to(dtype).to(tl.float32)
        x2 = ((x2 * rstd).to(dtype).to(tl.float32) * w2).to(dtype).to(tl.float32)
    pos = tl.load(pos_ptr + token)
    c_row = cos_ptr + pos * s_cos
    s_row = sin_ptr + pos * s_sin
    c1 = tl.load(c_row + cols, mask=ok, other=0.0)
    c2 = tl.load(c_row + half + cols, mask=ok, other=0.0)
    s1 = tl.load(s_row + cols, mask=ok, other=0.0)
    s2 = tl.load(s_row + half + cols, mask=ok, other=0.0)
    out1, out2 = _rotate_half(x1, x2, c1, c2, s1, s2, dtype)
    # (Names differ between the branches: compiled Triton needs a variable bound in both
    # branches of a runtime `if` to have one type.)
    if is_q:
        q_dst = q_ptr + (token.to(tl.int64) * num_heads + head) * d
        tl.store(q_dst + cols, out1, mask=ok)
        tl.store(q_dst + half + cols, out2, mask=ok)
    else:
        kv_head = head - num_heads
        slot = tl.load(widx_ptr + token)
        kv_offset = (slot * num_kv + kv_head) * d
        tl.store(k_pool_ptr + kv_offset + cols, out1, mask=ok)
        tl.store(k_pool_ptr + kv_offset + half + cols, out2, mask=ok)
        v_src = row + (num_heads + num_kv + kv_head) * d
        tl.store(v_pool_ptr + kv_offset + cols, tl.load(v_src + cols, mask=ok, other=0.0), mask=ok)
        tl.store(v_pool_ptr + kv_offset + half + cols, tl.load(v_src + half + cols, mask=ok, other=0.0), mask=ok)


def _lead_view(t: torch.Tensor, keep: int) -> torch.Tensor:
    """``t`` as ``[outer, inner, *last keep dims]``, inner being the last leading dimension.

    A view when the strides allow (a head slice of the fused qkv output does), else a
    contiguous copy.
    """
    lead, trail = t.shape[:t.dim() - keep], t.shape[t.dim() - keep:]
    inner = lead[-1] if lead else 1
    try:
        return t.view(-1, inner, *trail)
    except RuntimeError:
        return t.contiguous().view(-1, inner, *trail)


def is_prefill_chunk(x: torch.Tensor) -> bool:
    """The decoder's activations are [B, Q, N]; more than one query token is a prefill chunk."""
    return x.dim() >= 3 and x.shape[-2] > 1


def _check_norm_weight(kernel: str, weight: torch.Tensor, width: int) -> None:
    """A norm weight for rows of ``width``: a contiguous float [width], width within the tile limit."""
    require(weight.dim() == 1 and weight.shape[0] == width, kernel,
            f"weight must be [{width}], got {tuple(weight.shape)}")
    require(width <= _MAX_NORM_WIDTH, kernel, f"width {width} is above the supported {_MAX_NORM_WIDTH}")
    require_float(kernel, "weight", weight)
    require(weight.is_contiguous(), kernel, "weight must be contiguous")


def _norm(kernel: str, x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
          eps: float) -> tuple[torch.Tensor, torch.Tensor | None]:
    require(x.dim() >= 1 and x.numel() > 0, kernel, f"x must be a non-empty tensor, got shape {tuple(x.shape)}")
    width = x.shape[-1]
    _check_norm_weight(kernel, weight, width)
    require_float(kernel, "x", x)
    require_inner_contiguous(kernel, "x", x)
    tensors = {"x": x, "weight": weight}
    if residual is not None:
        require(residual.shape == x.shape and residual.dtype == x.dtype, kernel,
                f"residual must match x ({tuple(x.shape)}, {x.dtype}), got {tuple(residual.shape)}, {residual.dtype}")
        require_inner_contiguous(kernel, "residual", residual)
        tensors["residual"] = residual
    require_same_device(kernel, **tensors)
    num_rows = x.numel() // width
    out = torch.empty(x.shape, dtype=torch.promote_types(weight.dtype, x.dtype), device=x.device)
    res_out = torch.empty_like(x, memory_format=torch.contiguous_format) if residual is not None else None

    def launch(src: torch.Tensor, res: torch.Tensor | None, *, variance: torch.Tensor | None = None,
               squares: torch.Tensor | None = None) -> None:
        """Normalise src (+ res), with ``variance`` per row when given; or, given ``squares``,
        only write the sum and its fp32 squares there."""
        x3 = _lead_view(src, 1)
        r3 = _lead_view(res, 1) if res is not None else x3
        stats = squares if squares is not None else variance
        _launch_norm(x3, r3, weight, out, res_out if res_out is not None else out, stats if stats is not None else out,
                     out, num_rows, x3.shape[1], eps, 0, x3.stride(0), x3.stride(1), r3.stride(0), r3.stride(1),
                     has_residual=res is not None, has_variance=variance is not None, squares_only=squares is not None,
                     gather=False)

    if not is_prefill_chunk(x):
        launch(x, residual)
        return out, res_out
    # A prefill chunk's variance must be the one transformers' RMSNorm gets from torch's
    # reduction of x.float().pow(2): reduced in another order, a few rows' fp32 variance
    # moves by an ulp; that flips a bf16 rounding in about 1e-5 of the elements, enough to
    # change 2.5% of the teacher-forced argmaxes of a random-weight Llama-3-8B (H200,
    # 2026-11-30). Decode steps ([B, 1, N]) keep the one-pass kernel (tl.sum's order).
    lanes = torch_reduce_lanes(num_rows, width)
    if lanes:
        x3 = _lead_view(x, 1)
        r3 = _lead_view(residual, 1) if residual is not None else x3
        _launch_ordered_norm(x3, r3, weight, out, res_out if res_out is not None else out, None, num_rows, lanes, eps,
                             has_residual=residual is not None)
        return out, res_out
    # Launch shapes the ordered kernel does not model: the kernel writes the residual sum
    # and its fp32 squares, torch reduces them, and the kernel normalises with that.
    squares = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    launch(x, residual, squares=squares)
    launch(res_out if res_out is not None else x, None, variance=squares.mean(-1))
    return out, res_out


# Rows a program of the ordered prefill norm takes (tools/bench_kernels.py --only elementwise).
NORM_ORDERED_ROWS = 1
NORM_ORDERED_WARPS = 0  # 0: a warp per 256 elements of a chunk's tile
_REDUCE_THREADS = 512  # torch's Reduce.cuh: the most threads of a reduction block
_REDUCE_VEC = 4  # fp32 elements a thread loads at once when reducing the fastest dimension


def _last_pow2(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


def torch_reduce_lanes(rows: int, width: int) -> int:
    """Threads torch's CUDA reduction gives each row of ``x.mean(-1)`` over a contiguous fp32
    ``[rows, width]``, or 0 where its order is not the one _rms_norm_ordered_kernel follows.

    Facts of torch's reduce launch (aten/src/ATen/native/cuda/Reduce.cuh, setReduceConfig;
    the same through torch 2.11, and checked bit for bit against torch on the H200 by
    tests/gpu/test_kernels.py): rows wider than 128 are read in 4-element vectors, so a
    row is width / 4 vectors; a block is at most 512 threads, min(32, vectors rounded down
    to a power of two) across a row first, then up to 16 rows (the row count rounded down
    to a power of two), then the row's threads widened to fill 512. A thread's share of
    the row is not split further (across warps or blocks) while it stays below 16 x the
    block's rows and below 256 values; past that the order changes, and 0 is returned.
    """
    if width <= 128 or width % _REDUCE_VEC:
        return 0
    vectors = width // _REDUCE_VEC
    across = _REDUCE_THREADS if vectors >= _REDUCE_THREADS else _last_pow2(vectors)
    down = _REDUCE_THREADS if rows >= _REDUCE_THREADS else _last_pow2(rows)
    height = min(down, _REDUCE_THREADS // min(across, 32))
    lanes = min(across, _REDUCE_THREADS // height)
    per_thread = -(-width // lanes)
    if per_thread >= height * 16 or per_thread >= 256:
        return 0
    return lanes


def _launch_ordered_norm(x, res, weight, out, res_out, variance, num_rows: int, lanes: int, eps: float, *,
                         has_residual: bool) -> None:
    """One _rms_norm_ordered_kernel launch over ``num_rows`` rows of [outer, inner, width]
    views ``x`` and ``res``; ``variance`` (fp32 [rows]) also receives each row's variance."""
    width = weight.shape[0]
    chunk = lanes * _REDUCE_VEC
    block_r = max(1, min(NORM_ORDERED_ROWS, next_power_of_2(num_rows)))
    factor = float(np.float32(num_rows) / np.float32(num_rows * width))  # torch's MeanOps factor, in fp32
    pdl = pdl_level(out)
    _rms_norm_ordered_kernel[(triton.cdiv(num_rows, block_r),)](
        x, res, weight, out, res_out, variance if variance is not None else out,
        num_rows, x.shape[1], width, factor, float(eps),
        x.stride(0), x.stride(1), res.stride(0), res.stride(1),
        HAS_RESIDUAL=has_residual, VARIANCE_OUT=variance is not None, LANES=lanes, STEPS=-(-width // chunk),
        FOLDS=lanes.bit_length() - 1, BLOCK_R=block_r, PDL=pdl,
        num_warps=NORM_ORDERED_WARPS or max(1, min(8, block_r * chunk // 256)), enable_fp_fusion=False,
        **pdl_options(pdl),
    )


def _launch_norm(x, res, weight, out, res_out, stats, tokens, num_rows: int, inner: int, eps: float, vocab: int,
                 *strides: int, has_residual: bool, has_variance: bool, squares_only: bool, gather: bool,
                 chain_start: bool = False) -> None:
    """One _rms_norm_kernel launch over ``num_rows`` rows of ``width = weight.shape[0]``.

    ``chain_start``: launched without programmatic dependence (it starts once everything
    before it has finished and its writes are visible), though the kernels after it may
    still start early.
    """
    width = weight.shape[0]
    block_n = next_power_of_2(width)
    block_r = max(1, min(_NORM_TILE // block_n, next_power_of_2(num_rows)))
    pdl = pdl_level(out)
    _rms_norm_kernel[(triton.cdiv(num_rows, block_r),)](
        x, res, weight, out, res_out, stats, tokens,
        num_rows, inner, width, 1.0 / width, float(eps), vocab, *strides,
        HAS_RESIDUAL=has_residual, HAS_VARIANCE=has_variance, SQUARES_ONLY=squares_only, GATHER=gather,
        BLOCK_R=block_r, BLOCK_N=block_n, PDL=pdl,
        num_warps=NORM_WARPS_WIDE if block_n * block_r >= 4096 else 4, enable_fp_fusion=False,
        **pdl_options(0 if chain_start else pdl),
    )


def embed_rms_norm(tokens: torch.Tensor, table: torch.Tensor, weight: torch.Tensor,
                   eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``x = F.embedding(tokens, table)``; returns ``(rms_norm(x, weight, eps), x)``.

    A decode step's tokens ([B, 1]) take one launch: the norm kernel gathers the rows
    itself (token ids clamped into the table) and reduces exactly as :func:`rms_norm`
    does for them. A prefill chunk's ([B, Q > 1]) embedding is torch's gather, then
    :func:`rms_norm` (which takes the variance from torch there).

    The decode launch starts a new chain of programmatically dependent launches: it
    waits for every kernel before it, as torch's gather does. The decode attention
    reads the step's metadata before its own wait (attention.paged_decode_attention),
    and this orders that metadata's writer (slots.decode_inputs, just before) ahead of
    the whole forward.
    """
    kernel = "embed_rms_norm"
    require(tokens.dim() == 2 and tokens.dtype in (torch.int64, torch.int32), kernel,
            f"tokens must be [B, Q] int64 or int32, got {tuple(tokens.shape)} {tokens.dtype}")
    require(table.dim() == 2 and table.stride(1) == 1, kernel,
            f"the table must be [V, N] with contiguous rows, got {tuple(table.shape)}")
    if tokens.shape[1] > 1:
        x = F.embedding(tokens, table)
        return rms_norm(x, weight, eps), x
    width = table.shape[1]
    _check_norm_weight(kernel, weight, width)
    require_float(kernel, "table", table)
    require_same_device(kernel, tokens=tokens, table=table, weight=weight)
    ids = tokens.contiguous()
    x = torch.empty((*tokens.shape, width), dtype=table.dtype, device=table.device)
    out = torch.empty(x.shape, dtype=torch.promote_types(weight.dtype, table.dtype), device=table.device)
    _launch_norm(table, table, weight, out, x, out, ids, ids.numel(), 1, eps, table.shape[0],
                 table.stride(0), 0, 0, 0, has_residual=False, has_variance=False, squares_only=False, gather=True,
                 chain_start=True)
    return out, x


def ordered_variance(x: torch.Tensor) -> torch.Tensor:
    """The fp32 variance (mean of squares) of each row of ``x`` [..., N] as the prefill
    norms compute it: ``x.float().pow(2).mean(-1)`` summed in torch's CUDA order. For
    checks against torch itself (tests/gpu); raises where that order is not modelled."""
    kernel = "ordered_variance"
    require(x.dim() >= 2 and x.numel() > 0, kernel, f"x must be a non-empty [..., N], got {tuple(x.shape)}")
    require_float(kernel, "x", x)
    require_inner_contiguous(kernel, "x", x)
    width = x.shape[-1]
    num_rows = x.numel() // width
    lanes = torch_reduce_lanes(num_rows, width)
    require(lanes > 0, kernel, f"torch's reduction order over {num_rows} rows of {width} is not modelled")
    weight = torch.ones(width, dtype=x.dtype, device=x.device)
    x3 = _lead_view(x, 1)
    variance = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
    out = torch.empty_like(x)
    _launch_ordered_norm(x3, x3, weight, out, out, variance, num_rows, lanes, 1e-6, has_residual=False)
    return variance


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension, as :func:`flare.model.layers.rms_norm`.

    x ``[..., N]`` (last dimension contiguous), weight ``[N]`` -> ``[..., N]`` in the
    promoted dtype of weight and x.
    """
    out, _ = _norm("rms_norm", x, None, weight, eps)
    return out


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``h = residual + x``; returns ``(rms_norm(h, weight, eps), h)`` from one pass over the data.

    Replaces the decoder's ``x = residual + sublayer; residual = x; y = rms_norm(x)``.
    """
    out, res = _norm("add_rms_norm", x, residual, weight, eps)
    assert res is not None
    return out, res


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` over the fused ``[..., 2I]`` projection -> ``[..., I]``."""
    kernel = "silu_mul"
    require(gate_up.dim() >= 1 and gate_up.numel() > 0 and gate_up.shape[-1] % 2 == 0, kernel,
            f"gate_up must be [..., 2I], got {tuple(gate_up.shape)}")
    require_float(kernel, "gate_up", gate_up)
    require_inner_contiguous(kernel, "gate_up", gate_up)
    width = gate_up.shape[-1] // 2
    rows = _lead_view(gate_up, 1).flatten(0, 1)
    out = torch.empty((*gate_up.shape[:-1], width), dtype=gate_up.dtype, device=gate_up.device)
    block = min(_SILU_BLOCK, next_power_of_2(width))
    pdl = pdl_level(gate_up)
    _silu_mul_kernel[(rows.shape[0], triton.cdiv(width, block))](
        rows, out, width, rows.stride(0), BLOCK=block, PDL=pdl, num_warps=4, enable_fp_fusion=False,
        **pdl_options(pdl),
    )
    return out


def check_rope_targets(kernel: str, x: torch.Tensor, cos_table: torch.Tensor, sin_table: torch.Tensor,
                       positions: torch.Tensor, write_index: torch.Tensor, k_pool: torch.Tensor,
                       v_pool: torch.Tensor) -> tuple[int, int]:
    """Checks shared by the launches that rotate q/k and scatter k/v for x ``[B, Q, ...]``
    (this module's qkv_rope_write and the qkv GEMV's epilogue); -> (Hkv, D)."""
    require(k_pool.dim() == 4 and k_pool.shape == v_pool.shape, kernel,
            f"k_pool and v_pool must be the same [pages, P, Hkv, D], got {tuple(k_pool.shape)} and "
            f"{tuple(v_pool.shape)}")
    hkv, d = k_pool.shape[2], k_pool.shape[3]
    require(d % 2 == 0, kernel, f"head_dim must be even, got {d}")
    for name, pool in (("k_pool", k_pool), ("v_pool", v_pool)):
        require(pool.dtype == x.dtype and pool.is_contiguous(), kernel,
                f"{name} must be contiguous {x.dtype}, got {pool.dtype} with strides {tuple(pool.stride())}")
    for name, table in (("cos_table", cos_table), ("sin_table", sin_table)):
        require(table.dim() == 2 and table.shape[1] == d and table.dtype == torch.float32 and table.stride(1) == 1,
                kernel, f"{name} must be float32 [positions, {d}], got {tuple(table.shape)} {table.dtype}")
    b, nq = x.shape[0], x.shape[1]
    for name, index in (("positions", positions), ("write_index", write_index)):
        require(tuple(index.shape) == (b, nq) and index.dtype == torch.int64, kernel,
                f"{name} must be int64 [{b}, {nq}], got {tuple(index.shape)} {index.dtype}")
    require_same_device(kernel, x=x, cos_table=cos_table, sin_table=sin_table, positions=positions,
                        write_index=write_index, k_pool=k_pool, v_pool=v_pool)
    return hkv, d


def qkv_rope_write(qkv: torch.Tensor, num_heads: int, q_norm: torch.Tensor | None, k_norm: torch.Tensor | None,
                   eps: float, cos_table: torch.Tensor, sin_table: torch.Tensor, positions: torch.Tensor,
                   write_index: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor) -> torch.Tensor:
    """:func:`flare.model.decoder.qkv_rope_write` in one launch.

    qkv ``[B, Q, (H + 2*Hkv)*D]``; q_norm/k_norm ``[D]`` or None; cos/sin tables
    ``[max_positions, D]`` float32; positions and write_index ``[B, Q]`` int64; pools
    ``[pages, P, Hkv, D]`` contiguous. Writes k and v into the pools and returns q
    ``[B, Q, H, D]``, rounded where the reference rounds.
    """
    kernel = "qkv_rope_write"
    require(qkv.dim() == 3 and qkv.numel() > 0, kernel, f"qkv must be [B, Q, width], got {tuple(qkv.shape)}")
    b, nq, width = qkv.shape
    hkv, d = check_rope_targets(kernel, qkv, cos_table, sin_table, positions, write_index, k_pool, v_pool)
    require(width == (num_heads + 2 * hkv) * d, kernel,
            f"qkv width {width} is not (H={num_heads} + 2*Hkv={hkv}) * D={d}")
    require((q_norm is None) == (k_norm is None), kernel, "q_norm and k_norm come together")
    if q_norm is not None:
        for name, w in (("q_norm", q_norm), ("k_norm", k_norm)):
            require(w.shape == (d,) and w.dtype == qkv.dtype and w.is_contiguous(), kernel,
                    f"{name} must be contiguous [{d}] {qkv.dtype}, got {tuple(w.shape)} {w.dtype}")
            require_same_device(kernel, qkv=qkv, **{name: w})
    require_float(kernel, "qkv", qkv)
    require_inner_contiguous(kernel, "qkv", qkv)
    x3 = _lead_view(qkv, 1)
    q = torch.empty((b, nq, num_heads, d), dtype=qkv.dtype, device=qkv.device)
    norm = q_norm if q_norm is not None else q
    pdl = pdl_level(qkv)
    tokens = b * nq
    per_program = QKV_TOKENS_PER_PROGRAM if tokens >= QKV_MANY_TOKENS else 1
    _qkv_rope_write_kernel[(triton.cdiv(tokens, per_program), num_heads + hkv)](
        x3, norm, k_norm if k_norm is not None else q, cos_table, sin_table,
        positions.reshape(-1), write_index.reshape(-1), q, k_pool, v_pool,
        x3.shape[1], num_heads, hkv, d // 2, float(eps), tokens,
        x3.stride(0), x3.stride(1), cos_table.stride(0), sin_table.stride(0),
        HAS_NORM=q_norm is not None, BLOCK_HALF=next_power_of_2(d // 2), TOKENS=per_program, PDL=pdl, num_warps=1,
        enable_fp_fusion=False, **pdl_options(pdl),
    )
    return q


__all__ = ["add_rms_norm", "check_rope_targets", "embed_rms_norm", "ordered_variance", "qkv_rope_write", "rms_norm",
           "silu", "silu_mul", "torch_reduce_lanes"]
