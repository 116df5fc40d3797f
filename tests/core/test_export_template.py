"""flare export --chat-template: the given template is exported, fingerprinted, and refused
(with its line and column) when it does not compile."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from flare.core.format import load_core
from tests.model.harness import save_tiny

TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2,
                                         max_position_embeddings=256))
    return save_tiny(model, tmp_path_factory.mktemp("ckpt"))


def _export(checkpoint, out, *extra):
    return subprocess.run([sys.executable, "-m", "flare.cli", "export", str(checkpoint), "-o", str(out),
                           "--context", "256", "--prefill-chunk-size", "128", *extra],
                          capture_output=True, text=True)


def test_exported_template_is_the_given_file(checkpoint, tmp_path):
    template = tmp_path / "chat.jinja"
    template.write_text(TEMPLATE, encoding="utf-8")
    run = _export(checkpoint, tmp_path / "core", "--chat-template", str(template))
    assert run.returncode == 0, run.stderr
    core = load_core(tmp_path / "core")
    digest = hashlib.sha256(TEMPLATE.encode()).hexdigest()
    assert core.chat_template == TEMPLATE and core.assets["chat_template.jinja"]["sha256"] == digest
    manifest = json.loads((tmp_path / "core" / "core.json").read_text())
    assert manifest["contract"]["frontend"]["template"]["sha256"] == digest


def test_a_template_that_does_not_compile_stops_the_export(checkpoint, tmp_path):
    template = tmp_path / "bad.jinja"
    template.write_text("fine\n{% for m in messages %}{{ m.content + }}{% endfor %}", encoding="utf-8")
    run = _export(checkpoint, tmp_path / "core", "--chat-template", str(template))
    assert run.returncode == 2 and "line 2, column" in run.stderr and str(template) in run.stderr
    assert not (tmp_path / "core").exists()
    missing = _export(checkpoint, tmp_path / "core2", "--chat-template", str(tmp_path / "nope.jinja"))
    assert missing.returncode == 2 and "cannot read chat template" in missing.stderr
