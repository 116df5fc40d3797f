"""DeepSeek tool calls: V3 and R1 (``deepseek_v3``), V3.1 (``deepseek_v31``).

Both open a section with ``<｜tool▁calls▁begin｜>`` (fullwidth bars, "▁" for spaces) and
close it with ``<｜tool▁calls▁end｜>``; each call sits between ``<｜tool▁call▁begin｜>`` and
``<｜tool▁call▁end｜>``. V3 and R1 write the call's type, the name on its own line and the
arguments in a JSON code fence::

    <｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
    ```json
    {"city": "Paris"}
    ```<｜tool▁call▁end｜>

V3.1 writes the name, the separator and the bare arguments::

    <｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜>

Once a call's arguments are complete, a missing fence or end marker is tolerated.
"""

from __future__ import annotations

import re
from typing import Mapping

from .grammar import Lark
from .registry import register
from .schemas import functions
from .toolcall import MAX_NAME_CHARS, Reader, ToolParser

CALLS, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL, SEPARATOR, CALL_END = "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>"
FENCE = "```"

_NAME = re.compile(r"[^<>\n｜]*")


class _DeepSeekParser(ToolParser):
    """The section both versions share; ``_call`` reads one call after its begin marker."""

    __slots__ = ()
    markers = (CALLS,)
    syntax = (CALLS, CALLS_END, CALL, SEPARATOR, CALL_END)

    def _section(self) -> Reader:
        calls = 0
        while True:
            yield from self._skip_ws()
            if (yield from self._literal(CALLS_END)):
                break
            if not (yield from self._literal(CALL)):
                if calls:  # the output ended, or went on without closing the section
                    break
                return False
            if not (yield from self._call()):
                return False
            self._raw = []
            calls += 1
        yield from self._skip_ws()
        return True

    def _call(self) -> Reader:
        raise NotImplementedError

    def _name(self, stop: str) -> Reader:
        """The text up to ``stop``, stripped; None when it is no name."""
        head = yield from self._until((stop,), allowed=_NAME, limit=MAX_NAME_CHARS)
        if head is None:
            return None
        return head[0].strip() or None


@register("deepseek_v3")
class DeepSeekV3Parser(_DeepSeekParser):
    """DeepSeek V3 and R1 (and the R1 distills): ``TYPE<｜tool▁sep｜>NAME`` and a fenced JSON."""

    __slots__ = ()
    name = "deepseek_v3"

    def _call(self) -> Reader:
        if not (yield from self._name(SEPARATOR)):  # the call's type: "function"
            return False
        name = yield from self._name("\n")
        if not name:
            return False
        yield from self._skip_ws()
        if (yield from self._literal(FENCE)):
            yield from self._literal("json")
            yield from self._skip_ws()
        if not (yield from self._arguments_object(name)):
            return False
        yield from self._skip_ws()
        yield from self._literal(FENCE)
        yield from self._skip_ws()
        yield from self._literal(CALL_END)
        return True

    @classmethod
    def tool_grammar(cls, tools: list[dict], *, name: str | None = None, parallel: bool = True,
                     special_tokens: Mapping[str, int] | None = None) -> str:
        # As the R1 template renders calls: one line apart, each fenced.
        lark = Lark(special_tokens)
        calls = [lark.rule(f'{lark.lit(CALL)} "function" {lark.lit(SEPARATOR)} {lark.lit(function)} '
                           f'"\\n```json\\n" {lark.json(params)} "\\n```" {lark.lit(CALL_END)}', name="call")
                 for function, params in functions(tools, name)]
        call = lark.rule(" | ".join(calls), name="calls")
        return lark.text(f'{lark.lit(CALLS)} {lark.repeated(call, chr(10), parallel)} {lark.lit(CALLS_END)}')


@register("deepseek_v31")
class DeepSeekV31Parser(_DeepSeekParser):
    """DeepSeek V3.1: ``NAME<｜tool▁sep｜>`` and the bare JSON arguments."""

    __slots__ = ()
    name = "deepseek_v31"

    def _call(self) -> Reader:
        name = yield from self._name(SEPARATOR)
        if not name:
            return False
        yield from self._skip_ws()
        if not (yield from self._arguments_object(name)):
            return False
        yield from self._skip_ws()
        yield from self._literal(CALL_END)
        return True

    @classmethod
    def tool_grammar(cls, tools: list[dict], *, name: str | None = None, parallel: bool = True,
                     special_tokens: Mapping[str, int] | None = None) -> str:
        lark = Lark(special_tokens)
        calls = [lark.rule(f'{lark.lit(CALL)} {lark.lit(function)} {lark.lit(SEPARATOR)} {lark.json(params)} '
                           f'{lark.lit(CALL_END)}', name="call")
                 for function, params in functions(tools, name)]
        call = lark.rule(" | ".join(calls), name="calls")
        return lark.text(f'{lark.lit(CALLS)} {call}{"+" if parallel else ""} {lark.lit(CALLS_END)}')
