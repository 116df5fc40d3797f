"""The decoder forward pass over the paged KV cache.

One class serves Llama, Qwen2 (qkv bias) and Qwen3 (q/k RMSNorm). Weights are in
the runtime layout of :mod:`flare.model.checkpoint`. ``forward`` has static
shapes for a given (B, Q, Pmax) and no data-dependent Python control flow, so it
runs eagerly on the CPU and is captured into CUDA graphs unchanged; only the
attention function is swapped for a kernel on the GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import torch
import torch.nn.functional as F

from .attention import AttentionBatch, KVCache, paged_attention_reference, write_kv
from .layers import apply_rope, rms_norm, rope_table, silu_mul
from .spec import ModelSpec

AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, AttentionBatch, float], torch.Tensor]


def add_rms_norm(x: torch.Tensor | None, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``residual += x`` (x None: nothing pending); -> ``(rms_norm(residual), residual)``."""
    if x is not None:
        residual = residual + x
    return rms_norm(residual, weight, eps), residual


def linear_residual(x: torch.Tensor, w: torch.Tensor,
                    residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A sublayer's output projection into the residual stream: -> ``(residual, pending)``
    with ``residual + pending`` the new stream. Here the sum is left pending for the next
    :func:`add_rms_norm`; the small-batch GEMV adds it itself (pending None)."""
    return residual, F.linear(x, w)


def linear_silu(x: torch.Tensor, gate_up: torch.Tensor) -> torch.Tensor:
    """The MLP's first half: ``silu(gate) * up`` of the fused ``[2I, hidden]`` projection."""
    return silu_mul(F.linear(x, gate_up))


def linear_float(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Logits: the projection in the model's dtype, returned as float32."""
    return F.linear(x, w).float()


def qkv_rope_write(qkv: torch.Tensor, num_heads: int, q_norm: torch.Tensor | None, k_norm: torch.Tensor | None,
                   eps: float, cos_table: torch.Tensor, sin_table: torch.Tensor, positions: torch.Tensor,
                   write_index: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor) -> torch.Tensor:
    """Everything between the qkv projection and attention, for one layer.

    Splits the fused projection ``[B, Q, (H + 2*Hkv)*D]``, applies the per-head q/k
    RMSNorm when the family has one, rotates q and k at ``positions`` with the
    ``[max_positions, D]`` tables, scatters k and v into the page pools at
    ``write_index`` and returns the rotated queries ``[B, Q, H, D]``.
    """
    b, nq, _ = qkv.shape
    hkv, d = k_pool.shape[2], k_pool.shape[3]
    q, k, v = qkv.split([num_heads * d, hkv * d, hkv * d], dim=-1)
    q = q.reshape(b, nq, num_heads, d)
    k = k.reshape(b, nq, hkv, d)
    v = v.reshape(b, nq, hkv, d)
    if q_norm is not None:
        q = rms_norm(q, q_norm, eps)
        k = rms_norm(k, k_norm, eps)
    cos, sin = cos_table[positions], sin_table[positions]  # [B, Q, D]
    q = apply_rope(q, cos, sin)
    write_kv(k_pool, v_pool, apply_rope(k, cos, sin), v, write_index)
    return q


def linear_qkv_rope_write(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, num_heads: int,
                          q_norm: torch.Tensor | None, k_norm: torch.Tensor | None, eps: float,
                          cos_table: torch.Tensor, sin_table: torch.Tensor, positions: torch.Tensor,
                          write_index: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor) -> torch.Tensor:
    """The attention block's input side: the fused qkv projection, then :func:`qkv_rope_write`."""
    return qkv_rope_write(F.linear(x, w, bias), num_heads, q_norm, k_norm, eps, cos_table, sin_table, positions,
                          write_index, k_pool, v_pool)


@dataclass(frozen=True)
class DecoderOps:
    """The primitive operations of a forward pass; CUDA swaps in Triton kernels.

    On CUDA a norm whose rows the next small-batch linear takes returns a
    ``kernels.NormedRows`` (the GEMV normalises its input itself); only the linear
    slots receive a norm's output, and they accept it.
    """

    linear: Callable = F.linear
    linear_silu: Callable = linear_silu  # (x, gate_up) -> silu(gate) * up
    linear_float: Callable = linear_float  # (x, w) -> float32 F.linear(x, w)
    rms_norm: Callable = rms_norm
    add_rms_norm: Callable = add_rms_norm  # (x | None, residual, w, eps) -> (norm(residual + x), residual + x)
    linear_residual: Callable = linear_residual  # (x, w, residual) -> (residual, pending); see above
    linear_qkv_rope_write: Callable = linear_qkv_rope_write  # see linear_qkv_rope_write above
    attention: AttentionFn = paged_attention_reference


def cuda_ops() -> DecoderOps:
    """Triton kernels for attention and the fused elementwise work; small-batch GEMV linear."""
    from . import kernels

    return DecoderOps(linear=kernels.linear, linear_silu=kernels.linear_silu, linear_float=kernels.linear_float,
                      rms_norm=kernels.rms_norm_deferred, add_rms_norm=kernels.add_rms_norm_deferred,
                      linear_residual=kernels.linear_residual, linear_qkv_rope_write=kernels.linear_qkv_rope_write,
                      attention=kernels.paged_attention)


class Decoder:
    """Weights plus the forward pass. Holds no per-request state."""

    def __init__(self, spec: ModelSpec, weights: Mapping[str, torch.Tensor], *,
                 max_positions: int, ops: DecoderOps = DecoderOps()):
        self.spec = spec
        self.w = dict(weights)
        self.device = self.w["embed"].device
        self.dtype = self.w["embed"].dtype
        self.lm_head = self.w.get("lm_head", self.w["embed"])
        cos, sin = rope_table(spec, max_positions, self.device)
        self.rope_cos, self.rope_sin = cos, sin
        self.ops = ops
        self.scale = spec.head_dim ** -0.5
        self.layers = [self._layer_weights(i) for i in range(spec.num_layers)]

    def _layer_weights(self, i: int) -> dict[str, torch.Tensor | None]:
        p = f"layers.{i}."
        return {name: self.w.get(p + name) for name in
                ("attn_norm", "qkv", "qkv_bias", "q_norm", "k_norm", "o", "mlp_norm", "gate_up", "down")}

    def forward(self, tokens: torch.Tensor, batch: AttentionBatch, kv: KVCache,
                sample_index: torch.Tensor | None = None) -> torch.Tensor:
        """Run the decoder; returns the hidden state of each row's sampled token, before
        the final norm (:meth:`logits` applies it).

        tokens: [B, Q] int64; sample_index: [B] int64 (query index per row), or None for
        each row's last query. -> [B, hidden]
        """
        spec, ops = self.spec, self.ops
        b, nq = tokens.shape
        h, d = spec.num_heads, spec.head_dim
        eps = spec.rms_norm_eps
        # The residual stream is residual + pending; pending is None once a sublayer's
        # projection has added itself (linear_residual).
        residual, pending = F.embedding(tokens, self.w["embed"]), None  # [B, Q, hidden]
        for i, lw in enumerate(self.layers):
            y, residual = ops.add_rms_norm(pending, residual, lw["attn_norm"], eps)
            q = ops.linear_qkv_rope_write(y, lw["qkv"], lw["qkv_bias"], h, lw["q_norm"], lw["k_norm"], eps,
                                          self.rope_cos, self.rope_sin, batch.positions, batch.write_index,
                                          kv.k[i], kv.v[i])
            attn = ops.attention(q, kv.k[i], kv.v[i], batch, self.scale)
            residual, pending = ops.linear_residual(attn.reshape(b, nq, h * d), lw["o"], residual)
            y, residual = ops.add_rms_norm(pending, residual, lw["mlp_norm"], eps)
            residual, pending = ops.linear_residual(ops.linear_silu(y, lw["gate_up"]), lw["down"], residual)
        if sample_index is None:
            rows = slice(None), -1  # views: no gather kernel
        else:
            rows = torch.arange(b, device=residual.device), sample_index
        return residual[rows] if pending is None else residual[rows] + pending[rows]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., hidden] (from :meth:`forward`) -> float32 logits [..., V], through the final norm."""
        return self.ops.linear_float(self.ops.rms_norm(hidden, self.w["norm"], self.spec.rms_norm_eps), self.lm_head)
