"""Qwen3-Coder tool calls (also Qwen3.5 and Nemotron 3 Nano): XML-like, values as text.

::

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    <parameter=days>
    3
    </parameter>
    </function>
    </tool_call>

The arguments object is built as the parameters arrive: a parameter the request's tool
schema declares a string streams as it is written; any other value is converted when its
``</parameter>`` comes (values.py). The single line break after ``<parameter=...>`` and
before ``</parameter>`` belongs to the syntax, not the value. The call starts with its
first parameter, so a ``<function=...>`` followed by anything else is content. A last
value left without its ``</parameter>`` ends at ``</function>``.
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
FUNCTION, FUNCTION_END = "<function=", "</function>"
PARAMETER, PARAMETER_END = "<parameter=", "</parameter>"
# A value ends at its </parameter>; a </function> ends a last value left unclosed.
VALUE_ENDS = ("\n" + PARAMETER_END, PARAMETER_END, "\n" + FUNCTION_END, FUNCTION_END)

_NAME = re.compile(r"[^<>\n]*")


@register("qwen3_coder")
class Qwen3CoderParser(TextValuesParser):
    """``<tool_call><function=NAME><parameter=P>VALUE</parameter>...</function></tool_call>``."""

    __slots__ = ()
    name = "qwen3_coder"
    markers = (OPEN,)
    syntax = (OPEN, CLOSE)

    def _section(self) -> Reader:
        yield from self._skip_ws()
        if not (yield from self._literal(FUNCTION)):
            return False
        head = yield from self._until((">",), allowed=_NAME, limit=MAX_NAME_CHARS)
        if head is None or not head[0].strip():
            return False
        name = head[0].strip()
        declared = self._properties.get(name, {})
        separator = None  # the call starts with its first parameter (or its end)
        while True:
            yield from self._skip_ws()
            if (yield from self._literal(FUNCTION_END)):
                break
            if not (yield from self._literal(PARAMETER)):
                return False
            key = yield from self._until((">",), allowed=_NAME, limit=MAX_NAME_CHARS)
            if key is None:
                return False
            if separator is None:
                self._start_call(name)
                separator = "{"
            self._arguments(f"{separator}{json.dumps(key[0].strip(), ensure_ascii=False)}: ")
            end = yield from self._value(declared.get(key[0].strip()))
            if end is None:
                return False
            separator = ", "
            if end.endswith(FUNCTION_END):
                break
        if separator is None:
            self._whole_call(name, "{}")
        else:
            self._arguments("}")
            self._end_call()
        yield from self._skip_ws()
        yield from self._literal(CLOSE)
        yield from self._skip_ws()
        return True

    def _value(self, schema: dict | None) -> Reader:
        """Send one parameter's value (it starts on a new line); the text that ended it, or None."""
        yield from self._literal("\n")
        return (yield from self._text_value(schema, VALUE_ENDS))

    @classmethod
    def tool_grammar(cls, tools: list[dict], *, name: str | None = None, parallel: bool = True,
                     special_tokens: Mapping[str, int] | None = None) -> str:
        # As the Qwen3-Coder template renders a call (its line breaks included).
        lark = Lark(special_tokens)
        bodies = []
        for function, params in functions(tools, name):
            parameters = lark.text_parameters(params, lambda key: f'"{PARAMETER}" {key} ">\\n"',
                                              "\n" + PARAMETER_END + "\n")
            bodies.append(lark.rule(f'{lark.lit(FUNCTION + function + ">")} "\\n" {parameters} '
                                    f'{lark.lit(FUNCTION_END)}', name="function"))
        call = lark.rule(f'{lark.lit(OPEN)} "\\n" ({" | ".join(bodies)}) "\\n" {lark.lit(CLOSE)}', name="call")
        return lark.text(lark.repeated(call, "\n", parallel))
