"""Llama 3.1 / 3.2 / 3.3 JSON tool calls: the whole output is the call.

::

    {"name": "get_weather", "parameters": {"city": "Paris"}}

optionally after ``<|python_tag|>``, several separated by ``;``. ("arguments" is read for
"parameters" too.) Only an output that starts, after whitespace, with ``{`` or the tag
holds calls; any other output is content from its first character. Text after the calls
(or after one that does not parse) is content.
"""

from __future__ import annotations

from typing import Mapping

from .base import ContentDelta
from .grammar import Lark, call_objects
from .registry import register
from .schemas import functions
from .toolcall import Reader, ToolParser

PYTHON_TAG = "<|python_tag|>"


@register("llama3_json")
class Llama3JsonParser(ToolParser):
    """Calls as ``{"name", "parameters"}`` JSON objects, when the output begins with one."""

    __slots__ = ()
    name = "llama3_json"
    syntax = (PYTHON_TAG,)

    def _main(self) -> Reader:
        leading = yield from self._skip_ws()
        if not (yield from self._literal(PYTHON_TAG)) and (yield from self._peek()) != "{":
            if leading:  # content after all
                self._out.append(ContentDelta(leading))
            yield from self._content(())
            return
        while True:
            yield from self._skip_ws()
            if not (yield from self._call_object()):
                self._give_up()
                break
            self._raw = []
            yield from self._skip_ws()
            if not (yield from self._literal(";")):
                self._raw = []
                break
        yield from self._content(())

    @classmethod
    def tool_grammar(cls, tools: list[dict], *, name: str | None = None, parallel: bool = True,
                     special_tokens: Mapping[str, int] | None = None) -> str:
        # The plain JSON form (no tag), as the Llama templates render a call.
        lark = Lark(special_tokens)
        call = lark.json(call_objects(functions(tools, name), arguments_key="parameters"))
        return lark.text(lark.repeated(call, "; ", parallel))
