"""Tensor parallelism, the model's half: a decoder sharded over the ranks of a process group.

Megatron-style. Rank ``r`` of ``N`` holds:

- its attention heads: query heads ``[r*H/N, (r+1)*H/N)`` and the KV heads serving them,
  ``[r*Hkv/N, (r+1)*Hkv/N)`` (query head ``j`` reads KV head ``j // (H/Hkv)``, see
  :func:`flare.model.attention.paged_attention_reference`, so a contiguous run of whole KV
  groups is exactly that), as rows of the fused ``qkv`` (and ``qkv_bias``) and as the
  matching input columns of ``o``; its own KV cache holds only those KV heads;
- its slice of the MLP width: rows of ``gate`` and of ``up`` (re-fused ``[gate_r; up_r]``)
  and the matching input columns of ``down``;
- its contiguous vocabulary range (:func:`vocab_range`) of ``embed`` and ``lm_head`` (a tied
  head is the sharded embedding itself);
- every norm scale whole.

:func:`tensor_parallel_ops` wraps a :class:`~flare.model.decoder.DecoderOps` with the
collectives: the embedding lookup is all-reduced (each token's row lives on one rank), the
row-parallel ``o`` and ``down`` products are all-reduced in float32 before the residual add
(rounded once to the model dtype, as one rank's projection is), and the logits of each
rank's vocabulary range are all-gathered into the full ``[..., V]``. So every collective runs
inside :meth:`Decoder.forward` and :meth:`Decoder.logits`: every rank must run the same
programs with the same shapes in the same order, and sampling, done on the gathered
logits, is replicated.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..errors import ExecutionError
from . import architectures
from .architectures import Linear
from .decoder import DecoderOps
from .spec import ModelSpec


@dataclass(frozen=True)
class TensorParallel:
    """One rank's place in a tensor-parallel group (``group``: None for the default group)."""

    rank: int
    world: int
    group: Any = None

    def __post_init__(self) -> None:
        if self.world < 1 or not 0 <= self.rank < self.world:
            raise ExecutionError(f"tensor parallel rank {self.rank} of {self.world} is out of range")


def check_shardable(spec: ModelSpec, world: int) -> None:
    """ExecutionError naming the counts unless the query heads, KV heads and MLP width divide by ``world``."""
    if world < 1:
        raise ExecutionError(f"tensor parallel {world} must be at least 1")
    counts = (("query heads", spec.num_heads), ("KV heads", spec.num_kv_heads), ("MLP width", spec.intermediate_size))
    bad = [str(n) for _, n in counts if n % world]
    if bad:
        named = [f"{what} ({n})" for what, n in counts]
        raise ExecutionError(f"tensor parallel {world} needs the {named[0]}, {named[1]} and {named[2]} to divide by "
                             f"{world}; {' and '.join([', '.join(bad[:-1]), bad[-1]] if len(bad) > 1 else bad)} "
                             f"{'does' if len(bad) == 1 else 'do'} not")


