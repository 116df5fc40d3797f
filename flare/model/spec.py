"""ModelSpec: the architecture recipe of a decoder-only checkpoint.

Read from a Hugging Face ``config.json``; stored in a core's ``recipe``. The
model code is written once for the families below; each differs only in flags
(qkv bias, q/k norm, rope scaling), so MoE feed-forwards and a vision tower can
be added as further flags and modules without restructuring.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

from ..errors import FrontendError

# architecture name in config.json -> family
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}


@dataclass(frozen=True)
class RopeScaling:
    """Llama 3 style frequency scaling (``rope_type: llama3``)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True)
class ModelSpec:
    family: str  # "llama" | "qwen2" | "qwen3"
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
        per_layer = (
            self.hidden_size * (self.q_size + 2 * self.kv_size)
            + (self.q_size + 2 * self.kv_size if self.qkv_bias else 0)
            + self.q_size * self.hidden_size
            + 3 * self.hidden_size * self.intermediate_size
            + 2 * self.hidden_size
            + (2 * self.head_dim if self.qk_norm else 0)
        )
        embed = self.vocab_size * self.hidden_size
        return self.num_layers * per_layer + embed * (1 if self.tie_word_embeddings else 2) + self.hidden_size

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
        archs = config.get("architectures") or []
        arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if arch is None:
            named = ", ".join(archs) if archs else f"model_type {config.get('model_type')!r}"
            raise FrontendError(
                f"unsupported architecture {named}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}")
        family = SUPPORTED_ARCHITECTURES[arch]
        try:
            hidden = int(config["hidden_size"])
            heads = int(config["num_attention_heads"])
            head_dim = int(config.get("head_dim") or hidden // heads)
            eos = config.get("eos_token_id")
            eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
            spec = cls(
                family=family,
                architecture=arch,
                vocab_size=int(config["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(config["intermediate_size"]),
                num_layers=int(config["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(config.get("num_key_value_heads") or heads),
                head_dim=head_dim,
                rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
                rope_theta=float(_rope_theta(config)),
                max_position_embeddings=int(config.get("max_position_embeddings", 4096)),
                tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
                qkv_bias=family == "qwen2" or bool(config.get("attention_bias", False)),
                qk_norm=family == "qwen3",
                rope_scaling=_rope_scaling(config),
                bos_token_id=config.get("bos_token_id"),
                eos_token_ids=tuple(int(e) for e in eos_ids),
            )
        except KeyError as exc:
            raise FrontendError(f"config.json lacks required field {exc.args[0]!r}") from None
        if spec.num_heads % spec.num_kv_heads:
            raise FrontendError(
                f"num_attention_heads {spec.num_heads} is not a multiple of num_key_value_heads {spec.num_kv_heads}")
        if config.get("mlp_bias"):
            raise FrontendError("mlp_bias is not supported")
        return spec


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
