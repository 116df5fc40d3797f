"""The weights' safetensors headers against the recipe's runtime layout.

Only the headers are read (an 8-byte little-endian length, then that many bytes
of JSON): no tensor is loaded, so a core whose recipe disagrees with its
weights (a layer too many, a tensor of the wrong shape or dtype, a missing or
extra tensor) is refused in milliseconds, before any weight work. Each refusal
is a CoreError naming the weights file and the tensor or recipe field.
"""

from __future__ import annotations

import json
import math
import re
import struct
from pathlib import Path
from typing import NamedTuple, Sequence

from ..errors import CoreError
from ..model.checkpoint import runtime_weight_shapes
from ..model.spec import ModelSpec

# core.json dtype -> safetensors dtype code, bytes per element
SAFETENSORS_DTYPES = {"float32": ("F32", 4), "bfloat16": ("BF16", 2), "float16": ("F16", 2)}
MAX_HEADER_BYTES = 100 << 20  # the safetensors format's own limit
LAYER = re.compile(r"layers\.(\d+)\.")

# runtime name (without "layers.{i}.") -> its shape in recipe fields, for messages
SHAPE_NOTES = {
    "embed": "[vocab_size, hidden_size]", "lm_head": "[vocab_size, hidden_size]", "norm": "[hidden_size]",
    "attn_norm": "[hidden_size]", "mlp_norm": "[hidden_size]",
    "qkv": "[(num_heads + 2 num_kv_heads) head_dim, hidden_size]",
    "qkv_bias": "[(num_heads + 2 num_kv_heads) head_dim]", "q_norm": "[head_dim]", "k_norm": "[head_dim]",
    "o": "[hidden_size, num_heads head_dim]", "gate_up": "[2 intermediate_size, hidden_size]",
    "down": "[hidden_size, intermediate_size]",
}
# runtime name -> the recipe flag that decides whether it exists
FLAG_OF = {"lm_head": "tie_word_embeddings", "qkv_bias": "qkv_bias", "q_norm": "qk_norm", "k_norm": "qk_norm"}


class TensorHeader(NamedTuple):
    file: Path  # the shard holding it
    dtype: str  # safetensors dtype code ("F32", "BF16", ...)
    shape: tuple[int, ...]
    num_bytes: int  # data_offsets end - begin


def read_header(file: Path) -> dict[str, TensorHeader]:
    """Every tensor's dtype, shape and byte count from a safetensors file's header."""
    size = file.stat().st_size
    with open(file, "rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise CoreError(file, "is not a safetensors file: shorter than its 8-byte header length")
        (header_len,) = struct.unpack("<Q", prefix)
        if header_len > min(MAX_HEADER_BYTES, size - 8):
            raise CoreError(file, f"is not a safetensors file: header length {header_len} exceeds the file")
        raw = f.read(header_len)
    try:
        header = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CoreError(file, f"has a corrupt safetensors header: {exc}") from None
    if not isinstance(header, dict):
        raise CoreError(file, "has a corrupt safetensors header: not a JSON object")
    data_len = size - 8 - header_len
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = entry["dtype"], tuple(entry["shape"]), entry["data_offsets"]
            if not (isinstance(dtype, str) and all(isinstance(n, int) and n >= 0 for n in shape)
                    and isinstance(begin, int) and isinstance(end, int) and 0 <= begin <= end <= data_len):
                raise ValueError
        except (KeyError, TypeError, ValueError):
            raise CoreError(file, f"tensor {name} has a corrupt header entry: {json.dumps(entry)[:80]}") from None
        tensors[name] = TensorHeader(file, dtype, shape, end - begin)
    return tensors


def check_weights(files: Sequence[Path], spec: ModelSpec, dtype: str) -> None:
    """Refuse weights whose tensors are not exactly the runtime layout of ``spec`` in ``dtype``."""
    found: dict[str, TensorHeader] = {}
    for file in files:
        for name, header in read_header(file).items():
            if name in found:
                raise CoreError(file, f"tensor {name} is also in {found[name].file.name}")
            found[name] = header
    expected = runtime_weight_shapes(spec)
    where = files[0] if len(files) == 1 else files[0].parent / "weights-*.safetensors"
    _check_layer_count(found, spec.num_layers, where)
    missing = [name for name in expected if name not in found]
    if missing:
        listed = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
        raise CoreError(where, f"tensor {listed} missing{_flag_note(missing[0], spec)}", field=missing[0])
    extra = sorted(set(found) - set(expected))
    if extra:
        raise CoreError(found[extra[0]].file, f"unexpected tensor {extra[0]}{_flag_note(extra[0], spec)}",
                        field=extra[0])
    code, itemsize = SAFETENSORS_DTYPES[dtype]
    for name, shape in expected.items():
        header = found[name]
        if header.dtype != code:
            raise CoreError(header.file, f"tensor {name} is {header.dtype} but core.json dtype is {dtype} ({code})",
                            field=name)
        if header.shape != shape:
            note = SHAPE_NOTES.get(LAYER.sub("", name), "")
            raise CoreError(header.file, f"tensor {name} has shape {list(header.shape)} but the recipe gives "
                                         f"{list(shape)}{f' = {note}' if note else ''}", field=name)
        if header.num_bytes != math.prod(shape) * itemsize:
            raise CoreError(header.file, f"tensor {name} holds {header.num_bytes} bytes, "
                                         f"not {math.prod(shape) * itemsize} for {list(shape)} {code}", field=name)


def _check_layer_count(found: dict[str, TensorHeader], num_layers: int, where: Path) -> None:
    layers = sorted({int(m.group(1)) for name in found if (m := LAYER.match(name))})
    if layers and layers[-1] >= num_layers:
        top = layers[-1]
        file = next(h.file for name, h in found.items() if name.startswith(f"layers.{top}."))
        raise CoreError(file, f"layers.{top}.* present but recipe.num_layers is {num_layers} "
                              f"(the weights hold {len(layers)} layers)", field="recipe.num_layers")
    if len(layers) < num_layers and (not layers or layers[-1] == len(layers) - 1):
        raise CoreError(where, f"layers.{len(layers)}.* missing: the weights hold {len(layers)} layers "
                               f"but recipe.num_layers is {num_layers}", field="recipe.num_layers")


def _flag_note(name: str, spec: ModelSpec) -> str:
    flag = FLAG_OF.get(LAYER.sub("", name))
    return f" (recipe.{flag} is {str(getattr(spec, flag)).lower()})" if flag else ""
