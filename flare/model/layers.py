"""Elementwise building blocks shared by every decoder family.

Each function is shape-static and free of data-dependent Python control flow,
so the same code runs eagerly on the CPU and inside captured CUDA graphs.
"""

from __future__ import annotations

import math

import torch

from .spec import ModelSpec


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm computed in float32, scaled in the weight dtype (as Hugging Face does)."""
    dtype = x.dtype
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(dtype)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) * up over the fused [..., 2*I] projection."""
    gate, up = gate_up.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


def rope_inv_freq(spec: ModelSpec) -> torch.Tensor:
    """Inverse frequencies [D/2] in float32, with Llama 3 scaling when configured."""
    d = spec.head_dim
    inv_freq = 1.0 / (spec.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    s = spec.rope_scaling
    if s is None:
        return inv_freq
    # Llama 3.1 frequency-dependent scaling: long wavelengths slow down by `factor`,
    # short ones stay, the band between is interpolated.
    low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
    high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor)
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


def rope_table(spec: ModelSpec, max_positions: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables [max_positions, D] in float32 (the two halves repeat)."""
    inv_freq = rope_inv_freq(spec).to(device)
    pos = torch.arange(max_positions, device=device, dtype=torch.float32)
    freqs = torch.outer(pos, inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE as transformers computes it. x: [..., heads, D]; cos/sin: [..., D].

    The float32 tables are cast to x's dtype and every product and the sum round to
    it, so in bf16 the rotated values are bit-identical to transformers' (a float32
    rotation rounded once would differ from it by an ulp in a few percent of them).
    """
    cos = cos.to(x.dtype).unsqueeze(-2)
    sin = sin.to(x.dtype).unsqueeze(-2)
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin
