"""Which parsers a chat template implies: the markers its source renders.

A template shows the model the syntax it was trained on (the tool calls it renders back
into history, the format its system prompt asks for), so its source names the family:
``detect`` reads it, most specific marker first. ``reasoning_opened`` tells, from a
rendered prompt, whether the template left the reasoning block open for the model.
"""

from __future__ import annotations

import re

from .deepseek import CALLS as DEEPSEEK_CALLS
from .deepseek import FENCE
from .glm import KEY as GLM_KEY
from .granite import MARKER as GRANITE_MARKER
from .hermes import OPEN as HERMES_OPEN
from .kimi import SECTION as KIMI_SECTION
from .llama3_json import PYTHON_TAG
from .mistral import MARKER as MISTRAL_MARKER
from .qwen3_coder import FUNCTION, PARAMETER
from .think import CLOSE as THINK_CLOSE
from .think import OPEN as THINK_OPEN
from .think import MistralThinkParser

# The format Llama 3.x's templates ask for when tools are given.
LLAMA_FORMAT = '{"name": function name, "parameters": dictionary of argument name and its value}'
JSON_ARGUMENTS = re.compile(r'\\?"arguments\\?"')  # a JSON "arguments" key, maybe inside a Jinja string


def detect(template_source: str) -> tuple[str | None, str | None]:
    """(tool-call parser, reasoning parser) for a chat template's source; None where it
    renders no syntax this package reads."""
    return _tool_parser(template_source), _reasoning_parser(template_source)


def _tool_parser(source: str) -> str | None:
    if DEEPSEEK_CALLS in source:
        # V3 and R1 fence the arguments (```json); V3.1 writes them bare.
        return "deepseek_v3" if FENCE + "json" in source else "deepseek_v31"
    if KIMI_SECTION in source:
        return "kimi_k2"
    if MISTRAL_MARKER in source:
        return "mistral"
    if HERMES_OPEN in source:
        if GLM_KEY in source:
            return "glm45"
        if FUNCTION in source and PARAMETER in source:
            return "qwen3_coder"
        if JSON_ARGUMENTS.search(source):
            return "hermes"
    if GRANITE_MARKER in source:
        return "granite"
    if FUNCTION in source:  # functionary's <function=NAME>{json}: not read here
        return None
    if PYTHON_TAG in source or LLAMA_FORMAT in source:
        return "llama3_json"
    return None


def _reasoning_parser(source: str) -> str | None:
    if THINK_OPEN in source or THINK_CLOSE in source:
        return "think"
    if MistralThinkParser.open_tag in source:
        return MistralThinkParser.name
    return None


def reasoning_opened(prompt_text: str, open_tag: str = THINK_OPEN, close_tag: str = THINK_CLOSE) -> bool:
    """Whether a rendered prompt leaves the reasoning block open: its last ``open_tag``
    comes after its last ``close_tag`` (DeepSeek-R1's and QwQ's templates end with ``<think>``)."""
    return prompt_text.rfind(open_tag) > prompt_text.rfind(close_tag)
