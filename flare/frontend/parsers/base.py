"""The output-parser interface: model text in, typed deltas out.

A parser is created per request and sees the request's output text in the
order it was published, in whatever pieces the detokenizer produced: a tag
such as ``<think>`` or a tool call's JSON may arrive split over several
``feed`` calls. It answers with typed deltas, so a route family formats
content, reasoning and tool calls without knowing which model family wrote
them. ``finish`` flushes what the parser held back (a partial tag that never
completed is content after all).

Parsers hold no locks and touch no sockets: they run on the event loop, one
call per published event, so ``feed`` must cost about as much as the text is
long.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Iterable, Union


@dataclass(frozen=True, slots=True)
class ContentDelta:
    """Text the user sees as the answer."""

    text: str


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    """Text of the model's reasoning (a ``<think>`` block or its family's equivalent)."""

    text: str


@dataclass(frozen=True, slots=True)
class ToolCallStart:
    """A tool call begins: its position in the output, its ID and the function's name."""

    index: int  # 0, 1, ... in output order; the later deltas of this call carry it
    id: str
    name: str


@dataclass(frozen=True, slots=True)
class ToolCallArguments:
    """The next piece of a tool call's arguments (JSON text, concatenated in order)."""

    index: int
    fragment: str


@dataclass(frozen=True, slots=True)
class ToolCallEnd:
    """A tool call's arguments are complete."""

    index: int


Delta = Union[ContentDelta, ReasoningDelta, ToolCallStart, ToolCallArguments, ToolCallEnd]


class OutputParser:
    """One request's streaming parser; subclasses override ``feed`` and ``finish``."""

    __slots__ = ()
    name: ClassVar[str] = ""
    # Every text is exactly one ContentDelta of itself and nothing is held back:
    # callers may skip ``feed`` and treat the text as content (the SSE hot path does).
    is_plain: ClassVar[bool] = False
    kind: ClassVar[str] = ""  # "tool" or "reasoning" for the parsers that build() composes
    # Every marker text of the family's syntax: those that are special tokens of the served
    # tokenizer stay in the decoded output (which drops special tokens otherwise), so the
    # parser sees them, and a forced call's grammar writes them as those tokens.
    syntax: ClassVar[tuple[str, ...]] = ()
    # Outputs that began like a tool call but did not parse (tool parsers count them per
    # instance; a parser that never gives up keeps this 0).
    malformed: int = 0

    def feed(self, text: str) -> list[Delta]:
        """The deltas that ``text`` (the next piece of output) completes; [] while undecided."""
        raise NotImplementedError

    def finish(self) -> list[Delta]:
        """The deltas still held back when the output ended (called once, last)."""
        return []


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A complete tool call, as a whole (non-streamed) response reports it."""

    index: int
    id: str
    name: str
    arguments: str  # JSON text, as the model wrote it


@dataclass(frozen=True, slots=True)
class ParsedOutput:
    """A whole output after parsing: what a non-streamed response reports."""

    content: str
    reasoning: str = ""
    tool_calls: tuple[ToolCall, ...] = ()


class OutputAssembler:
    """Joins a request's deltas into its :class:`ParsedOutput` (collected responses)."""

    __slots__ = ("_content", "_reasoning", "_calls")

    def __init__(self):
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self._calls: dict[int, list] = {}  # index -> [id, name, argument fragments]

    def add(self, deltas: Iterable[Delta]) -> None:
        for delta in deltas:
            kind = type(delta)
            if kind is ContentDelta:
                self._content.append(delta.text)
            elif kind is ReasoningDelta:
                self._reasoning.append(delta.text)
            elif kind is ToolCallStart:
                self._calls[delta.index] = [delta.id, delta.name, []]
            elif kind is ToolCallArguments:
                self._calls[delta.index][2].append(delta.fragment)
            # ToolCallEnd adds nothing: a whole response reports the call either way.

    def result(self) -> ParsedOutput:
        calls = tuple(ToolCall(index, call_id, name, "".join(fragments))
                      for index, (call_id, name, fragments) in sorted(self._calls.items()))
        return ParsedOutput("".join(self._content), "".join(self._reasoning), calls)
