"""ModelSpec: the architecture recipe of a decoder-only checkpoint.

Read from a Hugging Face ``config.json`` by the checkpoint's family
(flare/model/architectures/, which also decides the weight layout); stored in a
core's ``recipe``. The families differ only in the flags here (qkv bias, q/k
norm) and in what their architecture module declares.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Mapping


@dataclass(frozen=True)
class RopeScaling:
    """Llama 3 style frequency scaling (``rope_type: llama3``)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True)
class ModelSpec:
    family: str  # a registered architecture family: flare.model.architectures.names()
    architecture: str  # the config.json architecture name
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool = False
    qk_norm: bool = False
    rope_scaling: RopeScaling | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default=())

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def num_params(self) -> int:
        """Parameter count of the runtime layout (tied embeddings counted once)."""
        from .architectures import get  # NOTE: architectures build ModelSpecs, so imported on use

        return get(self.family).num_params(self)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["eos_token_ids"] = list(self.eos_token_ids)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "ModelSpec":
        data = dict(data)
        scaling = data.pop("rope_scaling", None)
        data["eos_token_ids"] = tuple(data.get("eos_token_ids") or ())
        return cls(rope_scaling=RopeScaling(**scaling) if scaling else None, **data)

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any]) -> "ModelSpec":
        """Build a spec from a Hugging Face config.json mapping; FrontendError if unsupported."""
        from .architectures import from_hf_config  # NOTE: architectures build ModelSpecs, so imported on use

        return from_hf_config(config)
