"""flare export / load_core: atomic writes, fingerprints and clear errors."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from flare.core.export import ExportOptions, export_core
from flare.core.format import load_core
from flare.errors import FrontendError
from tests.model.harness import save_tiny


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2,
                                         max_position_embeddings=256))
    return save_tiny(model, tmp_path_factory.mktemp("ckpt"))


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
    (ExportOptions(context=256, prefill_chunk_size=128, max_active=65), "max_active"),
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
    bad = subprocess.run([sys.executable, "-m", "flare.cli", "export", str(checkpoint), "-o", str(tmp_path / "x"),
                          "--prefill-chunk-size", "100"], capture_output=True, text=True)
    assert bad.returncode == 2 and "multiple of 64" in bad.stderr
