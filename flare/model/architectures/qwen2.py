"""Qwen2 and Qwen2.5: the Llama layout with a bias on the fused qkv projection, always."""

from __future__ import annotations

from typing import Any, Mapping

from .base import Architecture


class Qwen2(Architecture):
    family = "qwen2"
    hf_architectures = ("Qwen2ForCausalLM",)
    gguf_architecture = "qwen2"

    def flags(self, config: Mapping[str, Any]) -> dict[str, bool]:
        return {**super().flags(config), "qkv_bias": True}


ARCHITECTURE = Qwen2()
