"""Qwen3: the Llama layout with a per-head RMSNorm of q and k before RoPE.

The ``q_norm``/``k_norm`` scales are ``[head_dim]``, shared by every head. A qkv
bias only when config.json sets ``attention_bias``.
"""

from __future__ import annotations

from typing import Any, Mapping

from .base import Architecture


class Qwen3(Architecture):
    family = "qwen3"
    hf_architectures = ("Qwen3ForCausalLM",)
    gguf_architecture = "qwen3"

    def flags(self, config: Mapping[str, Any]) -> dict[str, bool]:
        return {**super().flags(config), "qk_norm": True}


ARCHITECTURE = Qwen3()
