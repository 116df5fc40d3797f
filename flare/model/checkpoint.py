"""Reading Hugging Face checkpoints into the runtime weight layout.

The layout is the family's (flare/model/architectures/): which tensors exist,
their Hugging Face sources and shapes. For the dense families it fuses what the
kernels read together: one ``qkv`` matrix ``[(H + 2*Hkv) * D, hidden]`` (and
bias), one ``gate_up`` matrix ``[2 * I, hidden]``. Names (also used inside a
core's weights file)::

    embed, norm, lm_head (absent when tied)
    layers.{i}.attn_norm, .qkv, .qkv_bias, .q_norm, .k_norm, .o,
    layers.{i}.mlp_norm, .gate_up, .down
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Iterator

import torch
from safetensors import safe_open

from ..errors import FrontendError
from . import architectures
from .architectures import Entry, Linear
from .spec import ModelSpec

Progress = Callable[[str], None]


def read_config(path: Path) -> dict:
    config_path = Path(path) / "config.json"
    if not config_path.is_file():
        raise FrontendError(f"{path} is not a checkpoint directory: config.json is missing")
    try:
        return json.loads(config_path.read_text())
    except json.JSONDecodeError as exc:
        raise FrontendError(f"{config_path} is not valid JSON: {exc}") from None


def _weight_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [path / n for n in names]
    else:
        files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FrontendError(f"{path} holds no *.safetensors weights")
    for f in files:
        if not f.is_file():
            raise FrontendError(f"weights file {f.name} named by the index is missing from {path}")
    return files


class _TensorSource:
    """Lazy access to every tensor of a (possibly sharded) safetensors checkpoint."""

    def __init__(self, path: Path):
        self._where: dict[str, Path] = {}
        self._handles: dict[Path, object] = {}
        for f in _weight_files(path):
            try:
                handle = safe_open(str(f), framework="pt")
            except Exception as exc:  # safetensors raises its own error types
                raise FrontendError(f"cannot read {f.name}: {exc}") from None
            self._handles[f] = handle
            for key in handle.keys():
                self._where[key] = f

    def has(self, name: str) -> bool:
        return name in self._where

    def get(self, name: str) -> torch.Tensor:
        f = self._where.get(name)
        if f is None:
            raise FrontendError(f"checkpoint tensor {name!r} is missing")
        return self._handles[f].get_tensor(name)


def _check_shape(name: str, tensor: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    if tuple(tensor.shape) != shape:
        raise FrontendError(f"checkpoint tensor {name!r} has shape {tuple(tensor.shape)}, expected {shape}")
    return tensor


def iter_runtime_weights(path: Path, spec: ModelSpec, dtype: torch.dtype,
                         progress: Progress | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (runtime name, tensor) pairs in the runtime layout, cast to ``dtype``.

    Streams layer by layer so peak memory stays near one layer beyond the output.
    """
    src = _TensorSource(Path(path))
    arch = architectures.get(spec.family)

    def get(name: str, shape: tuple[int, ...]) -> torch.Tensor:
        return _check_shape(name, src.get(name), shape).to(dtype).contiguous()

    def read(entries: tuple[Entry, ...], source: str = "", out: str = "") -> Iterator[tuple[str, torch.Tensor]]:
        for e in entries:
            if not isinstance(e, Linear):
                yield out + e.name, get(source + e.source, e.shape)
                continue
            yield out + e.name, _fused([get(f"{source}{s}.weight", (rows, e.in_features))
                                         for s, rows in zip(e.sources, e.parts)])
            if e.bias:
                yield out + e.bias_name, _fused([get(f"{source}{s}.bias", (rows,))
                                                 for s, rows in zip(e.sources, e.parts)])

    yield from read(arch.embedding(spec))
    layer = arch.layer(spec)
    for i in range(spec.num_layers):
        yield from read(layer, arch.hf_layer_prefix.format(i=i), f"layers.{i}.")
        if progress and (i + 1) % max(1, spec.num_layers // 4) == 0:
            progress(f"read layer {i + 1}/{spec.num_layers}")
    yield from read(arch.head(spec))


def _fused(parts: list[torch.Tensor]) -> torch.Tensor:
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def _shapes(entries: tuple[Entry, ...], prefix: str = "") -> Iterator[tuple[str, tuple[int, ...]]]:
    for e in entries:
        yield prefix + e.name, tuple(e.shape)
        if isinstance(e, Linear) and e.bias:
            yield prefix + e.bias_name, (e.out_features,)


def runtime_weight_shapes(spec: ModelSpec) -> dict[str, tuple[int, ...]]:
    """The exact set of runtime tensors a core must contain, with shapes."""
    arch = architectures.get(spec.family)
    shapes = dict(_shapes(arch.embedding(spec) + arch.head(spec)))
    layer = arch.layer(spec)
    for i in range(spec.num_layers):
        shapes.update(_shapes(layer, f"layers.{i}."))
    return shapes


def random_runtime_weights(spec: ModelSpec, *, scale: float, dtype: torch.dtype = torch.float32,
                           device: torch.device | str = "cpu", seed: int = 0) -> dict[str, torch.Tensor]:
    """Random weights of every runtime tensor (tests and benchmarks): normal draws times
    ``scale``, the embedding unscaled, norm weights around 1."""
    gen = torch.Generator(device=device).manual_seed(seed)
    weights = {}
    for name, shape in runtime_weight_shapes(spec).items():
        draw = torch.randn(*shape, generator=gen, device=device)
        if name == "embed":
            weights[name] = draw.to(dtype)
        elif name.endswith("norm"):
            weights[name] = (1 + scale * draw).to(dtype)
        else:
            weights[name] = (scale * draw).to(dtype)
    return weights
