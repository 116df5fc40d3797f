"""core.json's structure: every field's type and range, checked before anything is built from it.

A refusal is a CoreError naming core.json and the field by its dotted path
(``contract.page_tokens must be a positive integer, got 0``). Only core.json is
read here; the files it lists are checked in flare/core/layout.py (weights) and
flare/core/format.py (sizes and hashes).
"""

from __future__ import annotations

import json
import re
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any, Mapping

from ..config import MAX_ACTIVE_LIMIT, PAGE_TOKENS
from ..errors import CoreError
from ..model import architectures
from ..model.spec import ModelSpec
from ..request import GENERATION_KEYS, generation_problem

DTYPES = ("float32", "bfloat16", "float16")
SHA256 = re.compile(r"[0-9a-f]{64}")
TEMPLATE_ASSET = "chat_template.jinja"
CONTRACT_FIELDS = ("context", "max_active", "prefill_chunk_size", "page_tokens", "served_names",
                   "context_hint", "capacity_hint", "frontend", "mixed_prefill")
RECIPE_COUNTS = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
                 "head_dim", "max_position_embeddings")
ROPE_SCALING_FIELDS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def _shown(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class _Fields:
    """Typed reads of one JSON object of core.json; ``prefix`` is its dotted path."""

    def __init__(self, file: Path, data: Any, prefix: str):
        self.file, self.prefix = file, prefix
        if not isinstance(data, dict):
            self.fail("", f"must be a JSON object, got {_shown(data)}")
        self.data: dict[str, Any] = data

    def name(self, key: str) -> str:
        return f"{self.prefix}.{key}" if self.prefix and key else (self.prefix or key)

    def fail(self, key: str, problem: str):
        field = self.name(key)
        raise CoreError(self.file, f"{field} {problem}" if field else problem, field=field or None)

    def get(self, key: str, default: Any = MISSING) -> Any:
        if key not in self.data:
            if default is MISSING:
                self.fail(key, "is missing")
            return default
        return self.data[key]

    def count(self, key: str, *, low: int = 1, high: int | None = None, default: Any = MISSING) -> int:
        value = self.get(key, default)
        if high is not None and not (_is_int(value) and low <= value <= high):
            self.fail(key, f"must be an integer from {low} to {high}, got {_shown(value)}")
        if not (_is_int(value) and value >= low):
            kind = "a positive integer" if low == 1 else f"an integer of at least {low}"
            self.fail(key, f"must be {kind}, got {_shown(value)}")
        return value

    def positive(self, key: str) -> float:
        value = self.get(key)
        if not (_is_number(value) and value > 0):
            self.fail(key, f"must be a positive number, got {_shown(value)}")
        return value

    def flag(self, key: str, default: Any = MISSING) -> bool:
        value = self.get(key, default)
        if not isinstance(value, bool):
            self.fail(key, f"must be true or false, got {_shown(value)}")
        return value

    def text(self, key: str, *, nullable: bool = False, nonempty: bool = False, default: Any = MISSING):
        value = self.get(key, default)
        if value is None and nullable:
            return None
        if not isinstance(value, str) or (nonempty and not value):
            kind = "a non-empty string" if nonempty else "a string"
            self.fail(key, f"must be {kind}{' or null' if nullable else ''}, got {_shown(value)}")
        return value

    def token_ids(self, key: str, vocab_size: int, default: Any = MISSING) -> list[int]:
        value = self.get(key, default)
        if not (isinstance(value, list) and all(_is_int(t) and 0 <= t < vocab_size for t in value)):
            self.fail(key, f"must be a list of token ids below recipe.vocab_size {vocab_size}, got {_shown(value)}")
        return value

    def only(self, known) -> None:
        unknown = sorted(set(self.data) - set(known))
        if unknown:
            self.fail(unknown[0], "is not a field of this format version")


def check_manifest(file: Path, data: dict[str, Any]) -> None:
    """Refuse a manifest (already a flare-core object of this version) with a bad field."""
    top = _Fields(file, data, "")
    top.text("identifier", nonempty=True)
    dtype = top.get("dtype")
    if dtype not in DTYPES:
        top.fail("dtype", f"must be one of {', '.join(DTYPES)}, got {_shown(dtype)}")
    recipe = check_recipe(_Fields(file, top.get("recipe"), "recipe"))
    check_contract(_Fields(file, top.get("contract"), "contract"), recipe)
    check_generation(_Fields(file, top.get("generation", None) or {}, "generation"))
    check_assets(_Fields(file, top.get("assets"), "assets"))


def check_recipe(recipe: _Fields) -> dict[str, Any]:
    known = {f.name: f for f in fields(ModelSpec)}
    recipe.only(known)
    arch = recipe.text("architecture")
    claimant = architectures.for_hf(arch)
    if claimant is None:
        recipe.fail("architecture", f"must be one of {', '.join(architectures.hf_names())}, got {_shown(arch)}")
    family = recipe.text("family")
    if family != claimant.family:
        recipe.fail("family", f"must be {_shown(claimant.family)} for {arch}, got {_shown(family)}")
    dims = {key: recipe.count(key) for key in RECIPE_COUNTS}
    if dims["num_heads"] % dims["num_kv_heads"]:
        recipe.fail("num_heads", f"{dims['num_heads']} must be a multiple of "
                                 f"recipe.num_kv_heads {dims['num_kv_heads']}")
    if dims["head_dim"] % 2:
        recipe.fail("head_dim", f"must be even (rotary embeddings rotate halves), got {dims['head_dim']}")
    recipe.positive("rms_norm_eps")
    recipe.positive("rope_theta")
    recipe.flag("tie_word_embeddings")
    for key in ("qkv_bias", "qk_norm"):
        recipe.flag(key, default=known[key].default)
    scaling = recipe.get("rope_scaling", None)
    if scaling is not None:
        scaling = _Fields(recipe.file, scaling, "recipe.rope_scaling")
        scaling.only(ROPE_SCALING_FIELDS)
        for key in ROPE_SCALING_FIELDS[:3]:
            scaling.positive(key)
        scaling.count("original_max_position_embeddings")
    bos = recipe.get("bos_token_id", None)
    if bos is not None and not (_is_int(bos) and 0 <= bos < dims["vocab_size"]):
        recipe.fail("bos_token_id", f"must be null or a token id below recipe.vocab_size {dims['vocab_size']}, "
                                    f"got {_shown(bos)}")
    eos = recipe.token_ids("eos_token_ids", dims["vocab_size"], default=[])
    return {**dims, "eos_token_ids": eos}


def check_generation(generation: _Fields) -> None:
    """Request defaults: the keys of GENERATION_KEYS, each null or in the range a request may set."""
    generation.only(GENERATION_KEYS)
    for key, value in generation.data.items():
        problem = None if value is None else generation_problem(key, value)
        if problem is not None:
            generation.fail(key, f"{problem}, got {_shown(value)}")


def check_contract(contract: _Fields, recipe: Mapping[str, Any]) -> None:
    contract.only(CONTRACT_FIELDS)
    context = contract.count("context")
    contract.count("max_active", high=MAX_ACTIVE_LIMIT)
    page = contract.count("page_tokens", default=PAGE_TOKENS)
    if page != PAGE_TOKENS:
        contract.fail("page_tokens", f"must be {PAGE_TOKENS} (the page size this Flare runs), got {page}")
    chunk = contract.count("prefill_chunk_size")
    if chunk % page:
        contract.fail("prefill_chunk_size", f"must be a multiple of contract.page_tokens {page}, got {chunk}")
    if chunk > context:
        contract.fail("prefill_chunk_size", f"{chunk} exceeds contract.context {context}")
    names = contract.get("served_names", [])
    if not (isinstance(names, list) and all(isinstance(n, str) and n for n in names)):
        contract.fail("served_names", f"must be a list of non-empty strings, got {_shown(names)}")
    contract.flag("mixed_prefill", default=False)
    contract.text("context_hint", default="")
    contract.text("capacity_hint", default="")
    frontend = _Fields(contract.file, contract.get("frontend"), "contract.frontend")
    for key in ("bos_token", "eos_token", "pad_token", "unk_token", "tool_parser", "reasoning_parser"):
        frontend.text(key, nullable=True, default=None)
    if frontend.get("add_bos_token", None) is not None:
        frontend.flag("add_bos_token")
    eos = frontend.token_ids("eos_token_ids", recipe["vocab_size"], default=recipe["eos_token_ids"])
    if sorted(eos) != sorted(recipe["eos_token_ids"]):
        frontend.fail("eos_token_ids", f"{_shown(eos)} differs from recipe.eos_token_ids "
                                       f"{_shown(recipe['eos_token_ids'])}")
    template = _Fields(contract.file, frontend.get("template"), "contract.frontend.template")
    digest = template.get("sha256")
    if digest is not None and not (isinstance(digest, str) and SHA256.fullmatch(digest)):
        template.fail("sha256", f"must be null or 64 lowercase hex digits, got {_shown(digest)}")


def check_assets(assets: _Fields) -> None:
    for name, info in assets.data.items():
        if name in ("", ".", "..", "core.json") or "/" in name or "\\" in name:
            assets.fail(name, "is not a file name of the core directory")
        entry = _Fields(assets.file, info, f"assets.{name}")
        entry.count("bytes", low=0)
        digest = entry.get("sha256")
        if not (isinstance(digest, str) and SHA256.fullmatch(digest)):
            entry.fail("sha256", f"must be 64 lowercase hex digits, got {_shown(digest)}")
        if name.startswith("weights") and not name.endswith(".safetensors"):
            assets.fail(name, "is a weights file but not a .safetensors file")
    if "tokenizer.json" not in assets.data:
        assets.fail("", "lists no tokenizer.json")
    if not any(name.startswith("weights") for name in assets.data):
        assets.fail("", "lists no weights-*.safetensors file")
