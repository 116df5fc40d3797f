"""The decoder forward pass over the paged KV cache.

One class serves every registered family (flare/model/architectures/): Llama,
Qwen2 (qkv bias) and Qwen3 (q/k RMSNorm), as the family's ``LayerFeatures`` say.
Weights are in the family's runtime layout (:mod:`flare.model.checkpoint`); every
projection the forward multiplies by is one of the layout's ``Linear`` entries,
the seam where tensor-parallel sharding plugs in. ``forward`` has static
shapes for a given (B, Q, Pmax) and no data-dependent Python control flow, so it
runs eagerly on the CPU and is captured into CUDA graphs unchanged; only the
attention function is swapped for a kernel on the GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import torch
import torch.nn.functional as F

from . import architectures
from .architectures import LayerFeatures
from .attention import (
    AttentionBatch,
    KVCache,
    PackedBatch,
    packed_attention_reference,
    paged_attention_reference,
    write_kv,
)
from .layers import apply_rope, rms_norm, rope_table, silu_mul
from .spec import ModelSpec

AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, AttentionBatch, float], torch.Tensor]


def embed_rms_norm(tokens: torch.Tensor, table: torch.Tensor, weight: torch.Tensor,
                   eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The token embeddings x and the first layer's norm of them; -> ``(rms_norm(x), x)``."""
    x = F.embedding(tokens, table)
    return rms_norm(x, weight, eps), x


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``h = residual + x``; -> ``(rms_norm(h), h)``."""
    residual = residual + x
    return rms_norm(residual, weight, eps), residual


def linear_add_rms_norm(x: torch.Tensor, w: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                        eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """A sublayer's output projection added into the residual stream, then the next norm:
    ``h = residual + x @ w.T``; -> ``(rms_norm(h), h)``."""
    return add_rms_norm(F.linear(x, w), residual, weight, eps)


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

    On CUDA, ``linear_add_rms_norm`` of a small batch returns a ``kernels.NormedRows``
    (the next GEMV normalises its input itself); only the linear slots receive it.
    """

    linear: Callable = F.linear
    row_linear: Callable = F.linear  # the last layer's down projection (tensor parallel sums it across ranks)
    linear_silu: Callable = linear_silu  # (x, gate_up) -> silu(gate) * up
    linear_float: Callable = linear_float  # (x, w) -> float32 F.linear(x, w)
    rms_norm: Callable = rms_norm
    embed_rms_norm: Callable = embed_rms_norm  # (tokens, table, norm w, eps) -> (norm(x), x)
    add_rms_norm: Callable = add_rms_norm  # (x, residual, w, eps) -> (norm(residual + x), residual + x)
    linear_add_rms_norm: Callable = linear_add_rms_norm  # (x, w, residual, norm w, eps); see above
    linear_qkv_rope_write: Callable = linear_qkv_rope_write  # see linear_qkv_rope_write above
    attention: AttentionFn = paged_attention_reference
    packed_attention: Callable = packed_attention_reference  # (q [1, N, H, D], k, v, PackedBatch, scale)


def cuda_ops() -> DecoderOps:
    """Triton kernels for attention and the fused elementwise work; small-batch GEMV linear."""
    from . import kernels

    return DecoderOps(linear=kernels.linear, row_linear=kernels.linear, linear_silu=kernels.linear_silu,
                      linear_float=kernels.linear_float, rms_norm=kernels.rms_norm,
                      embed_rms_norm=kernels.embed_rms_norm, add_rms_norm=kernels.add_rms_norm,
                      linear_add_rms_norm=kernels.linear_add_rms_norm,
                      linear_qkv_rope_write=kernels.linear_qkv_rope_write, attention=kernels.paged_attention,
                      packed_attention=kernels.packed_attention)


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
        self.tensor_parallel = None  # a TensorParallel when this is one rank's shard (model/tensor_parallel.py)
        self.scale = spec.head_dim ** -0.5
        self.arch = architectures.get(spec.family)
        features = self.arch.features(spec)
        self.layers = [self._layer_weights(i, features) for i in range(spec.num_layers)]

    def _layer_weights(self, i: int, features: LayerFeatures) -> dict[str, torch.Tensor | None]:
        """The tensors one layer's forward reads; None where the family's layer lacks a feature."""
        def w(name: str) -> torch.Tensor:
            return self.w[f"layers.{i}.{name}"]

        return {
            "attn_norm": w("attn_norm"), "qkv": w("qkv"), "qkv_bias": w("qkv_bias") if features.qkv_bias else None,
            "q_norm": w("q_norm") if features.qk_norm else None, "k_norm": w("k_norm") if features.qk_norm else None,
            "o": w("o"), "mlp_norm": w("mlp_norm"), "gate_up": w("gate_up"), "down": w("down"),
        }

    def forward(self, tokens: torch.Tensor, batch: AttentionBatch | PackedBatch, kv: KVCache,
                sample_index: torch.Tensor | None = None) -> torch.Tensor:
        """Run the decoder; returns the final-normed hidden state of each row's sampled token.

        tokens: [B, Q] int64; sample_index: [B] int64 (query index per row), or None for
        each row's last query (a view: no gather kernel), or [B, K] (K queries per row).
        -> [B, hidden] ([B, K, hidden]). A packed step
        (``batch`` a PackedBatch) has tokens [1, N] and ``sample_index`` [R]: flat token
        indices, one per sampled row.
        """
        spec, ops = self.spec, self.ops
        b, nq = tokens.shape
        h, d = spec.num_heads, spec.head_dim
        eps = spec.rms_norm_eps
        packed = isinstance(batch, PackedBatch)
        y, residual = ops.embed_rms_norm(tokens, self.w["embed"], self.layers[0]["attn_norm"], eps)  # [B, Q, hidden]
        last = len(self.layers) - 1
        for i, lw in enumerate(self.layers):
            q = ops.linear_qkv_rope_write(y, lw["qkv"], lw["qkv_bias"], h, lw["q_norm"], lw["k_norm"], eps,
                                          self.rope_cos, self.rope_sin, batch.positions, batch.write_index,
                                          kv.k[i], kv.v[i])
            attn = (ops.packed_attention if packed else ops.attention)(q, kv.k[i], kv.v[i], batch, self.scale)
            y, residual = ops.linear_add_rms_norm(attn.reshape(b, nq, h * d), lw["o"], residual, lw["mlp_norm"], eps)
            act = ops.linear_silu(y, lw["gate_up"])
            if i < last:
                y, residual = ops.linear_add_rms_norm(act, lw["down"], residual, self.layers[i + 1]["attn_norm"], eps)
            else:  # the final norm's output leaves the decoder: computed here, not left to a GEMV
                y, residual = ops.add_rms_norm(ops.row_linear(act, lw["down"]), residual, self.w["norm"], eps)
        # [B, hidden]: the last layer's add_rms_norm applied the final norm
        if packed:
            return y[0].index_select(0, sample_index)
        if sample_index is None:
            return y[:, -1]
        if sample_index.dim() == 2:  # [B, K] query indices per row -> [B, K, hidden]
            return y[torch.arange(b, device=y.device).view(-1, 1), sample_index]
        return y[torch.arange(b, device=y.device), sample_index]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[B, hidden] -> float32 logits [B, V]."""
        return self.ops.linear_float(hidden, self.lm_head)
