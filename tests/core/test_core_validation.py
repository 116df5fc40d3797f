"""Cores that must be refused are refused at load, as a CoreError naming the file and the
field, and by `flare info`, `flare run` and `flare-serve` as one line on stderr and exit 2."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from flare.core.export import ExportOptions, export_core
from flare.core.format import load_core
from flare.errors import CoreError, FrontendError
from flare.request import GenerationDefaults
from tests.model.harness import save_tiny_llama

WEIGHTS = "weights-00001.safetensors"
TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """A tiny exported core (2 layers, hidden 32) with a chat template."""
    checkpoint = save_tiny_llama(tmp_path_factory.mktemp("ckpt"))
    (checkpoint / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE, "eos_token": "t2"}))
    return export_core(checkpoint, tmp_path_factory.mktemp("cores") / "core",
                       ExportOptions(context=256, prefill_chunk_size=128, max_active=4, served_names=("tiny",)))


@pytest.fixture
def core(pristine, tmp_path) -> Path:
    return Path(shutil.copytree(pristine, tmp_path / "core"))


def _manifest(core: Path) -> dict:
    return json.loads((core / "core.json").read_text())


def _write_manifest(core: Path, manifest) -> None:
    (core / "core.json").write_text(json.dumps(manifest, indent=2))


def _refingerprint(core: Path, name: str) -> None:
    """Record ``name``'s new size and SHA-256 in core.json, as a careless editor would."""
    manifest = _manifest(core)
    data = (core / name).read_bytes()
    manifest["assets"][name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    _write_manifest(core, manifest)


def _edit_weights(core: Path, edit) -> None:
    weights = load_file(str(core / WEIGHTS))
    edit(weights)
    save_file(weights, str(core / WEIGHTS), metadata={"format": "flare"})
    _refingerprint(core, WEIGHTS)


def _edit_field(path: str | tuple[str, ...], value):
    """A damage that sets ``path`` of core.json (dotted, or a tuple of keys) to ``value`` (None deletes it)."""
    def damage(core: Path) -> None:
        manifest = _manifest(core)
        *parents, key = path.split(".") if isinstance(path, str) else path
        node = manifest
        for p in parents:
            node = node[p]
        if value is None:
            del node[key]
        else:
            node[key] = value
        _write_manifest(core, manifest)
    return damage


def _write_raw(text: str):
    return lambda core: (core / "core.json").write_text(text)


def _retemplate(core: Path) -> None:
    (core / "chat_template.jinja").write_text(TEMPLATE + "{{ '<eos>' }}")
    _refingerprint(core, "chat_template.jinja")


def _drop(name: str):
    return lambda core: _edit_weights(core, lambda w: w.pop(name))


def _add(name: str, shape):
    return lambda core: _edit_weights(core, lambda w: w.__setitem__(name, torch.zeros(shape)))


def _reshape(name: str, shape):
    return lambda core: _edit_weights(core, lambda w: w.__setitem__(name, torch.zeros(shape)))


def _recast(name: str):
    return lambda core: _edit_weights(core, lambda w: w.__setitem__(name, w[name].to(torch.bfloat16)))


# name -> (damage, file the message names, what else it must say)
DAMAGES = {
    "layers_one_fewer_in_recipe": (_edit_field("recipe.num_layers", 1), WEIGHTS,
                                   "layers.1.* present but recipe.num_layers is 1"),
    "layers_one_more_in_recipe": (_edit_field("recipe.num_layers", 3), WEIGHTS,
                                  "layers.2.* missing: the weights hold 2 layers but recipe.num_layers is 3"),
    "intermediate_size_off": (_edit_field("recipe.intermediate_size", 48), WEIGHTS,
                        "tensor layers.0.gate_up has shape [128, 32] but the recipe gives [96, 32]"),
    "tensor_wrong_shape": (_reshape("layers.1.down", (32, 48)), WEIGHTS,
                           "tensor layers.1.down has shape [32, 48] but the recipe gives [32, 64]"),
    "tensor_wrong_dtype": (_recast("embed"), WEIGHTS, "tensor embed is BF16 but core.json dtype is float32"),
    "tensor_missing": (_drop("layers.1.mlp_norm"), WEIGHTS, "tensor layers.1.mlp_norm missing"),
    "lm_head_missing": (_drop("lm_head"), WEIGHTS, "tensor lm_head missing (recipe.tie_word_embeddings is false)"),
    "tensor_extra": (_add("layers.0.qkv_bias", (64,)), WEIGHTS,
                     "unexpected tensor layers.0.qkv_bias (recipe.qkv_bias is false)"),
    "tensor_unknown": (_add("rotary.inv_freq", (4,)), WEIGHTS, "unexpected tensor rotary.inv_freq"),
    "stale_contract_template_hash": (_retemplate, "core.json",
                                     "contract.frontend.template.sha256 is "),
    "template_asset_dropped": (_edit_field(("assets", "chat_template.jinja"), None), "core.json",
                               "contract.frontend.template.sha256 records a chat template but assets has no"),
    "manifest_a_list": (_write_raw("[1, 2]"), "core.json", "must hold a JSON object, got an array"),
    "manifest_a_string": (_write_raw('"core"'), "core.json", "must hold a JSON object, got a string"),
    "manifest_truncated": (_write_raw('{"format": "flare-core", "recipe": {'), "core.json", "not valid JSON"),
    "context_a_string": (_edit_field("contract.context", "256"), "core.json",
                         'contract.context must be a positive integer, got "256"'),
    "zero_page_tokens": (_edit_field("contract.page_tokens", 0), "core.json",
                         "contract.page_tokens must be a positive integer, got 0"),
    "other_page_tokens": (_edit_field("contract.page_tokens", 32), "core.json",
                          "contract.page_tokens must be 64 (the page size this Flare runs), got 32"),
    "negative_max_active": (_edit_field("contract.max_active", -1), "core.json",
                            "contract.max_active must be an integer from 1 to 256, got -1"),
    "chunk_not_a_page_multiple": (_edit_field("contract.prefill_chunk_size", 100), "core.json",
                                  "contract.prefill_chunk_size must be a multiple of contract.page_tokens 64"),
    "chunk_beyond_context": (_edit_field("contract.prefill_chunk_size", 512), "core.json",
                             "contract.prefill_chunk_size 512 exceeds contract.context 256"),
    "served_name_not_a_string": (_edit_field("contract.served_names", ["tiny", 7]), "core.json",
                                 "contract.served_names must be a list of non-empty strings"),
    "unknown_contract_field": (_edit_field("contract.graphs", 3), "core.json",
                               "contract.graphs is not a field of this format version"),
    "unknown_format_version": (_edit_field("format_version", 2), "core.json",
                               "format_version is 2; this Flare reads 1"),
    "unknown_dtype": (_edit_field("dtype", "int4"), "core.json", 'dtype must be one of float32, bfloat16, float16'),
    "heads_not_multiple_of_kv_heads": (_edit_field("recipe.num_kv_heads", 3), "core.json",
                                       "recipe.num_heads 4 must be a multiple of recipe.num_kv_heads 3"),
    "zero_hidden_size": (_edit_field("recipe.hidden_size", 0), "core.json",
                         "recipe.hidden_size must be a positive integer, got 0"),
    "float_layer_count": (_edit_field("recipe.num_layers", 2.0), "core.json",
                          "recipe.num_layers must be a positive integer, got 2.0"),
    "recipe_missing_field": (_edit_field("recipe.vocab_size", None), "core.json", "recipe.vocab_size is missing"),
    "eos_beyond_vocab": (_edit_field("recipe.eos_token_ids", [999]), "core.json",
                         "recipe.eos_token_ids must be a list of token ids below recipe.vocab_size 128"),
    "generation_temperature_too_high": (_edit_field("generation.temperature", 5), "core.json",
                                        "generation.temperature must be a number from 0 to 2, got 5"),
    "generation_top_p_zero": (_edit_field("generation.top_p", 0), "core.json",
                              "generation.top_p must be a number above 0 and at most 1, got 0"),
    "generation_top_k_float": (_edit_field("generation.top_k", 40.0), "core.json",
                               "generation.top_k must be an integer of at least -1, got 40.0"),
    "generation_max_new_tokens_zero": (_edit_field("generation.max_new_tokens", 0), "core.json",
                                       "generation.max_new_tokens must be an integer of at least 1, got 0"),
    "generation_penalty_a_string": (_edit_field("generation.repetition_penalty", "1.1"), "core.json",
                                    'generation.repetition_penalty must be a number from 0.001 to 10, got "1.1"'),
    "generation_unknown_key": (_edit_field("generation.do_sample", True), "core.json",
                               "generation.do_sample is not a field of this format version"),
    "generation_not_an_object": (_edit_field("generation", "greedy"), "core.json",
                                 'generation must be a JSON object, got "greedy"'),
    "bad_asset_digest": (_edit_field(("assets", WEIGHTS, "sha256"), "abc"), "core.json",
                         f"assets.{WEIGHTS}.sha256 must be 64 lowercase hex digits"),
    "asset_outside_the_core": (_edit_field(("assets", "../secret"), {"bytes": 1, "sha256": "0" * 64}), "core.json",
                               "assets.../secret is not a file name of the core directory"),
    "weights_missing": (lambda core: (core / WEIGHTS).unlink(), WEIGHTS,
                        f"is missing (core.json assets.{WEIGHTS} lists it)"),
    "weights_truncated": (lambda core: (core / WEIGHTS).write_bytes((core / WEIGHTS).read_bytes()[:5000]), WEIGHTS,
                          f"has 5000 bytes but core.json assets.{WEIGHTS}.bytes records"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_damaged_core_is_refused_naming_file_and_field(core, damage):
    edit, file, message = DAMAGES[damage]
    edit(core)
    with pytest.raises(CoreError) as info:
        load_core(core)
    text = str(info.value)
    assert text.startswith(str(core / file) + ": ") and message in text, text
    assert isinstance(info.value, FrontendError) and info.value.file == str(core / file)
    # the cheap checks do not depend on the SHA-256 pass
    with pytest.raises(CoreError, match="^" + str(core / file)):
        load_core(core, verify=False)


def test_asset_edited_without_refingerprinting_is_refused(core):
    (core / "chat_template.jinja").write_text(TEMPLATE.replace("<", "["))
    with pytest.raises(CoreError, match="fingerprint mismatch for core asset chat_template.jinja"):
        load_core(core)
    # without --verify, the template is still hashed: the contract fingerprints it
    with pytest.raises(CoreError, match="fingerprint mismatch for core asset chat_template.jinja"):
        load_core(core, verify=False)


def test_undamaged_core_loads(core):
    loaded = load_core(core)
    assert loaded.recipe.num_layers == 2 and loaded.contract.page_tokens == 64
    assert loaded.chat_template == TEMPLATE


def test_recorded_generation_defaults_load_typed(core):
    _edit_field("generation", {"temperature": 1, "top_k": -1, "max_new_tokens": 32, "min_p": None})(core)
    assert load_core(core).generation == GenerationDefaults(temperature=1.0, top_k=-1, max_new_tokens=32)


def _cli(*args: str, entry: str = "main") -> subprocess.CompletedProcess:
    code = f"import sys; from flare.cli import {entry}; sys.exit({entry}(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60)


def test_cli_info_prints_an_undamaged_core(core):
    run = _cli("info", str(core))
    assert run.returncode == 0, run.stderr
    assert "LlamaForCausalLM, 2 layers, hidden 32" in run.stdout and "served names tiny" in run.stdout
    assert "generation defaults: none (requests get OpenAI's)" in run.stdout


CLI_DAMAGES = ["layers_one_fewer_in_recipe", "tensor_wrong_shape", "stale_contract_template_hash",
               "manifest_a_list", "zero_page_tokens", "weights_missing", "generation_top_p_zero"]


@pytest.mark.parametrize("damage", CLI_DAMAGES)
def test_cli_refuses_in_one_line(core, damage):
    edit, file, message = DAMAGES[damage]
    edit(core)
    for args, entry, prog in ((("info", str(core)), "main", "flare"),
                              (("run", str(core), "--port", "0", "--device", "cpu"), "main", "flare"),
                              ((str(core), "--port", "0", "--device", "cpu"), "serve_main", "flare-serve")):
        run = _cli(*args, entry=entry)
        assert run.returncode == 2, (args, run.stderr)
        assert "Traceback" not in run.stderr and run.stdout == ""
        lines = run.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: {core / file}: "), run.stderr
        assert message in lines[0]
        if entry == "serve_main" or args[0] == "run":
            assert "listening" not in run.stderr
