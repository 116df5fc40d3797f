"""Hermes-style tool calls: Hermes 2 Pro / 3, Qwen2.5, Qwen3, QwQ, Granite 4, SmolLM3.

The model writes each call as a JSON object in its own block, after any text::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>
    <tool_call>
    ...

A block holding a JSON array of such objects is read too. A missing ``</tool_call>``
(the output ends, or the next block starts) is tolerated.
"""

from __future__ import annotations

from typing import Mapping

from .grammar import Lark, call_objects
from .registry import register
from .schemas import functions
from .toolcall import Reader, ToolParser

OPEN, CLOSE = "<tool_call>", "</tool_call>"


@register("hermes")
class HermesParser(ToolParser):
    """``<tool_call>`` blocks of ``{"name", "arguments"}`` JSON."""

    __slots__ = ()
    name = "hermes"
    markers = (OPEN,)
    syntax = (OPEN, CLOSE)

    def _section(self) -> Reader:
        yield from self._skip_ws()
        if (yield from self._peek()) == "[":
            parsed = yield from self._call_list()
        else:
            parsed = yield from self._call_object()
        if not parsed:
            return False
        yield from self._skip_ws()
        yield from self._literal(CLOSE)
        yield from self._skip_ws()
        return True

    @classmethod
    def tool_grammar(cls, tools: list[dict], *, name: str | None = None, parallel: bool = True,
                     special_tokens: Mapping[str, int] | None = None) -> str:
        # As the Qwen, Hermes and Granite templates render a call: one object per block,
        # blocks one line apart.
        lark = Lark(special_tokens)
        call = lark.json(call_objects(functions(tools, name)))
        block = lark.rule(f'{lark.lit(OPEN)} "\\n" {call} "\\n" {lark.lit(CLOSE)}', name="block")
        return lark.text(lark.repeated(block, "\n", parallel))
