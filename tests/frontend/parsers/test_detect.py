"""detect() over real chat templates, and reasoning_opened() over the prompts they render."""

from __future__ import annotations

from pathlib import Path

import pytest

from flare.frontend.parsers import detect, get, reasoning_opened, reasoning_parser_names, tool_parser_names
from flare.frontend.template import compile_template

# What each template of a family this package reads must give (file stem -> parsers).
PINNED = {
    "Qwen-Qwen2.5-7B-Instruct": ("hermes", None),
    "Qwen-Qwen3-0.6B": ("hermes", "think"),
    "Qwen-QwQ-32B": ("hermes", "think"),
    "ollama-qwen3-next-80b": ("hermes", "think"),
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use": ("hermes", None),
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use": ("hermes", None),
    "ibm-granite-granite-4.0": ("hermes", None),
    "ibm-granite-granite-4.1": ("hermes", None),
    "HuggingFaceTB-SmolLM3-3B": (None, "think"),  # this copy renders no tool calls
    "meta-llama-Llama-3.1-8B-Instruct": ("llama3_json", None),
    "meta-llama-Llama-3.2-3B-Instruct": ("llama3_json", None),
    "meta-llama-Llama-3.3-70B-Instruct": ("llama3_json", None),
    "tool_chat_template_llama3.1_json": ("llama3_json", None),
    "mistralai-Mistral-Nemo-Instruct-2407": ("mistral", None),
    "Mistral-Small-3.2-24B-Instruct-2506": ("mistral", None),
    "unsloth-mistral-Devstral-Small-2507": ("mistral", None),
    "mistralai-Ministral-3-14B-Reasoning-2512": ("mistral", "mistral_think"),
    "deepseek-ai-DeepSeek-V3.1": ("deepseek_v31", "think"),
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": ("deepseek_v3", "think"),
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B": ("deepseek_v3", "think"),
    "ollama-deepseek-r1-latest": ("deepseek_v3", "think"),
    "ollama-deepseek-v3-671b": ("deepseek_v3", None),
    "ollama-granite3.3-2b": ("granite", "think"),
    "ibm-granite-granite-3.3-2B-Instruct": ("granite", "think"),
    "ollama-qwen3-coder-30b": ("qwen3_coder", None),
    "Qwen3-Coder": ("qwen3_coder", None),
    "Qwen3.5-4B": ("qwen3_coder", "think"),
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": ("qwen3_coder", "think"),
    "GLM-4.6": ("glm45", "think"),
    "moonshotai-Kimi-K2": ("kimi_k2", None),
    "moonshotai-Kimi-K2-Thinking": ("kimi_k2", "think"),
    # Templates with no syntax to read.
    "chatml": (None, None),
    "alpaca": (None, None),
    "zephyr": (None, None),
    "vicuna": (None, None),
    "google-gemma-2-2b-it": (None, None),
    "microsoft-Phi-3.5-mini-instruct": (None, None),
    "openai-gpt-oss-120b": (None, None),
    "meetkai-functionary-medium-v3.1": (None, None),
}


def _templates(*directories: Path | None) -> list[Path]:
    return sorted(path for directory in directories if directory for path in directory.glob("*.jinja"))


def _source(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def test_pinned_templates(template_dir, shared_template_dir):
    found = {path.stem: path for path in _templates(template_dir, shared_template_dir)}
    checked = 0
    for stem, expected in PINNED.items():
        for path in {found.get(stem)} - {None}:
            assert detect(_source(path)) == expected, path
            checked += 1
    assert checked >= 20  # the fixture templates alone hold most of them


def test_every_pinned_template_is_found_when_the_shared_corpus_is_present(template_dir, shared_template_dir):
    if shared_template_dir is None:
        pytest.skip("no ../shared/templates beside the checkout")
    found = {path.stem for path in _templates(template_dir, shared_template_dir)}
    assert set(PINNED) <= found


def test_every_template_gives_known_parsers_whose_markers_it_renders(template_dir, shared_template_dir):
    templates = _templates(template_dir, shared_template_dir)
    assert len(templates) >= 70
    for path in templates:
        source = _source(path)
        tool, reasoning = detect(source)
        assert tool is None or tool in tool_parser_names(), path
        assert reasoning is None or reasoning in reasoning_parser_names(), path
        if tool is not None and get(tool).markers:
            assert any(marker in source for marker in get(tool).markers), path
        if reasoning is not None:
            assert get(reasoning).open_tag in source or get(reasoning).close_tag in source, path


@pytest.mark.parametrize("stem, opened", [
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", True),
    ("Qwen-QwQ-32B", True),
    ("deepseek-ai-DeepSeek-V3.1", True),
    ("Qwen-Qwen3-0.6B", False),
    ("GLM-4.6", False),
])
def test_reasoning_opened_by_rendered_prompts(template_dir, shared_template_dir, stem, opened):
    messages = [{"role": "user", "content": "Hi"}]
    for directory in (template_dir, shared_template_dir):
        path = directory / f"{stem}.jinja" if directory else None
        if path is None or not path.exists():
            continue
        source = _source(path)
        template = compile_template(source)
        base = {"messages": messages, "add_generation_prompt": True, "bos_token": "<s>", "eos_token": "</s>"}
        on = template.render({**base, "enable_thinking": True, "thinking": True})
        off = template.render({**base, "enable_thinking": False, "thinking": False})
        assert reasoning_opened(on) is opened, path
        # Some copies always open the block; the others read a thinking switch.
        assert reasoning_opened(off) is (opened and "thinking" not in source), path


def test_reasoning_opened_reads_the_last_tags():
    assert reasoning_opened("<|im_start|>assistant\n<think>\n")
    assert not reasoning_opened("<think>\nold\n</think>\n\nanswer<|im_start|>assistant\n")
    assert reasoning_opened("<think>a</think> b <think>")
    assert not reasoning_opened("no tags")
    assert reasoning_opened("[THINK]", "[THINK]", "[/THINK]")
