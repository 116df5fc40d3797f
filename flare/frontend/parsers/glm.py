"""GLM-4.5 / GLM-4.6 tool calls: the name, then key and value pairs as text.

::

    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Paris</arg_value>
    <arg_key>days</arg_key>
    <arg_value>3</arg_value>
    </tool_call>

The template writes a string value as it is and anything else as JSON; the parser reads
each value back by its declared type, or by what it is (values.py). A value the schema
declares a string streams as it is written. The call starts with its first argument, so
a name followed by anything else is content.
"""

from __future__ import annotations

import json
import re
from typing import Mapping

from .grammar import Lark
from .registry import register
from .schemas import functions
from .toolcall import MAX_NAME_CHARS, Reader, TextValuesParser

OPEN, CLOSE = "<tool_call>", "</tool_call>"
KEY, KEY_END = "<arg_key>", "</arg_key>"
VALUE, VALUE_END = "<arg_value>", "</arg_value>"

_NAME = re.compile(r"[^<>\n]*")


@register("glm45")
class GlmParser(TextValuesParser):
    """``<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>...</tool_call>``."""

    __slots__ = ()
    name = "glm45"
    markers = (OPEN,)
    syntax = (OPEN, CLOSE, KEY, KEY_END, VALUE, VALUE_END)

    def _section(self) -> Reader:
        yield from self._skip_ws()
        head = yield from self._until(("\n", KEY, CLOSE), allowed=_NAME, limit=MAX_NAME_CHARS)
        if head is None or not head[0].strip():
            return False
        name, stop = head[0].strip(), head[1]
        declared = self._properties.get(name, {})
        separator = None  # the call starts with its first argument (or its end)
        while stop != CLOSE:
            if stop != KEY:
                yield from self._skip_ws()
                if (yield from self._literal(CLOSE)):
                    break
                if not (yield from self._literal(KEY)):
                    return False
            key = yield from self._until((KEY_END,), limit=MAX_NAME_CHARS)
            if key is None:
                return False
            yield from self._skip_ws()
            if not (yield from self._literal(VALUE)):
                return False
            if separator is None:
                self._start_call(name)
                separator = "{"
            self._arguments(f"{separator}{json.dumps(key[0].strip(), ensure_ascii=False)}: ")
            if (yield from self._text_value(declared.get(key[0].strip()), (VALUE_END,))) is None:
                return False
            separator, stop = ", ", ""
        if separator is None:
            self._whole_call(name, "{}")
        else:
            self._arguments("}")
            self._end_call()
        yield from self._skip_ws()
        return True

    @classmethod
    def tool_grammar(cls, tools: list[dict], *, name: str | None = None, parallel: bool = True,
                     special_tokens: Mapping[str, int] | None = None) -> str:
        # As the GLM-4.6 template renders a call; the model starts its turn on a new line.
        lark = Lark(special_tokens)
        bodies = []
        for function, params in functions(tools, name):
            parameters = lark.text_parameters(params, lambda key: f'"{KEY}" {key} "{KEY_END}\\n{VALUE}"',
                                              VALUE_END + "\n")
            bodies.append(lark.rule(f'{lark.lit(function)} "\\n" {parameters}', name="function"))
        call = lark.rule(f'{lark.lit(OPEN)} ({" | ".join(bodies)}) {lark.lit(CLOSE)}', name="call")
        return lark.text(f'"\\n"? {lark.repeated(call, chr(10), parallel)}')