def shard_spec(spec: ModelSpec, world: int) -> ModelSpec:
    """The per-rank spec: 1/world of the query heads, KV heads and MLP width; the rest whole
    (``head_dim`` is stored explicitly, so it stays the full model's)."""
    check_shardable(spec, world)
    if world == 1:
        return spec
    return dataclasses.replace(spec, num_heads=spec.num_heads // world, num_kv_heads=spec.num_kv_heads // world,
                               intermediate_size=spec.intermediate_size // world)


def vocab_range(vocab_size: int, rank: int, world: int) -> tuple[int, int]:
    """Rank ``rank``'s vocabulary rows ``[start, end)``: ceil(V/world) each, the last range
    shorter (empty when the ceil split runs out first)."""
    chunk = -(-vocab_size // world)
    return min(rank * chunk, vocab_size), min((rank + 1) * chunk, vocab_size)


def _own(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy that keeps nothing of the full tensor alive."""
    return t.clone(memory_format=torch.contiguous_format)


def shard_weights(weights: Mapping[str, torch.Tensor], spec: ModelSpec, rank: int,
                  world: int) -> dict[str, torch.Tensor]:
    """Rank ``rank``'s slices of the FULL runtime weights of ``spec`` (see the module docstring).

    The layers' projections split as their layout's :class:`Linear` entries say
    (:meth:`Linear.shard`); ``embed`` and ``lm_head`` by :func:`vocab_range`; everything
    else is copied whole. Every returned tensor is a fresh contiguous copy, so the full
    weights can be freed.
    """
    check_shardable(spec, world)
    if world == 1:
        return dict(weights)
    arch = architectures.get(spec.family)
    linears: dict[str, Linear] = {}
    for e in arch.layer(spec):
        if isinstance(e, Linear):
            linears[e.name] = e
            if e.bias:
                linears[e.bias_name] = e
    start, end = vocab_range(spec.vocab_size, rank, world)
    out: dict[str, torch.Tensor] = {}
    for name, tensor in weights.items():
        if name in ("embed", "lm_head"):
            out[name] = _own(tensor[start:end])
            continue
        local = name.split(".", 2)[2] if name.startswith("layers.") else None
        entry = linears.get(local) if local is not None else None
        out[name] = _own(tensor if entry is None else entry.shard(tensor, rank, world))
    return out


def tensor_parallel_ops(base: DecoderOps, *, rank: int, world: int, vocab_size: int, group=None) -> DecoderOps:
    """``base`` with the collectives of a rank of a sharded decoder (the default process group
    unless ``group``): vocabulary-parallel embedding and logits, the row-parallel ``o`` and
    ``down`` products summed across ranks. Column-parallel ops (qkv, attention, gate_up) are
    ``base``'s: each rank computes its own heads and MLP slice."""
    if world == 1:
        return base
    start, end = vocab_range(vocab_size, rank, world)
    chunk = -(-vocab_size // world)

    def embed_rms_norm(tokens: torch.Tensor, table: torch.Tensor, weight: torch.Tensor,
                       eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        if end > start:
            local = tokens - start
            mine = (local >= 0) & (local < end - start)
            x = F.embedding(local.clamp(0, end - start - 1), table)
            x = torch.where(mine.unsqueeze(-1), x, torch.zeros((), dtype=x.dtype, device=x.device))
        else:  # an empty vocabulary range (the ceil split ran out): this rank adds nothing
            x = torch.zeros(*tokens.shape, table.shape[1], dtype=table.dtype, device=table.device)
        dist.all_reduce(x, group=group)
        return base.rms_norm(x, weight, eps), x

    def row_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        if w.device.type == "cpu":
            # float32 partials summed in float32, rounded once: as close to one rank's product as it gets
            partial = F.linear(x.float(), w.float())
            dist.all_reduce(partial, group=group)
            return partial.to(w.dtype)
        # on a GPU the partial stays in the model dtype (as vLLM and SGLang sum it): a float32 copy of
        # the weight every step would cost more than the exactness it buys
        partial = base.linear(x, w)
        dist.all_reduce(partial, group=group)
        return partial

    def linear_add_rms_norm(x: torch.Tensor, w: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                            eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        return base.add_rms_norm(row_linear(x, w), residual, weight, eps)

    def linear_float(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        local = base.linear_float(x, w)  # [..., end - start] float32
        if local.shape[-1] < chunk:
            local = F.pad(local, (0, chunk - local.shape[-1]))
        local = local.contiguous()
        parts = [torch.empty_like(local) for _ in range(world)]
        dist.all_gather(parts, local, group=group)
        return torch.cat(parts, dim=-1)[..., :vocab_size]

    return dataclasses.replace(base, embed_rms_norm=embed_rms_norm, linear_add_rms_norm=linear_add_rms_norm,
                               row_linear=row_linear, linear_float=linear_float)
