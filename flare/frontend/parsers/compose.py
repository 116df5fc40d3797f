"""build(): one request's parser from a tool-call parser and a reasoning parser, by name.

The reasoning parser reads the output first; its content goes on through the tool-call
parser, so a call inside the reasoning block stays reasoning and the tool-call parser
never sees ``<think>``. Deltas keep the output's order.
"""

from __future__ import annotations

from .base import ContentDelta, Delta, OutputParser
from .plain import PlainParser
from .registry import get


class ComposedParser(OutputParser):
    """A reasoning parser whose content feeds a tool-call parser."""

    __slots__ = ("reasoning", "tool")
    name = "composed"

    def __init__(self, reasoning: OutputParser, tool: OutputParser):
        self.reasoning = reasoning
        self.tool = tool

    @property
    def malformed(self) -> int:
        return self.reasoning.malformed + self.tool.malformed

    def feed(self, text: str) -> list[Delta]:
        return self._through(self.reasoning.feed(text))

    def finish(self) -> list[Delta]:
        return self._through(self.reasoning.finish()) + self.tool.finish()

    def _through(self, deltas: list[Delta]) -> list[Delta]:
        out: list[Delta] = []
        for delta in deltas:
            if type(delta) is ContentDelta:
                out += self.tool.feed(delta.text)
            else:
                out.append(delta)
        return out


def build(tool: str | None, reasoning: str | None, *, tools: list[dict] | None = None,
          reasoning_opened: bool = False) -> OutputParser:
    """One request's output parser: the tool-call parser ``tool`` (given the request's
    ``tools``) behind the reasoning parser ``reasoning`` (``reasoning_opened``: the prompt
    ended inside its block); either may be None (or "plain"), and with neither it is the
    plain parser. LookupError for a name that is not a parser of its kind."""
    tool_parser = _factory(tool, "tool")(tools=tools) if tool not in (None, PlainParser.name) else None
    reasoning_parser = (_factory(reasoning, "reasoning")(opened=reasoning_opened)
                        if reasoning not in (None, PlainParser.name) else None)
    if tool_parser is None:
        return reasoning_parser if reasoning_parser is not None else PlainParser()
    if reasoning_parser is None:
        return tool_parser
    return ComposedParser(reasoning_parser, tool_parser)


def _factory(name: str, kind: str):
    factory = get(name)
    if getattr(factory, "kind", "") != kind:
        raise LookupError(f"the output parser {name!r} is not a {kind} parser")
    return factory
