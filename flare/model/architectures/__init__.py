"""The decoder families Flare serves, by registry.

Each family is one module declaring what differs from the dense Llama layout of
:mod:`.base` (its Hugging Face names, config.json flags, weight layout, layer
features, GGUF name). Adding one (a MoE feed-forward, a vision tower) is a new
module here plus its line in ``_BUILTIN``; everything that lists or checks
supported architectures (config reading, core.json validation, GGUF import, error
messages) reads this registry.
"""

from __future__ import annotations

from typing import Any, Mapping

from ...errors import FrontendError
from ..spec import ModelSpec
from . import llama, qwen2, qwen3
from .base import Architecture, Entry, LayerFeatures, Linear, Parallel, Weight

__all__ = ["Architecture", "Entry", "LayerFeatures", "Linear", "Parallel", "Weight", "for_gguf", "for_hf",
           "from_hf_config", "get", "gguf_names", "hf_names", "names", "register"]

_BY_FAMILY: dict[str, Architecture] = {}
_BY_HF: dict[str, Architecture] = {}


def register(architecture: Architecture) -> Architecture:
    """Add a family; ValueError when its family or a Hugging Face name is already claimed."""
    if not architecture.family or architecture.family in _BY_FAMILY:
        raise ValueError(f"architecture family {architecture.family!r} is empty or already registered")
    claimed = [name for name in architecture.hf_architectures if name in _BY_HF]
    if claimed:
        raise ValueError(f"{', '.join(claimed)} already claimed by {_BY_HF[claimed[0]].family}")
    _BY_FAMILY[architecture.family] = architecture
    for name in architecture.hf_architectures:
        _BY_HF[name] = architecture
    return architecture


def get(family: str) -> Architecture:
    """The registered family ``family`` (a recipe's ``family``); KeyError naming the registered ones."""
    try:
        return _BY_FAMILY[family]
    except KeyError:
        raise KeyError(f"unknown architecture family {family!r}; registered: {', '.join(_BY_FAMILY)}") from None


def names() -> tuple[str, ...]:
    """Registered family names, in registration order."""
    return tuple(_BY_FAMILY)


def hf_names() -> tuple[str, ...]:
    """Every Hugging Face ``architectures`` name a family claims (the supported list in messages)."""
    return tuple(_BY_HF)


def gguf_names() -> tuple[str, ...]:
    """Every GGUF ``general.architecture`` a family imports from."""
    return tuple(a.gguf_architecture for a in _BY_FAMILY.values() if a.gguf_architecture)


def for_hf(name: str) -> Architecture | None:
    """The family claiming the config.json architecture ``name``, or None."""
    return _BY_HF.get(name)


def for_gguf(name: str) -> Architecture | None:
    """The family importing GGUF files of ``general.architecture`` ``name``, or None."""
    return next((a for a in _BY_FAMILY.values() if a.gguf_architecture == name), None)


def from_hf_config(config: Mapping[str, Any]) -> ModelSpec:
    """A spec from a Hugging Face config.json mapping: its first claimed architecture decides
    the family. FrontendError naming it and the supported list when none is claimed."""
    archs = config.get("architectures") or []
    name = next((a for a in archs if a in _BY_HF), None)
    if name is None:
        named = ", ".join(archs) if archs else f"model_type {config.get('model_type')!r}"
        raise FrontendError(f"unsupported architecture {named}; supported: {', '.join(_BY_HF)}")
    return _BY_HF[name].spec(config, name)


_BUILTIN = (llama.ARCHITECTURE, qwen2.ARCHITECTURE, qwen3.ARCHITECTURE)
for _architecture in _BUILTIN:
    register(_architecture)
