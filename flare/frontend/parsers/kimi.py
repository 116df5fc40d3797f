"""Kimi K2 tool calls: a section of calls, each an ID naming the function and its JSON.

::

    <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0
    <|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>

(one line in the output). The ID ``functions.<name>:<index>`` is the call's ID as the
model wrote it; the function's name is read from it.
"""

from __future__ import annotations

import re
from typing import Mapping

from .grammar import Lark
from .registry import register
from .schemas import functions
from .toolcall import MAX_NAME_CHARS, Reader, ToolParser

SECTION, SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL, ARGUMENTS, CALL_END = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"

_ID = re.compile(r"[^<>\n]*")


@register("kimi_k2")
class KimiParser(ToolParser):
    """``<|tool_calls_section_begin|>`` sections of ``<|tool_call_begin|>`` calls."""

    __slots__ = ()
    name = "kimi_k2"
    markers = (SECTION,)
    syntax = (SECTION, SECTION_END, CALL, ARGUMENTS, CALL_END)

    def _section(self) -> Reader:
        calls = 0
        while True:
            yield from self._skip_ws()
            if (yield from self._literal(SECTION_END)):
                break
            if not (yield from self._literal(CALL)):
                if calls:  # the output ended, or went on without closing the section
                    break
                return False
            head = yield from self._until((ARGUMENTS,), allowed=_ID, limit=MAX_NAME_CHARS)
            call_id = head[0].strip() if head else ""
            name = call_id.rsplit(":", 1)[0].removeprefix("functions.")
            if not name:
                return False
            if not (yield from self._arguments_object(name, call_id)):
                return False
            yield from self._skip_ws()
            yield from self._literal(CALL_END)
            self._raw = []
            calls += 1
        yield from self._skip_ws()
        return True

    @classmethod
    def tool_grammar(cls, tools: list[dict], *, name: str | None = None, parallel: bool = True,
                     special_tokens: Mapping[str, int] | None = None) -> str:
        lark = Lark(special_tokens)
        calls = [lark.rule(f'{lark.lit(CALL)} {lark.lit(f"functions.{function}:")} /[0-9]+/ {lark.lit(ARGUMENTS)} '
                           f'{lark.json(params)} {lark.lit(CALL_END)}', name="call")
                 for function, params in functions(tools, name)]
        call = lark.rule(" | ".join(calls), name="calls")
        return lark.text(f'{lark.lit(SECTION)} {call}{"+" if parallel else ""} {lark.lit(SECTION_END)}')
