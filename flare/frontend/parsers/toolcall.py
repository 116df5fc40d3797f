"""ToolParser: the base of every tool-call parser, and the JSON readers most families share.

Content streams until one of the family's ``markers`` (``<tool_call>``, ``[TOOL_CALLS]``,
...); then ``_section`` reads the calls the family writes there. A call is announced
(:class:`ToolCallStart`) as soon as its name is known and its arguments begin, and its
arguments then stream as they arrive.

When a section turns out not to be a call (the JSON is bad, the name is missing, the
output ends), the parser gives up on it: the text read since the last complete call (or
since the current call's arguments last went out) is passed on as content exactly as the
model wrote it, ``malformed`` counts it, and content scanning resumes at the character
that did not fit. Text that already went out as a call's arguments cannot be taken back:
a call that breaks after its start is ended (:class:`ToolCallEnd`) with what it had, and
counted. A streamed call whose arguments close but are not a JSON object is counted too.

Whitespace after a call (between calls, before the text after them) is dropped. A name
that is not among the request's tools is still a call: the client validates.
"""

from __future__ import annotations

import json
import re
import secrets
from typing import ClassVar, Mapping

from .base import ContentDelta, ToolCallArguments, ToolCallEnd, ToolCallStart
from .schemas import declared_type, property_schemas
from .stream import Reader, StreamParser
from .values import to_json

ARGUMENT_KEYS = ("arguments", "parameters")  # Llama writes "parameters", everyone else "arguments"
MAX_NAME_CHARS = 256  # of a function name or call ID read outside JSON

_STRUCTURAL = re.compile(r'[{}\[\]"]')
_STRING_SPECIAL = re.compile(r'["\\]')
_SCALAR = re.compile(r"[-+.0-9A-Za-z]*")
_VALUE_START = frozenset('{["-0123456789tfn')


