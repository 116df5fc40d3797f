"""GGUF -> Hugging Face checkpoint directory.

Writes config.json, model.safetensors (dequantized), tokenizer.json,
tokenizer_config.json (with the chat template) and generation_config.json, so
a GGUF file exports through the same path as any checkpoint directory.

llama.cpp's converter permutes the rows of q/k projections of llama-family
models (it stores RoPE pairs interleaved, (x0, x1), (x2, x3), ...); Hugging
Face's rotate-half convention pairs x_i with x_{i+D/2}. ``_unpermute`` is the
inverse of that reordering. Which GGUF architectures import, as which Hugging
Face architecture, and whether their q/k rows are permuted, each family declares
(flare/model/architectures/: ``gguf_architecture``, ``gguf_permuted_qk``);
Qwen2/Qwen3 GGUFs are stored unpermuted. The tensor names below are llama.cpp's,
shared by every family. llama.cpp's recommended-sampling metadata
(``general.sampling.*``) becomes generation_config.json's sampling values.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from ..errors import FrontendError
from ..model import architectures
from ..model.architectures import Architecture
from ..progress import Progress, format_amount, reporter

_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}

SUPPORTED_TENSOR_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1")
# llama.cpp's general.sampling.* keys (gguf-py Keys.General.SAMPLING_*) -> generation_config.json's.
# The others (sequence, xtc_*, penalty_last_n, mirostat*) have no Flare sampler; they are dropped.
_SAMPLING_KEYS = {
    "general.sampling.temp": "temperature",
    "general.sampling.top_p": "top_p",
    "general.sampling.top_k": "top_k",
    "general.sampling.min_p": "min_p",
    "general.sampling.penalty_repeat": "repetition_penalty",
}


def _field(reader, key: str, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


def sampling_defaults(reader) -> dict[str, int | float]:
    """The GGUF's recommended sampling (``general.sampling.*``) as generation_config.json keys."""
    out: dict[str, int | float] = {}
    for gguf_key, hf_key in _SAMPLING_KEYS.items():
        value = _field(reader, gguf_key)
        if isinstance(value, float):  # stored as float32: keep its shortest decimal (0.7, not 0.699999988)
            value = float(str(np.float32(value)))
        if value is not None:
            out[hf_key] = value
    return out


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation for one projection [n_head*D, in]."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _hf_name(gguf_name: str) -> str | None:
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    if gguf_name.startswith("blk."):
        _, idx, rest = gguf_name.split(".", 2)
        if rest in _LAYER_NAMES:
            return f"model.layers.{idx}.{_LAYER_NAMES[rest]}"
    return None


def _hf_config(reader, arch: str, family: Architecture, tensor_names: set[str], tokenizer) -> dict:
    def meta(key, default=None):
        return _field(reader, f"{arch}.{key}", default)

    heads = int(meta("attention.head_count"))
    hidden = int(meta("embedding_length"))
    vocab = int(meta("vocab_size", 0)) or len(reader.fields["tokenizer.ggml.tokens"].data)
    key_length = meta("attention.key_length")
    config = {
        "architectures": [family.hf_architectures[0]],
        "model_type": family.family,
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": int(meta("feed_forward_length")),
        "num_hidden_layers": int(meta("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(meta("attention.head_count_kv", heads)),
        "head_dim": int(key_length) if key_length else hidden // heads,
        "rms_norm_eps": float(meta("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(meta("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(meta("context_length", 4096)),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "hidden_act": "silu",
        "torch_dtype": "float32",
    }
    if tokenizer.bos_token_id is not None:
        config["bos_token_id"] = tokenizer.bos_token_id
    if tokenizer.eos_token_ids:
        config["eos_token_id"] = tokenizer.eos_token_ids[0]
    if "rope_freqs.weight" in tensor_names:
        raise FrontendError("GGUF rope_freqs (Llama 3.1 rope scaling) import is not supported; "
                            "export the Hugging Face checkpoint directory instead")
    return config


def import_gguf(gguf_path: Path, out_dir: Path, progress: Progress | None = None) -> Path:
    """Convert ``gguf_path`` into a Hugging Face checkpoint directory at ``out_dir``.

    Written to a temporary sibling and renamed into place, so a failure leaves nothing.
    """
    import gguf
    from safetensors.numpy import save_file

    from .gguf_tokenizer import convert_gguf_tokenizer

    progress = reporter(progress)
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    try:
        reader = gguf.GGUFReader(str(gguf_path))
    except Exception as exc:  # gguf raises ValueError/struct errors on bad files
        raise FrontendError(f"{gguf_path} is not a readable GGUF file: {exc}") from None
    arch = _field(reader, "general.architecture")
    family = architectures.for_gguf(arch)
    if family is None:
        raise FrontendError(
            f"unsupported GGUF architecture {arch!r}; supported: {', '.join(architectures.gguf_names())}")
    tensor_names = {t.name for t in reader.tensors}
    for t in reader.tensors:
        if t.tensor_type.name not in SUPPORTED_TENSOR_TYPES:
            raise FrontendError(
                f"unsupported GGUF tensor type {t.tensor_type.name} for {t.name}; "
                f"supported: {', '.join(SUPPORTED_TENSOR_TYPES)}")
    tokenizer = convert_gguf_tokenizer(reader)
    config = _hf_config(reader, arch, family, tensor_names, tokenizer)
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]

    tensors: dict[str, np.ndarray] = {}
    # measured in the GGUF's (quantized) bytes: what each tensor costs is about its size there
    with progress.task(f"dequantizing {len(reader.tensors)} tensors",
                       total=sum(int(t.n_bytes) for t in reader.tensors)) as advance:
        for t in reader.tensors:
            name = _hf_name(t.name)
            if name is None:
                raise FrontendError(f"GGUF tensor {t.name} has no Hugging Face counterpart for {arch}")
            w = gguf.quants.dequantize(t.data, t.tensor_type)
            if t.tensor_type.name == "F16":
                w = w.astype(np.float16)
            else:
                w = w.astype(np.float32)
            if family.gguf_permuted_qk and t.name.endswith("attn_q.weight"):
                w = _unpermute(w, heads)
            elif family.gguf_permuted_qk and t.name.endswith("attn_k.weight"):
                w = _unpermute(w, kv_heads)
            tensors[name] = np.ascontiguousarray(w)
            advance(int(t.n_bytes))

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    try:
        progress(f"writing the dequantized checkpoint "
                 f"({format_amount(sum(w.nbytes for w in tensors.values()))})")
        save_file(tensors, str(staging / "model.safetensors"), metadata={"format": "pt"})
        (staging / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        (staging / "tokenizer.json").write_text(json.dumps(tokenizer.tokenizer_json, ensure_ascii=False))
        (staging / "tokenizer_config.json").write_text(
            json.dumps(tokenizer.tokenizer_config, indent=2, ensure_ascii=False) + "\n")
        generation = {"eos_token_id": list(tokenizer.eos_token_ids)}
        if tokenizer.bos_token_id is not None:
            generation["bos_token_id"] = tokenizer.bos_token_id
        generation.update(sampling_defaults(reader))
        (staging / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    progress(f"converted {gguf_path.name} to {out_dir}")
    return out_dir
