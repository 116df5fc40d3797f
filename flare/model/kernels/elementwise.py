"""Fused elementwise kernels: RMSNorm, add + RMSNorm, rotate-half RoPE, SiLU-mul.

Each matches the torch function of the same name in :mod:`flare.model.layers`
including its rounding points (fp32 math, a cast to the activation dtype where
the reference casts), so on bf16 they agree with it to about one bf16 ulp. They
read strided inputs (a head slice of the fused qkv projection) without a copy
when the leading dimensions can be viewed as [outer, inner] rows, and always
write fresh contiguous outputs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import next_power_of_2, require, require_float, require_inner_contiguous, require_same_device

# Elements a norm program keeps in registers: whole rows, several at a time when short.
_NORM_TILE = 4096
_MAX_NORM_WIDTH = 65536
_SILU_BLOCK = 1024


@triton.jit
def _rms_norm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr,
    num_rows, inner, width, eps,
    s_xo, s_xi, s_ro, s_ri,
    HAS_RESIDUAL: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_N)
    row_ok = rows < num_rows
    col_ok = cols < width
    mask = row_ok[:, None] & col_ok[None, :]
    # Rows of a strided [outer, inner, width] view.
    outer = (rows // inner).to(tl.int64)
    within = rows % inner
    x = tl.load(x_ptr + (outer * s_xo + within * s_xi)[:, None] + cols[None, :], mask=mask, other=0.0)
    out_offs = rows.to(tl.int64)[:, None] * width + cols[None, :]
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + (outer * s_ro + within * s_ri)[:, None] + cols[None, :], mask=mask, other=0.0)
        # The reference adds in the activation dtype: round the sum before normalising.
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
        tl.store(res_out_ptr + out_offs, x, mask=mask)
    xf = x.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(xf * xf, axis=1) / width + eps)
    normed = (xf * rstd[:, None]).to(x.dtype).to(tl.float32)  # layers.rms_norm casts before the weight
    w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + out_offs, (normed * w[None, :]).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rope_kernel(
    x_ptr, cos_ptr, sin_ptr, out_ptr,
    inner, num_heads, half,
    s_xo, s_xi, s_xh, s_co, s_ci, s_so, s_si,
    BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr,
):
    token = tl.program_id(0)
    outer = token // inner
    within = token % inner
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    cols = tl.arange(0, BLOCK_HALF)
    col_ok = cols < half
    mask = (heads < num_heads)[:, None] & col_ok[None, :]
    x_row = x_ptr + outer.to(tl.int64) * s_xo + within * s_xi + heads[:, None] * s_xh + cols[None, :]
    x1 = tl.load(x_row, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_row + half, mask=mask, other=0.0).to(tl.float32)
    c_row = cos_ptr + outer.to(tl.int64) * s_co + within * s_ci + cols
    s_row = sin_ptr + outer.to(tl.int64) * s_so + within * s_si + cols
    c1 = tl.load(c_row, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    c2 = tl.load(c_row + half, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    s1 = tl.load(s_row, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    s2 = tl.load(s_row + half, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    # rotate_half(x) = [-x2, x1]
    out_row = out_ptr + (token.to(tl.int64) * num_heads + heads[:, None]) * (2 * half) + cols[None, :]
    tl.store(out_row, (x1 * c1 - x2 * s1).to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(out_row + half, (x2 * c2 + x1 * s2).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _silu_mul_kernel(
    gu_ptr, out_ptr, width, s_go,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < width
    gate = tl.load(gu_ptr + row * s_go + cols, mask=ok, other=0.0)
    up = tl.load(gu_ptr + row * s_go + width + cols, mask=ok, other=0.0)
    g = gate.to(tl.float32)
    # F.silu rounds to the activation dtype before the product, as the reference does.
    act = (g / (1.0 + tl.exp(-g))).to(gate.dtype).to(tl.float32)
    tl.store(out_ptr + row * width + cols, (act * up.to(tl.float32)).to(out_ptr.dtype.element_ty), mask=ok)


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


def _norm(kernel: str, x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
          eps: float) -> tuple[torch.Tensor, torch.Tensor | None]:
    require(x.dim() >= 1 and x.numel() > 0, kernel, f"x must be a non-empty tensor, got shape {tuple(x.shape)}")
    width = x.shape[-1]
    require(weight.dim() == 1 and weight.shape[0] == width, kernel,
            f"weight must be [{width}], got {tuple(weight.shape)}")
    require(width <= _MAX_NORM_WIDTH, kernel, f"width {width} is above the supported {_MAX_NORM_WIDTH}")
    require_float(kernel, "x", x)
    require_float(kernel, "weight", weight)
    require_inner_contiguous(kernel, "x", x)
    require(weight.is_contiguous(), kernel, "weight must be contiguous")
    tensors = {"x": x, "weight": weight}
    if residual is not None:
        require(residual.shape == x.shape and residual.dtype == x.dtype, kernel,
                f"residual must match x ({tuple(x.shape)}, {x.dtype}), got {tuple(residual.shape)}, {residual.dtype}")
        require_inner_contiguous(kernel, "residual", residual)
        tensors["residual"] = residual
    require_same_device(kernel, **tensors)
    x3 = _lead_view(x, 1)
    r3 = _lead_view(residual, 1) if residual is not None else x3
    num_rows = x3.shape[0] * x3.shape[1]
    out = torch.empty(x.shape, dtype=torch.promote_types(weight.dtype, x.dtype), device=x.device)
    res_out = torch.empty_like(x, memory_format=torch.contiguous_format) if residual is not None else out
    block_n = next_power_of_2(width)
    block_r = max(1, min(_NORM_TILE // block_n, next_power_of_2(num_rows)))
    _rms_norm_kernel[(triton.cdiv(num_rows, block_r),)](
        x3, r3, weight, out, res_out,
        num_rows, x3.shape[1], width, float(eps),
        x3.stride(0), x3.stride(1), r3.stride(0), r3.stride(1),
        HAS_RESIDUAL=residual is not None, BLOCK_R=block_r, BLOCK_N=block_n,
        num_warps=8 if block_n * block_r >= 4096 else 4,
    )
    return out, (res_out if residual is not None else None)


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


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE, as :func:`flare.model.layers.apply_rope`.

    x ``[..., H, D]``; cos/sin ``[..., D]`` (float32 tables gathered per position, with
    the same leading shape as x) -> ``[..., H, D]`` in x's dtype.
    """
    kernel = "apply_rope"
    require(x.dim() >= 2 and x.numel() > 0, kernel, f"x must be [..., H, D], got {tuple(x.shape)}")
    d = x.shape[-1]
    require(d % 2 == 0, kernel, f"head_dim must be even for rotate-half, got {d}")
    for name, t in (("cos", cos), ("sin", sin)):
        require(tuple(t.shape) == tuple(x.shape[:-2]) + (d,), kernel,
                f"{name} must be {tuple(x.shape[:-2]) + (d,)} (x's leading shape, D), got {tuple(t.shape)}")
        require_float(kernel, name, t)
        require_inner_contiguous(kernel, name, t)
    require_float(kernel, "x", x)
    require_inner_contiguous(kernel, "x", x)
    require_same_device(kernel, x=x, cos=cos, sin=sin)
    # [outer, inner, H, D] with inner the last leading dimension (1 when there is none).
    x4, c3, s3 = _lead_view(x, 2), _lead_view(cos, 1), _lead_view(sin, 1)
    num_tokens, inner, num_heads = x4.shape[0] * x4.shape[1], x4.shape[1], x4.shape[2]
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    block_half = next_power_of_2(d // 2)
    block_h = min(next_power_of_2(num_heads), max(1, 2048 // block_half))
    _rope_kernel[(num_tokens, triton.cdiv(num_heads, block_h))](
        x4, c3, s3, out,
        inner, num_heads, d // 2,
        x4.stride(0), x4.stride(1), x4.stride(2), c3.stride(0), c3.stride(1), s3.stride(0), s3.stride(1),
        BLOCK_H=block_h, BLOCK_HALF=block_half, num_warps=4,
    )
    return out


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
    _silu_mul_kernel[(rows.shape[0], triton.cdiv(width, block))](
        rows, out, width, rows.stride(0), BLOCK=block, num_warps=4,
    )
    return out


__all__ = ["rms_norm", "add_rms_norm", "apply_rope", "silu_mul"]