class ToolParser(StreamParser):
    """One request's tool-call parser; a family sets ``markers`` and writes ``_section``."""

    __slots__ = ("malformed", "tools", "_raw", "_num_calls", "_open")
    kind = "tool"
    markers: ClassVar[tuple[str, ...]] = ()  # texts that open a tool-call section in content

    def __init__(self, tools: list[dict] | None = None):
        self.tools = list(tools or ())  # the request's declared tools (OpenAI function objects)
        self.malformed = 0
        self._raw: list[str] = []  # text consumed since the last commit: content again if we give up
        self._num_calls = 0
        self._open: int | None = None  # the call whose arguments are streaming
        super().__init__()

    @classmethod
    def tool_grammar(cls, tools: list[dict], *, name: str | None = None, parallel: bool = True,
                     special_tokens: Mapping[str, int] | None = None) -> str:
        """An llguidance Lark grammar whose sentences are, in this family's syntax, one call
        (one or more when ``parallel``) of ``tools`` (only ``name`` when given) with arguments
        valid against the tool's schema; the output ends after the last call. A marker found
        in ``special_tokens`` (text -> token id) is written as that special token."""
        raise NotImplementedError

    @staticmethod
    def new_call_id() -> str:
        """An ID for a call the model gave none: ``call_`` and 24 random hex digits."""
        return "call_" + secrets.token_hex(12)

    # -- the driver --------------------------------------------------------------------------

    def _main(self) -> Reader:
        while True:
            marker = yield from self._content(self.markers)
            if marker is None:
                return
            self._raw = [marker]
            if (yield from self._section()):
                self._raw = []
            else:
                self._give_up()

    def _section(self) -> Reader:
        """Read the calls after a marker; False when they do not parse (see the module docstring)."""
        raise NotImplementedError

    def _consumed(self, piece: str) -> None:
        self._raw.append(piece)

    def _give_up(self) -> None:
        self.malformed += 1
        text = "".join(self._raw)
        if self._open is not None:
            self._end_call()
        self._raw = []
        if text:
            self._out.append(ContentDelta(text))

    # -- calls -------------------------------------------------------------------------------

    def _start_call(self, name: str, call_id: str | None = None) -> None:
        self._open = self._num_calls
        self._num_calls += 1
        self._raw = []
        self._out.append(ToolCallStart(self._open, call_id or self.new_call_id(), name))

    def _arguments(self, fragment: str) -> None:
        """Send the open call's next arguments fragment; what was read so far is committed."""
        self._raw = []
        if fragment:
            self._out.append(ToolCallArguments(self._open, fragment))

    def _end_call(self) -> None:
        self._out.append(ToolCallEnd(self._open))
        self._open = None
        self._raw = []

    def _whole_call(self, name: str, arguments: str, call_id: str | None = None) -> None:
        self._start_call(name, call_id)
        self._arguments(arguments)
        self._end_call()

    # -- JSON --------------------------------------------------------------------------------

    def _json_value(self, stream: bool = False) -> Reader:
        """Read one JSON value (its extent: brackets and strings are tracked, the rest is not
        checked) and return its text; None when it does not start like one or the output
        ends inside it. With ``stream`` each piece goes out as the open call's arguments."""
        first = yield from self._peek()
        if first is None or first not in _VALUE_START:
            return None
        if first not in '{["':
            return (yield from self._json_scalar())
        parts: list[str] = []
        depth, in_string, escaped = 0, False, False
        while (yield from self._wait()):
            buf, pos = self._buf, self._pos
            i, done = pos, False
            while i < len(buf) and not done:
                if escaped:
                    escaped, i = False, i + 1
                    continue
                match = (_STRING_SPECIAL if in_string else _STRUCTURAL).search(buf, i)
                if match is None:
                    i = len(buf)
                    break
                i, char = match.end(), match.group()
                if char == "\\":
                    escaped = True
                elif char == '"':
                    in_string = not in_string
                    done = not in_string and depth == 0
                elif char in "{[":
                    depth += 1
                else:
                    depth -= 1
                    done = depth == 0
            piece = self._take(i - pos)
            parts.append(piece)
            if stream:
                self._arguments(piece)
            if done:
                return "".join(parts)
        return None

    def _json_scalar(self) -> Reader:
        """Read a number or literal: it ends at the first other character, or with the output."""
        parts = []
        while (yield from self._wait()):
            end = _SCALAR.match(self._buf, self._pos).end()
            parts.append(self._take(end - self._pos))
            if end < len(self._buf):
                break
        return "".join(parts)

    def _json_string(self) -> Reader:
        """Read a JSON string and return its value; None when the next value is not one."""
        if (yield from self._peek()) != '"':
            return None
        return _decoded_string((yield from self._json_value()))

    def _call_object(self, *, defer: bool = False) -> Reader:
        """Read one ``{"name": ..., "arguments": {...}}`` object (keys in any order, "parameters"
        for "arguments", the model's call ID in "id", other keys skipped) and emit its call:
        streamed once the name is known and an arguments object begins, unless ``defer``
        (wait for the whole object, as when the ID comes last). False when it is not a call."""
        if not (yield from self._literal("{")):
            return False
        name = call_id = arguments = streamed = None
        while True:
            yield from self._skip_ws()
            key = yield from self._json_string()
            if key is None:
                return False
            yield from self._skip_ws()
            if not (yield from self._literal(":")):
                return False
            yield from self._skip_ws()
            if key == "name" and name is None:
                name = yield from self._json_string()
                if not name:
                    return False
            elif key in ARGUMENT_KEYS and arguments is None and streamed is None:
                if name is not None and not defer and (yield from self._peek()) == "{":
                    self._start_call(name, call_id)
                    streamed = yield from self._json_value(stream=True)
                    if streamed is None:
                        return False
                else:
                    arguments = yield from self._json_value()
                    if arguments is None:
                        return False
            else:
                value = yield from self._json_value()
                if value is None:
                    return False
                if key == "id":
                    call_id = _decoded_string(value) or call_id
            yield from self._skip_ws()
            if (yield from self._literal("}")):
                break
            if not (yield from self._literal(",")):
                return False
        if streamed is not None:
            self._end_streamed(streamed)
            return True
        arguments = arguments_text(arguments)
        if name is None or arguments is None:
            return False
        self._whole_call(name, arguments, call_id)
        return True

    def _call_list(self, *, defer: bool = False) -> Reader:
        """Read a JSON array of call objects; each complete call is committed as it ends."""
        if not (yield from self._literal("[")):
            return False
        while True:
            yield from self._skip_ws()
            if not (yield from self._call_object(defer=defer)):
                return False
            self._raw = []
            yield from self._skip_ws()
            if (yield from self._literal("]")):
                return True
            if not (yield from self._literal(",")):
                return False

    def _arguments_object(self, name: str, call_id: str | None = None) -> Reader:
        """Start the call ``name`` when a bare arguments object begins (the name came before
        it), stream the object and end the call; False when none begins (nothing is sent)
        or it does not close."""
        if (yield from self._peek()) != "{":
            return False
        self._start_call(name, call_id)
        text = yield from self._json_value(stream=True)
        if text is None:
            return False
        self._end_streamed(text)
        return True

    def _end_streamed(self, arguments: str) -> None:
        """End the open call, its streamed ``arguments`` complete (counted when no JSON object)."""
        if not is_json_object(arguments):
            self.malformed += 1
        self._end_call()


class TextValuesParser(ToolParser):
    """A family whose calls write each parameter's value as plain text (Qwen3-Coder, GLM):
    the value goes out as JSON by the parameter's declared type (the request's tools)."""

    __slots__ = ("_properties",)

    def __init__(self, tools: list[dict] | None = None):
        super().__init__(tools)
        self._properties = property_schemas(self.tools)  # function name -> parameter -> schema

    def _text_value(self, schema: dict | None, ends: tuple[str, ...]) -> Reader:
        """Send one value as JSON, up to the first of ``ends``; the end it met, or None when
        none came. A declared string streams as it is written; anything else goes whole."""
        if declared_type(schema) == "string":
            self._arguments('"')
            ended = yield from self._until(ends, sink=self._string_piece)
            if ended is None:
                return None
            self._arguments('"')
            return ended[1]
        ended = yield from self._until(ends)
        if ended is None:
            return None
        self._arguments(to_json(ended[0], schema))
        return ended[1]

    def _string_piece(self, piece: str) -> None:
        self._arguments(json.dumps(piece, ensure_ascii=False)[1:-1])


def is_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def arguments_text(text: str | None) -> str | None:
    """A call's arguments as JSON object text, from the value the model wrote: absent or null
    is ``{}``, a JSON string holding an object is unwrapped; None when it is neither."""
    if text is None or text == "null":
        return "{}"
    if text.startswith('"'):
        text = _decoded_string(text)
        if text is None:
            return None
    return text if is_json_object(text) else None


def _decoded_string(text: str | None) -> str | None:
    try:
        value = json.loads(text) if text is not None else None
    except ValueError:
        return None
    return value if isinstance(value, str) else None
