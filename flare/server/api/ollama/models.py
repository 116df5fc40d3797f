"""What Ollama's discovery routes say about the served model: /api/tags, /api/show, /api/ps, /api/version.

Ollama names models ``name:tag``; a name without a tag means ``:latest``, so
``smollm2`` and ``smollm2:latest`` are the same model, and every served name
(the card's id, its served names, the checkpoint identifier) is listed and
resolves. The details come from the card (``ModelCard.details``): the
architecture family, the parameter count, the weights' dtype as the
quantization level, the served context and the chat template. The template
is the core's Jinja source, not a Go template, and the "modelfile" is a
description in Modelfile syntax, not a file Ollama could build from.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .... import __version__
from ....request import ModelCard
from ...request_body import shorten
from .format import timestamp

if TYPE_CHECKING:
    from ...app import ServerState

# The Ollama API release whose shapes these routes follow (/api/version; clients gate features on it).
OLLAMA_API_VERSION = "0.12.0"
# A loaded model never expires here: it stays while the server runs.
NEVER_EXPIRES = "9999-12-31T23:59:59Z"
QUANTIZATION_LEVELS = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}
# Ollama option name of each generation default (flare/request.py GENERATION_KEYS).
DEFAULT_OPTIONS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
                   "repetition_penalty": "repeat_penalty", "max_new_tokens": "num_predict"}
# model_info keys (GGUF metadata names, under the family) of the recipe's hyperparameters.
MODEL_INFO_KEYS = (("hidden_size", "embedding_length"), ("num_layers", "block_count"),
                   ("intermediate_size", "feed_forward_length"), ("num_heads", "attention.head_count"),
                   ("num_kv_heads", "attention.head_count_kv"), ("head_dim", "attention.key_length"),
                   ("head_dim", "attention.value_length"), ("rms_norm_eps", "attention.layer_norm_rms_epsilon"),
                   ("rope_theta", "rope.freq_base"), ("vocab_size", "vocab_size"))


def with_tag(name: str) -> str:
    """``name`` with ``:latest`` when its last path segment has no tag."""
    return name if ":" in name.rsplit("/", 1)[-1] else name + ":latest"


def served_names(card: ModelCard) -> list[str]:
    """Every name the model answers to, tagged, the card's id first."""
    names: list[str] = []
    for name in (card.id, *card.served_names, card.identifier):
        if name and with_tag(name) not in names:
            names.append(with_tag(name))
    return names


def is_served(card: ModelCard, name: str) -> bool:
    return with_tag(name) in served_names(card)


def not_found(name: str) -> str:
    return f"model '{shorten(name)}' not found"


def parameter_size(num_params: int) -> str:
    """Ollama's short form: 134.5M, 7.6B ("" when unknown)."""
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if num_params >= scale:
            return f"{num_params / scale:.1f}{suffix}"
    return str(num_params) if num_params else ""


def capabilities(state: "ServerState") -> list[str]:
    """The card's (completion, chat), tools when the template renders them, thinking with a reasoning parser."""
    out = list(state.card.capabilities)
    if "chat" in out and state.card.details.renders_tools:
        out.append("tools")
    if supports_thinking(state):
        out.append("thinking")
    return out


def supports_thinking(state: "ServerState") -> bool:
    """Only an output parser beyond plain can report reasoning apart from the answer."""
    return state.reasoning_parser is not None


def details(card: ModelCard) -> dict[str, Any]:
    info = card.details
    family = info.family
    return {"parent_model": "", "format": "flare-core", "family": family, "families": [family] if family else None,
            "parameter_size": parameter_size(info.num_params),
            "quantization_level": QUANTIZATION_LEVELS.get(info.dtype, info.dtype.upper())}


def _entry(card: ModelCard, name: str) -> dict[str, Any]:
    return {"name": name, "model": name, "modified_at": timestamp(card.created), "size": card.details.weights_bytes,
            "digest": card.details.digest, "details": details(card)}


def tags(state: "ServerState") -> dict[str, Any]:
    """/api/tags: the one model, once under each of its names."""
    return {"models": [_entry(state.card, name) for name in served_names(state.card)]}


def processes(state: "ServerState") -> dict[str, Any]:
    """/api/ps: the loaded model (always loaded), its size and context."""
    card = state.card
    size = card.details.weights_bytes
    entry = {**_entry(card, served_names(card)[0]), "expires_at": NEVER_EXPIRES,
             "size_vram": size if card.details.device.startswith("cuda") else 0,
             "context_length": card.max_model_len}
    entry.pop("modified_at")
    return {"models": [entry]}


def version() -> dict[str, str]:
    return {"version": OLLAMA_API_VERSION, "flare": __version__}


def show(state: "ServerState") -> dict[str, Any]:
    """/api/show: modelfile-like details, parameters, template, capabilities, model_info."""
    card = state.card
    info = card.details
    defaults = state.generation_defaults.to_json()
    parameters = [f"{DEFAULT_OPTIONS[key]} {value}" for key, value in defaults.items()]
    parameters.append(f"num_ctx {card.max_model_len}")
    template = info.chat_template or ""
    modelfile = ["# The model Flare serves, in Modelfile syntax: FROM names the checkpoint of a prepared core,",
                 "# TEMPLATE is its Jinja chat template (not a Go template).", f"FROM {card.identifier}"]
    if template:
        modelfile.append(f'TEMPLATE """{template}"""')
    modelfile.extend(f"PARAMETER {line}" for line in parameters)
    family = info.family or "unknown"
    model_info: dict[str, Any] = {"general.architecture": family, "general.basename": card.identifier,
                                  "general.parameter_count": info.num_params,
                                  f"{family}.context_length": card.max_model_len}
    for key, name in MODEL_INFO_KEYS:
        if key in info.hyperparameters:
            model_info[f"{family}.{name}"] = info.hyperparameters[key]
    return {"modelfile": "\n".join(modelfile) + "\n", "parameters": "\n".join(parameters), "template": template,
            "details": details(card), "model_info": model_info, "capabilities": capabilities(state),
            "modified_at": timestamp(card.created)}
