"""Mistral tool calls: ``[TOOL_CALLS]`` and then either form the models were trained on.

Mistral Small 3.2, Devstral, Ministral and Magistral write each call after its own marker,
the name, optionally the model's call ID, and the arguments::

    [TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{}

Mistral 7B v0.3, Nemo and Mixtral write one JSON array, each call with an optional ID::

    [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "a1b2c3d4e"}]

In the array form the ID comes after the arguments, so each call is sent whole when its
object closes; the other form streams. A call the model gave no ID gets nine random
letters and digits, the only IDs the Mistral chat templates accept back.
"""

from __future__ import annotations

import re
import secrets
import string
from typing import Mapping

from .grammar import Lark, call_array
from .registry import register
from .schemas import functions
from .toolcall import MAX_NAME_CHARS, Reader, ToolParser

MARKER, CALL_ID, ARGS = "[TOOL_CALLS]", "[CALL_ID]", "[ARGS]"
ID_CHARS = string.ascii_letters + string.digits
ID_LEN = 9
ID_SCHEMA = {"type": "string", "pattern": f"^[A-Za-z0-9]{{{ID_LEN}}}$"}

_NAME = re.compile(r"[\w.:-]*")


@register("mistral")
class MistralParser(ToolParser):
    """``[TOOL_CALLS]NAME[ARGS]{...}`` calls, or ``[TOOL_CALLS][{...}, ...]``."""

    __slots__ = ()
    name = "mistral"
    markers = (MARKER,)
    syntax = (MARKER, CALL_ID, ARGS)

    @staticmethod
    def new_call_id() -> str:
        return "".join(secrets.choice(ID_CHARS) for _ in range(ID_LEN))

    def _section(self) -> Reader:
        yield from self._skip_ws()
        if (yield from self._peek()) == "[":
            parsed = yield from self._call_list(defer=True)
            yield from self._skip_ws()
            return parsed
        head = yield from self._until((ARGS, CALL_ID), allowed=_NAME, limit=MAX_NAME_CHARS)
        if head is None or not head[0]:
            return False
        call_id = None
        if head[1] == CALL_ID:
            given = yield from self._until((ARGS,), allowed=_NAME, limit=MAX_NAME_CHARS)
            if given is None:
                return False
            call_id = given[0] or None
        if not (yield from self._arguments_object(head[0], call_id)):
            return False
        yield from self._skip_ws()
        return True

    @classmethod
    def tool_grammar(cls, tools: list[dict], *, name: str | None = None, parallel: bool = True,
                     special_tokens: Mapping[str, int] | None = None) -> str:
        # Either form after the marker: the model takes the one it was trained on.
        lark = Lark(special_tokens)
        declared = functions(tools, name)
        listed = lark.json(call_array(declared, parallel, optional={"id": ID_SCHEMA}))
        calls = [lark.rule(f"{lark.lit(function)} ({lark.lit(CALL_ID)} /[A-Za-z0-9]{{{ID_LEN}}}/)? {lark.lit(ARGS)} "
                           f"{lark.json(params)}", name="call")
                 for function, params in declared]
        named = lark.rule(" | ".join(calls), name="calls")
        return lark.text(f"{lark.lit(MARKER)} ({listed} | {lark.repeated(named, MARKER, parallel)})")
