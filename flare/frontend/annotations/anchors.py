"""How the bundled annotations are made: each mark goes right before an anchor.

Every entry names a template source and its marks as (regex anchor, which
match, mark text). A mark is inserted at the start of that match, so it runs
after everything the template emitted for a preamble or a message and before
the next tag. Marks that sit against a whitespace-stripping tag carry the same
``-`` so the rendered bytes do not change; tests check that against the
unannotated template on many conversations.

Regenerate ``bundled.json`` (needs the fixture templates and the SmolLM2 GGUF)::

    python -m flare.frontend.annotations.anchors
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from . import BUNDLED_FILE, Annotation, insert_marks, sha256_hex

MARK = "{% mark %}"
MARK_LEFT = "{%- mark %}"
MARK_BOTH = "{%- mark -%}"

# Anchors shared by several templates.
LOOP_END_BEFORE_GENERATION = r"\{%-\s*endfor\s*%\}\s*\{%-\s*if add_generation_prompt"
FOR_MESSAGES = r"\{%-\s*for message in messages\s*%\}"


@dataclass(frozen=True)
class AnchorSpec:
    """The marks of one template source."""

    name: str
    family: str
    source: str  # "fixture:<file>", "shared:<file>" or "gguf:smollm2"
    marks: tuple[tuple[str, int, str], ...]  # (regex, match index (-1 = last), mark text)


SPECS: tuple[AnchorSpec, ...] = (
    # ChatML. SmolLM2 adds its default system prompt inside the loop for the first message.
    AnchorSpec("smollm2", "chatml", "gguf:smollm2", (
        (r"\{% endif %\}\{\{'<\|im_start\|>'", 0, MARK),
        (r"\{% endfor %\}", 0, MARK))),
    AnchorSpec("chatml", "chatml", "shared:chatml.jinja", (
        (r"\{% endfor %\}", 0, MARK),)),
    AnchorSpec("qwen2.5", "qwen", "fixture:Qwen-Qwen2.5-7B-Instruct.jinja", (
        (FOR_MESSAGES, 0, MARK_LEFT),
        (LOOP_END_BEFORE_GENERATION, 0, MARK_LEFT))),
    # Qwen3: the preamble ends before the namespace that finds the last user query.
    AnchorSpec("qwen3", "qwen", "fixture:Qwen-Qwen3-0.6B.jinja", (
        (r"\{%-\s*set ns = namespace\(multi_step_tool", 0, MARK_LEFT),
        (LOOP_END_BEFORE_GENERATION, 0, MARK_LEFT))),
    AnchorSpec("llama3", "llama3", "shared:ollama-llama3-8b.jinja", (
        (r"\{% endfor %\}", 0, MARK),)),
    # Llama 3.1/3.2/3.3: system block, then the first user turn that carries the tools, then messages.
    AnchorSpec("llama3.1", "llama3", "fixture:meta-llama-Llama-3.1-8B-Instruct.jinja", (
        (r"\{#- Custom tools are passed", 0, MARK_LEFT),
        (FOR_MESSAGES, 0, MARK_LEFT),
        (LOOP_END_BEFORE_GENERATION, 0, MARK_LEFT))),
    AnchorSpec("llama3.2", "llama3", "fixture:meta-llama-Llama-3.2-3B-Instruct.jinja", (
        (r"\{#- Custom tools are passed", 0, MARK_LEFT),
        (FOR_MESSAGES, 0, MARK_LEFT),
        (LOOP_END_BEFORE_GENERATION, 0, MARK_LEFT))),
    # Mistral: the system prompt joins the last user message, so only message ends are marked.
    AnchorSpec("mistral-nemo", "mistral", "fixture:mistralai-Mistral-Nemo-Instruct-2407.jinja", (
        (r"\{%-\s*endfor\s*%\}", -1, MARK_LEFT),)),
    AnchorSpec("mistral-small-3.2", "mistral", "fixture:Mistral-Small-3.2-24B-Instruct-2506.jinja", (
        (r"\{%-\s*for message in loop_messages\s*%\}", 1, MARK_LEFT),
        (r"\{%-\s*endfor\s*%\}", -1, MARK_LEFT))),
    AnchorSpec("gemma2", "gemma", "fixture:google-gemma-2-2b-it.jinja", (
        (r"\{% endfor %\}", 0, MARK),)),
    AnchorSpec("gemma3", "gemma", "shared:ollama-gemma3-270m.jinja", (
        (r"\{%-\s*endfor\s*-%\}\s*\{%-\s*if add_generation_prompt", 0, MARK_BOTH),)),
    # Gemma 4: tool results render inside the assistant turn that called them.
    AnchorSpec("gemma4", "gemma", "fixture:google-gemma-4-31B-it.jinja", (
        (r"\{#- Pre-scan", 0, MARK_LEFT),
        (r"\{%-\s*endif\s*-%\}\s*\{%-\s*endfor\s*-%\}\s*\{%-\s*if add_generation_prompt", 0, MARK_BOTH))),
    # DeepSeek R1 distills: BOS and the system prompt, then one mark per message (three published revisions).
    *(AnchorSpec(name, "deepseek-r1-distill", source, (
        (r"\{%-?\s*for message in messages\s*-?%\}", 1, MARK_LEFT),
        (r"\{%-?\s*endfor\s*-?%\}\s*\{%-?\s*if ns\.is_tool", 0, MARK_LEFT)))
      for name, source in (
          ("deepseek-r1-distill-qwen", "fixture:deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja"),
          ("deepseek-r1-distill-llama", "fixture:deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja"),
          ("deepseek-r1-distill-2025-02", "shared:deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja"))),
)


def build_annotation(spec: AnchorSpec, source: bytes) -> Annotation:
    """Locate every anchor in ``source`` and record the insertions."""
    text = source.decode("utf-8")
    insertions = []
    for pattern, index, mark in spec.marks:
        matches = list(re.finditer(pattern, text))
        if not matches or not -len(matches) <= index < len(matches):
            raise ValueError(f"{spec.name}: anchor {pattern!r} match {index} not found")
        char_offset = matches[index].start()
        insertions.append((len(text[:char_offset].encode("utf-8")), mark))
    insertions.sort()
    result = insert_marks(source, insertions)
    return Annotation(spec.name, spec.family, sha256_hex(source), sha256_hex(result), tuple(insertions))


def template_sources(fixture_root: Path, shared_dir: Path | None,
                     gguf_template: Callable[[], str]) -> dict[str, bytes]:
    """The bytes of every source the specs name."""
    out = {}
    for spec in SPECS:
        kind, _, name = spec.source.partition(":")
        if kind == "fixture":
            out[spec.source] = (fixture_root / "templates" / name).read_bytes()
        elif kind == "shared" and shared_dir is not None:
            out[spec.source] = (shared_dir / name).read_bytes()
        elif kind == "gguf":
            out[spec.source] = gguf_template().encode("utf-8")
    return out


def smollm2_template() -> str:
    from ...core.gguf_tokenizer import read_gguf_metadata
    from ...fixtures import smollm2_gguf

    return read_gguf_metadata(smollm2_gguf())["tokenizer.chat_template"]


def build_all(sources: dict[str, bytes]) -> list[Annotation]:
    return [build_annotation(spec, sources[spec.source]) for spec in SPECS if spec.source in sources]


def main(argv: list[str] | None = None) -> int:
    from ...fixtures import ensure_package

    argv = sys.argv[1:] if argv is None else argv
    shared = Path(argv[0]) if argv else Path(__file__).resolve().parents[4] / "shared" / "templates"
    sources = template_sources(ensure_package("llama-cpp-python"), shared if shared.is_dir() else None,
                               smollm2_template)
    annotations = build_all(sources)
    target = Path(__file__).with_name(BUNDLED_FILE)
    target.write_text(json.dumps({"format": 1, "annotations": [a.to_json() for a in annotations]}, indent=1,
                                 ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {len(annotations)} annotations to {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
