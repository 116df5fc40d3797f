"""Llama (Llama 3.x, SmolLM2) and Mistral: the base dense layout, unchanged.

Optional qkv bias when config.json sets ``attention_bias``; Llama 3 rope scaling is
read by the shared config mapping. llama.cpp stores this family's q/k rows
interleaved for its RoPE, so a GGUF import un-permutes them.
"""

from __future__ import annotations

from .base import Architecture


class Llama(Architecture):
    family = "llama"
    hf_architectures = ("LlamaForCausalLM", "MistralForCausalLM")
    gguf_architecture = "llama"
    gguf_permuted_qk = True


ARCHITECTURE = Llama()
