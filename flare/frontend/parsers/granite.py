"""IBM Granite 3.x tool calls: ``<|tool_call|>`` and a JSON list of calls.

::

    <|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}]

(Granite 4 writes Hermes ``<tool_call>`` blocks instead: see hermes.py.) A single object
without the list is read too.
"""

from __future__ import annotations

from typing import Mapping

from .grammar import Lark, call_array
from .registry import register
from .schemas import functions
from .toolcall import Reader, ToolParser

MARKER = "<|tool_call|>"


@register("granite")
class GraniteParser(ToolParser):
    """``<|tool_call|>[{"name", "arguments"}, ...]``."""

    __slots__ = ()
    name = "granite"
    markers = (MARKER,)
    syntax = (MARKER,)

    def _section(self) -> Reader:
        yield from self._skip_ws()
        if (yield from self._peek()) == "[":
            parsed = yield from self._call_list()
        else:
            parsed = yield from self._call_object()
        yield from self._skip_ws()
        return parsed

    @classmethod
    def tool_grammar(cls, tools: list[dict], *, name: str | None = None, parallel: bool = True,
                     special_tokens: Mapping[str, int] | None = None) -> str:
        lark = Lark(special_tokens)
        return lark.text(f"{lark.lit(MARKER)} {lark.json(call_array(functions(tools, name), parallel))}")
