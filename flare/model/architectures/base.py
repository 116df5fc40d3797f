"""The dense decoder layout every family starts from, and the seam each family fills in.

An :class:`Architecture` says, for one family of checkpoints:

- which Hugging Face ``architectures`` names (config.json) it claims;
- how config.json maps onto a :class:`ModelSpec` (``spec``; a family overrides ``flags``);
- the runtime weight layout: every tensor with its Hugging Face source, its shape and,
  for a projection, how it splits across tensor-parallel ranks (``embedding``, ``layer``,
  ``head``: :class:`Weight` and :class:`Linear` entries, in the order they are stored);
- the per-layer features the decoder reads (``features``);
- its GGUF ``general.architecture`` name and whether llama.cpp permuted its q/k rows.

The defaults here are the Llama layout; a family module overrides what differs. The
sharding seam: every projection the decoder multiplies by is a :class:`Linear` entry
of this layout, so a tensor-parallel loader can take each rank's slice with
:meth:`Linear.shard` and the decoder reduces after the row-parallel ones (``o``,
``down``); nothing of that runs yet, and the forward's numerics do not depend on it.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any, Mapping, Union

import torch

from ...errors import FrontendError
from ..spec import ModelSpec, RopeScaling


class Parallel(enum.Enum):
    """How a projection ``y = x @ W.T`` splits across tensor-parallel ranks."""

    COLUMN = "column"  # W's rows (output features) split: each rank computes a slice of y
    ROW = "row"  # W's columns (input features) split: each rank's partial y is summed across ranks


@dataclass(frozen=True)
class Weight:
    """A tensor stored as the checkpoint has it (embedding, norm scales); every rank holds it whole."""

    name: str  # runtime name (a layer's without the "layers.{i}." prefix)
    source: str  # Hugging Face tensor name (a layer's without the "model.layers.{i}." prefix)
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Linear:
    """One projection ``y = x @ W.T (+ b)``; ``W`` is ``[out_features, in_features]``.

    ``sources`` are Hugging Face module paths whose ``.weight`` rows (and ``.bias``
    entries) are fused, in order, along the output dimension; ``parts`` are their
    row counts. The bias, when present, is stored as ``name + "_bias"``.
    """

    name: str  # runtime name of the weight
    sources: tuple[str, ...]  # Hugging Face module paths, one per fused part
    parts: tuple[int, ...]  # output rows of each part
    in_features: int
    parallel: Parallel
    bias: bool = False
    unit: int = 1  # indivisible group along the split dimension (head_dim for attention heads)

    @property
    def out_features(self) -> int:
        return sum(self.parts)

    @property
    def shape(self) -> tuple[int, int]:
        return (self.out_features, self.in_features)

    @property
    def bias_name(self) -> str:
        return self.name + "_bias"

    def shard(self, tensor: torch.Tensor, rank: int, num_ranks: int) -> torch.Tensor:
        """This rank's slice of the weight ``[out, in]`` or its bias ``[out]``.

        Column-parallel splits each fused part's rows, so a rank's qkv holds its own q,
        k and v heads; row-parallel splits the input columns and leaves a bias whole
        (added once, after the sum). ValueError when a part does not split into whole units.
        """
        if self.parallel is Parallel.ROW:
            if tensor.dim() == 1:
                return tensor
            return tensor.narrow(1, *self._span(self.in_features, rank, num_ranks))
        return torch.cat([part.narrow(0, *self._span(rows, rank, num_ranks))
                          for part, rows in zip(tensor.split(self.parts), self.parts)])

    def _span(self, size: int, rank: int, num_ranks: int) -> tuple[int, int]:
        if size % (self.unit * num_ranks):
            raise ValueError(f"{self.name}: {size} features do not split into {num_ranks} ranks of whole "
                             f"{self.unit}-wide units")
        length = size // num_ranks
        return rank * length, length


Entry = Union[Weight, Linear]


@dataclass(frozen=True)
class LayerFeatures:
    """What a decoder layer computes beyond the Llama block."""

    qkv_bias: bool  # the fused qkv projection adds a bias (Qwen2)
    qk_norm: bool  # per-head RMSNorm of q and k before RoPE (Qwen3)


class Architecture:
    """A decoder family. Subclasses set the class attributes and override what differs."""

    family: str = ""  # the recipe's ``family`` and the registry key
    hf_architectures: tuple[str, ...] = ()  # config.json ``architectures`` names claimed; the first is canonical
    gguf_architecture: str | None = None  # GGUF ``general.architecture`` it imports from, if any
    gguf_permuted_qk: bool = False  # llama.cpp interleaved the q/k rows of this family's GGUFs
    hf_layer_prefix: str = "model.layers.{i}."

    # -- config.json -> ModelSpec --------------------------------------------------

    def flags(self, config: Mapping[str, Any]) -> dict[str, bool]:
        """The recipe's feature flags for this config.json."""
        return {"qkv_bias": bool(config.get("attention_bias", False)), "qk_norm": False}

    def spec(self, config: Mapping[str, Any], architecture: str) -> ModelSpec:
        """A spec from a Hugging Face config.json mapping that names ``architecture``."""
        try:
            hidden = int(config["hidden_size"])
            heads = int(config["num_attention_heads"])
            eos = config.get("eos_token_id")
            eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
            spec = ModelSpec(
                family=self.family,
                architecture=architecture,
                vocab_size=int(config["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(config["intermediate_size"]),
                num_layers=int(config["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(config.get("num_key_value_heads") or heads),
                head_dim=int(config.get("head_dim") or hidden // heads),
                rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
                rope_theta=float(_rope_theta(config)),
                max_position_embeddings=int(config.get("max_position_embeddings", 4096)),
                tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
                rope_scaling=_rope_scaling(config),
                bos_token_id=config.get("bos_token_id"),
                eos_token_ids=tuple(int(e) for e in eos_ids),
                **self.flags(config),
            )
        except KeyError as exc:
            raise FrontendError(f"config.json lacks required field {exc.args[0]!r}") from None
        if spec.num_heads % spec.num_kv_heads:
            raise FrontendError(
                f"num_attention_heads {spec.num_heads} is not a multiple of num_key_value_heads {spec.num_kv_heads}")
        if config.get("mlp_bias"):
            raise FrontendError("mlp_bias is not supported")
        return spec

    # -- runtime layout ----------------------------------------------------------------

    def features(self, spec: ModelSpec) -> LayerFeatures:
        return LayerFeatures(qkv_bias=spec.qkv_bias, qk_norm=spec.qk_norm)

    def embedding(self, spec: ModelSpec) -> tuple[Entry, ...]:
        """Tensors stored before the layers."""
        return (Weight("embed", "model.embed_tokens.weight", (spec.vocab_size, spec.hidden_size)),)

    def layer(self, spec: ModelSpec) -> tuple[Entry, ...]:
        """One decoder layer's tensors (every layer has the same)."""
        h, d, inter = spec.hidden_size, spec.head_dim, spec.intermediate_size
        features = self.features(spec)
        entries: list[Entry] = [
            Weight("attn_norm", "input_layernorm.weight", (h,)),
            Linear("qkv", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
                   (spec.q_size, spec.kv_size, spec.kv_size), h, Parallel.COLUMN, bias=features.qkv_bias, unit=d),
        ]
        if features.qk_norm:
            entries += [Weight("q_norm", "self_attn.q_norm.weight", (d,)),
                        Weight("k_norm", "self_attn.k_norm.weight", (d,))]
        entries += [
            Linear("o", ("self_attn.o_proj",), (h,), spec.q_size, Parallel.ROW, unit=d),
            Weight("mlp_norm", "post_attention_layernorm.weight", (h,)),
            Linear("gate_up", ("mlp.gate_proj", "mlp.up_proj"), (inter, inter), h, Parallel.COLUMN),
            Linear("down", ("mlp.down_proj",), (h,), inter, Parallel.ROW),
        ]
        return tuple(entries)

    def head(self, spec: ModelSpec) -> tuple[Entry, ...]:
        """Tensors stored after the layers: the final norm and, unless tied to the embedding, lm_head."""
        entries: tuple[Entry, ...] = (Weight("norm", "model.norm.weight", (spec.hidden_size,)),)
        if not spec.tie_word_embeddings:
            entries += (Linear("lm_head", ("lm_head",), (spec.vocab_size,), spec.hidden_size, Parallel.COLUMN),)
        return entries

    def num_params(self, spec: ModelSpec) -> int:
        """Parameter count of the runtime layout (tied embeddings counted once)."""
        def count(entries) -> int:
            return sum(math.prod(e.shape) + (e.out_features if isinstance(e, Linear) and e.bias else 0)
                       for e in entries)
        return (count(self.embedding(spec)) + spec.num_layers * count(self.layer(spec))
                + count(self.head(spec)))


def _rope_params(config: Mapping[str, Any]) -> Mapping[str, Any]:
    # transformers 5 moved rope settings into rope_parameters; 4.x used rope_scaling/rope_theta.
    return config.get("rope_parameters") or config.get("rope_scaling") or {}


def _rope_theta(config: Mapping[str, Any]) -> float:
    if "rope_theta" in config:
        return config["rope_theta"]
    return _rope_params(config).get("rope_theta", 10000.0)


def _rope_scaling(config: Mapping[str, Any]) -> RopeScaling | None:
    params = _rope_params(config)
    kind = params.get("rope_type") or params.get("type")
    if kind in (None, "default"):
        return None
    if kind != "llama3":
        raise FrontendError(f"unsupported rope scaling {kind!r}; supported: default, llama3")
    return RopeScaling(
        factor=float(params["factor"]),
        low_freq_factor=float(params["low_freq_factor"]),
        high_freq_factor=float(params["high_freq_factor"]),
        original_max_position_embeddings=int(params["original_max_position_embeddings"]),
    )
