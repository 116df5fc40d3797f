"""flare export / load_core: atomic writes, fingerprints and clear errors."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import numpy as np
import pytest

from flare.config import EngineConfig
from flare.core.export import ExportOptions, export_core
from flare.core.format import load_core
from flare.errors import FrontendError
from flare.request import GenerationDefaults
from tests.model.harness import save_tiny_llama


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("ckpt"))


def _leftovers(parent):
    return [p.name for p in parent.iterdir() if p.name.startswith(".")]


def test_export_writes_a_verifiable_core(checkpoint, tmp_path):
    out = export_core(checkpoint, tmp_path / "core", ExportOptions(context=256, prefill_chunk_size=128,
                                                                   max_active=4, served_names=("tiny",)))
    core = load_core(out)
    assert core.identifier == checkpoint.name and core.contract.served_names == ("tiny",)
    assert set(core.assets) == {"weights-00001.safetensors", "tokenizer.json"}
    manifest = json.loads((out / "core.json").read_text())
    assert manifest["format"] == "flare-core" and manifest["format_version"] == 1
    assert _leftovers(tmp_path) == []
    # exporting the same core again onto it is a no-op
    export_core(checkpoint, out, ExportOptions(context=256, prefill_chunk_size=128, max_active=4,
                                               served_names=("tiny",)))


def test_output_holding_a_different_core_is_refused(checkpoint, tmp_path):
    out = export_core(checkpoint, tmp_path / "core", ExportOptions(context=256, prefill_chunk_size=128))
    before = (out / "core.json").read_bytes()
    with pytest.raises(FrontendError, match="already holds a different core"):
        export_core(checkpoint, out, ExportOptions(context=128, prefill_chunk_size=64))
    assert (out / "core.json").read_bytes() == before
    assert _leftovers(tmp_path) == []


def test_output_directory_with_other_files_is_refused(checkpoint, tmp_path):
    out = tmp_path / "busy"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(FrontendError, match="not a Flare core"):
        export_core(checkpoint, out, ExportOptions(context=256, prefill_chunk_size=128))
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


@pytest.mark.parametrize("options,message", [
    (ExportOptions(context=256, prefill_chunk_size=100), "multiple of 64"),
    (ExportOptions(context=256, prefill_chunk_size=512), "exceeds the context"),
    (ExportOptions(context=256, prefill_chunk_size=128, max_active=257), "max_active"),
    (ExportOptions(context=256, prefill_chunk_size=128, dtype="int4"), "unsupported dtype"),
])
def test_bad_options_are_refused_and_nothing_is_written(checkpoint, tmp_path, options, message):
    with pytest.raises(FrontendError, match=message):
        export_core(checkpoint, tmp_path / "core", options)
    assert not (tmp_path / "core").exists() and _leftovers(tmp_path) == []


def test_unsupported_architecture_names_it_and_lists_supported(checkpoint, tmp_path):
    bad = tmp_path / "ckpt"
    bad.mkdir()
    for f in checkpoint.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    config = json.loads((bad / "config.json").read_text())
    config["architectures"] = ["MambaForCausalLM"]
    (bad / "config.json").write_text(json.dumps(config))
    with pytest.raises(FrontendError) as info:
        export_core(bad, tmp_path / "core", ExportOptions(context=256, prefill_chunk_size=128))
    assert "MambaForCausalLM" in str(info.value) and "Qwen3ForCausalLM" in str(info.value)


def test_missing_tensor_is_named(checkpoint, tmp_path):
    from safetensors.torch import load_file, save_file
    bad = tmp_path / "ckpt"
    bad.mkdir()
    for f in checkpoint.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    weights = load_file(str(bad / "model.safetensors"))
    del weights["model.layers.1.mlp.down_proj.weight"]
    save_file(weights, str(bad / "model.safetensors"))
    with pytest.raises(FrontendError, match="model.layers.1.mlp.down_proj.weight"):
        export_core(bad, tmp_path / "core", ExportOptions(context=256, prefill_chunk_size=128))
    assert not (tmp_path / "core").exists()


def test_fingerprint_mismatch_and_missing_asset_on_load(checkpoint, tmp_path):
    out = export_core(checkpoint, tmp_path / "core", ExportOptions(context=256, prefill_chunk_size=128))
    tok = out / "tokenizer.json"
    data = bytearray(tok.read_bytes())
    data[10] ^= 1
    tok.write_bytes(bytes(data))
    with pytest.raises(FrontendError, match="fingerprint mismatch for core asset tokenizer.json"):
        load_core(out)
    tok.unlink()
    with pytest.raises(FrontendError, match="tokenizer.json: is missing"):
        load_core(out)
    (out / "core.json").write_text("{not json")
    with pytest.raises(FrontendError, match="corrupt"):
        load_core(out)


def test_unsupported_gguf_tensor_type(tmp_path):
    import gguf
    path = tmp_path / "model.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    # 8 rows of one 256-element Q4_K block (144 bytes) each
    writer.add_tensor("token_embd.weight", np.zeros((8, 144), dtype=np.uint8),
                      raw_dtype=gguf.GGMLQuantizationType.Q4_K)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(FrontendError, match="unsupported GGUF tensor type Q4_K for token_embd.weight"):
        export_core(path, tmp_path / "core", ExportOptions(context=256, prefill_chunk_size=128))
    assert not (tmp_path / "core").exists() and _leftovers(tmp_path) == []


def test_cli_export_and_info(checkpoint, tmp_path):
    out = tmp_path / "core"
    run = subprocess.run([sys.executable, "-m", "flare.cli", "export", str(checkpoint), "-o", str(out),
                          "--context", "256", "--prefill-chunk-size", "128", "--served-name", "tiny"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    info = subprocess.run([sys.executable, "-m", "flare.cli", "info", str(out)], capture_output=True, text=True)
    assert info.returncode == 0 and "LlamaForCausalLM" in info.stdout
    assert "mixed prefill: off" in info.stdout
    bad = subprocess.run([sys.executable, "-m", "flare.cli", "export", str(checkpoint), "-o", str(tmp_path / "x"),
                          "--prefill-chunk-size", "100"], capture_output=True, text=True)
    assert bad.returncode == 2 and "multiple of 64" in bad.stderr


def test_cli_export_mixed_prefill_is_recorded_shown_and_captured(checkpoint, tmp_path):
    """`flare export --mixed-prefill` records the contract flag, `flare info` shows it and a
    load builds the MIXED graphs (decode widths 0, 1, 2, 4 beside 8 packed prefill rows)."""
    from flare.contract import GraphKind
    from flare.model.loader import load_model

    out = tmp_path / "core"
    run = subprocess.run([sys.executable, "-m", "flare.cli", "export", str(checkpoint), "-o", str(out),
                          "--context", "256", "--prefill-chunk-size", "128", "--max-active", "4",
                          "--mixed-prefill"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert json.loads((out / "core.json").read_text())["contract"]["mixed_prefill"] is True
    info = subprocess.run([sys.executable, "-m", "flare.cli", "info", str(out)], capture_output=True, text=True)
    assert "mixed prefill: on" in info.stdout
    graphs = load_model(load_core(out), EngineConfig(device="cpu", kv_memory_bytes=16 << 20)).contract.graphs
    mixed = {(g.width, g.tokens, g.greedy) for g in graphs if g.kind == GraphKind.MIXED}
    assert mixed == {(w, 128, greedy) for w in (0, 1, 2, 4) for greedy in (False, True)}


# -- generation defaults ------------------------------------------------------------------------

GENERATION_CONFIG = {"bos_token_id": 1, "eos_token_id": 2, "do_sample": True, "temperature": 0.6, "top_p": 0.95,
                     "top_k": 20, "min_p": 0, "repetition_penalty": 1.05, "max_new_tokens": 512, "typical_p": None}


def _with_generation_config(checkpoint, tmp_path, values):
    out = tmp_path / "ckpt"
    out.mkdir()
    for f in checkpoint.iterdir():
        (out / f.name).write_bytes(f.read_bytes())
    (out / "generation_config.json").write_text(json.dumps(values))
    return out


def test_export_records_generation_defaults_and_overrides_win(checkpoint, tmp_path):
    source = _with_generation_config(checkpoint, tmp_path, GENERATION_CONFIG)
    out = export_core(source, tmp_path / "core", ExportOptions(
        context=256, prefill_chunk_size=128, generation=(("temperature", 0.3), ("max_new_tokens", 100))))
    expected = {"temperature": 0.3, "top_p": 0.95, "top_k": 20, "min_p": 0.0, "repetition_penalty": 1.05,
                "max_new_tokens": 100}
    assert json.loads((out / "core.json").read_text())["generation"] == expected
    assert load_core(out).generation == GenerationDefaults(**expected)
    # without generation_config.json sampling values or overrides, nothing is recorded
    plain = export_core(checkpoint, tmp_path / "plain", ExportOptions(context=256, prefill_chunk_size=128))
    assert load_core(plain).generation.is_empty


def test_a_bad_source_value_names_the_file_unless_overridden(checkpoint, tmp_path):
    source = _with_generation_config(checkpoint, tmp_path, {**GENERATION_CONFIG, "top_p": 0})
    with pytest.raises(FrontendError) as info:
        export_core(source, tmp_path / "core", ExportOptions(context=256, prefill_chunk_size=128))
    assert str(info.value) == (f"{source / 'generation_config.json'}: top_p must be a number above 0 and at most 1, "
                               "got 0 (override it with --generation top_p=VALUE)")
    assert not (tmp_path / "core").exists() and _leftovers(tmp_path) == []
    out = export_core(source, tmp_path / "core", ExportOptions(context=256, prefill_chunk_size=128,
                                                               generation=(("top_p", 0.9),)))
    assert load_core(out).generation.top_p == 0.9


@pytest.mark.parametrize("generation,message", [
    ((("temperature", 3),), "--generation: temperature must be a number from 0 to 2, got 3"),
    ((("seed", 1),), "--generation: 'seed' is not a generation default"),
])
def test_bad_generation_options_are_refused(checkpoint, tmp_path, generation, message):
    with pytest.raises(FrontendError, match=message):
        export_core(checkpoint, tmp_path / "core", ExportOptions(context=256, prefill_chunk_size=128,
                                                                 generation=generation))
    assert not (tmp_path / "core").exists()


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "flare.cli", *args], capture_output=True, text=True, timeout=300)


def test_cli_export_generation(checkpoint, tmp_path):
    out = tmp_path / "core"
    run = _cli("export", str(checkpoint), "-o", str(out), "--context", "256", "--prefill-chunk-size", "128",
               "--generation", "temperature=0.7", "--generation", "top_k=40", "--generation", "max_new_tokens=64")
    assert run.returncode == 0, run.stderr
    assert load_core(out).generation == GenerationDefaults(temperature=0.7, top_k=40, max_new_tokens=64)
    info = _cli("info", str(out))
    assert info.returncode == 0 and "generation defaults: temperature 0.7, top_k 40, max_new_tokens 64" in info.stdout
    for item, needle in (("seed=1", "expected KEY=VALUE with KEY one of temperature, top_p"),
                         ("temperature", "expected KEY=VALUE"),
                         ("temperature=warm", "'warm' is not a number"),
                         ("top_k=2.5", "top_k must be an integer of at least -1, got 2.5"),
                         ("top_p=0", "top_p must be a number above 0 and at most 1, got 0")):
        bad = _cli("export", str(checkpoint), "-o", str(tmp_path / "x"), "--context", "256",
                   "--prefill-chunk-size", "128", "--generation", item)
        lines = bad.stderr.strip().splitlines()
        assert bad.returncode == 2 and len(lines) == 1 and lines[0].startswith("flare: error: "), bad.stderr
        assert needle in lines[0], lines[0]
        assert not (tmp_path / "x").exists()


def _gguf_with_metadata(source, path, metadata: dict) -> None:
    """A copy of ``source`` with ``metadata`` ({key: (GGUFValueType, value)}) added, through gguf-py's own
    gguf_new_metadata."""
    import gguf
    from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata
    reader = gguf.GGUFReader(str(source))
    writer = gguf.GGUFWriter(str(path), reader.fields["general.architecture"].contents(), endianess=reader.endianess)
    copy_with_new_metadata(reader, writer, {k: MetadataDetails(t, v) for k, (t, v) in metadata.items()}, [])


def test_gguf_sampling_metadata_becomes_generation_defaults(tmp_path):
    import gguf

    from flare import fixtures
    from flare.core.gguf import sampling_defaults
    smollm2 = fixtures.smollm2_gguf()
    assert sampling_defaults(gguf.GGUFReader(str(smollm2))) == {}  # the demo's GGUF carries none
    kind = gguf.GGUFValueType
    path = tmp_path / "sampled.gguf"
    _gguf_with_metadata(smollm2, path, {
        "general.sampling.temp": (kind.FLOAT32, 0.7), "general.sampling.top_k": (kind.INT32, 40),
        "general.sampling.top_p": (kind.FLOAT32, 0.95), "general.sampling.min_p": (kind.FLOAT32, 0.05),
        "general.sampling.penalty_repeat": (kind.FLOAT32, 1.1), "general.sampling.mirostat": (kind.UINT8, 2)})
    out = export_core(path, tmp_path / "core", ExportOptions(context=256, prefill_chunk_size=128,
                                                             generation=(("top_p", 0.8),)))
    assert load_core(out).generation == GenerationDefaults(temperature=0.7, top_p=0.8, top_k=40, min_p=0.05,
                                                           repetition_penalty=1.1)


# -- flare export --chat-template: the given template is exported, fingerprinted, and refused
# (with its line and column) when it does not compile.

TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def _cli_export(checkpoint, out, *extra):
    return subprocess.run([sys.executable, "-m", "flare.cli", "export", str(checkpoint), "-o", str(out),
                           "--context", "256", "--prefill-chunk-size", "128", *extra],
                          capture_output=True, text=True)


def test_exported_template_is_the_given_file(checkpoint, tmp_path):
    template = tmp_path / "chat.jinja"
    template.write_text(TEMPLATE, encoding="utf-8")
    run = _cli_export(checkpoint, tmp_path / "core", "--chat-template", str(template))
    assert run.returncode == 0, run.stderr
    core = load_core(tmp_path / "core")
    digest = hashlib.sha256(TEMPLATE.encode()).hexdigest()
    assert core.chat_template == TEMPLATE and core.assets["chat_template.jinja"]["sha256"] == digest
    manifest = json.loads((tmp_path / "core" / "core.json").read_text())
    assert manifest["contract"]["frontend"]["template"]["sha256"] == digest


def test_a_template_that_does_not_compile_stops_the_cli_export(checkpoint, tmp_path):
    template = tmp_path / "bad.jinja"
    template.write_text("fine\n{% for m in messages %}{{ m.content + }}{% endfor %}", encoding="utf-8")
    run = _cli_export(checkpoint, tmp_path / "core", "--chat-template", str(template))
    assert run.returncode == 2 and "line 2, column" in run.stderr and str(template) in run.stderr
    assert not (tmp_path / "core").exists()
    missing = _cli_export(checkpoint, tmp_path / "core2", "--chat-template", str(tmp_path / "nope.jinja"))
    assert missing.returncode == 2 and "cannot read chat template" in missing.stderr


# -- output parsers: chosen from the exported template, recorded in core.json, shown by info

def test_export_records_the_parsers_the_template_implies_and_info_shows_them(checkpoint, tmp_path):
    from flare import fixtures

    template = fixtures.ensure_fixtures() / "templates" / "Qwen-Qwen3-0.6B.jinja"
    run = _cli_export(checkpoint, tmp_path / "core", "--chat-template", str(template))
    assert run.returncode == 0, run.stderr
    assert "output parsers: tool calls hermes, reasoning think" in run.stderr + run.stdout
    frontend = json.loads((tmp_path / "core" / "core.json").read_text())["contract"]["frontend"]
    assert (frontend["tool_parser"], frontend["reasoning_parser"]) == ("hermes", "think")
    info = subprocess.run([sys.executable, "-m", "flare.cli", "info", str(tmp_path / "core"), "--no-verify"],
                          capture_output=True, text=True)
    assert info.returncode == 0 and "output parsers: tool calls hermes, reasoning think" in info.stdout
    override = _cli_export(checkpoint, tmp_path / "core2", "--chat-template", str(template), "--tool-parser",
                           "none", "--reasoning-parser", "none")
    frontend = json.loads((tmp_path / "core2" / "core.json").read_text())["contract"]["frontend"]
    assert override.returncode == 0 and (frontend["tool_parser"], frontend["reasoning_parser"]) == (None, None)
    unknown = _cli_export(checkpoint, tmp_path / "core3", "--tool-parser", "nope")
    assert unknown.returncode == 2 and "no tool parser named 'nope'" in unknown.stderr
