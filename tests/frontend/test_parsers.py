"""Output parsers: the registry and the streaming contract (flare/frontend/parsers)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flare.frontend import parsers
from flare.frontend.parsers import (
    ContentDelta,
    OutputAssembler,
    OutputParser,
    ParsedOutput,
    ReasoningDelta,
    ToolCall,
    ToolCallArguments,
    ToolCallEnd,
    ToolCallStart,
    registry,
)


@pytest.fixture
def scratch_registry(monkeypatch):
    """Registrations made by a test vanish after it."""
    monkeypatch.setattr(registry, "_PARSERS", dict(registry._PARSERS))


def test_plain_is_registered_and_created_per_request():
    assert "plain" in parsers.names() and parsers.PLAIN == "plain"
    factory = parsers.get("plain")
    first, second = factory(), factory()
    assert isinstance(first, OutputParser) and first is not second
    assert first.name == "plain" and first.is_plain


def test_unknown_name_is_refused_with_the_known_names():
    with pytest.raises(LookupError, match=r"no output parser named 'nope' \(known: .*plain"):
        parsers.get("nope")


def test_register_adds_a_parser_and_refuses_a_second_of_the_same_name(scratch_registry):
    @parsers.register("test-upper")
    class Upper(OutputParser):
        name = "test-upper"

        def feed(self, text):
            return [ContentDelta(text.upper())]

    assert parsers.get("test-upper") is Upper
    assert parsers.names() == tuple(sorted(("test-upper", *registry._PARSERS.keys() - {"test-upper"})))
    with pytest.raises(ValueError, match="already registered"):
        parsers.register("test-upper")(Upper)


def test_base_parser_requires_feed_and_finishes_empty():
    parser = OutputParser()
    with pytest.raises(NotImplementedError):
        parser.feed("x")
    assert parser.finish() == [] and not parser.is_plain


def test_plain_streams_each_piece_as_one_content_delta_and_holds_nothing_back():
    parser = parsers.get("plain")()
    assert parser.feed("Par") == [ContentDelta("Par")]
    assert parser.feed("") == []
    assert parser.feed("is <think>x</think> {\"name\": 1}") == [ContentDelta("is <think>x</think> {\"name\": 1}")]
    assert parser.finish() == []


@given(st.lists(st.text(max_size=8), max_size=12))
def test_plain_content_is_the_output_however_it_is_split(pieces):
    parser = parsers.get("plain")()
    deltas = [delta for piece in pieces for delta in parser.feed(piece)] + parser.finish()
    assert all(type(delta) is ContentDelta and delta.text for delta in deltas)
    assert "".join(delta.text for delta in deltas) == "".join(pieces)
    assembler = OutputAssembler()
    assembler.add(deltas)
    assert assembler.result() == ParsedOutput("".join(pieces))


def test_assembler_joins_every_kind_of_delta():
    assembler = OutputAssembler()
    assembler.add([ReasoningDelta("think"), ContentDelta("a"), ToolCallStart(1, "call_b", "g")])
    assembler.add([ToolCallStart(0, "call_a", "f"), ToolCallArguments(0, '{"x"'), ToolCallArguments(1, "{}"),
                   ToolCallArguments(0, ": 1}"), ToolCallEnd(0), ToolCallEnd(1), ReasoningDelta("ing"),
                   ContentDelta("b")])
    assert assembler.result() == ParsedOutput("ab", "thinking", (ToolCall(0, "call_a", "f", '{"x": 1}'),
                                                                  ToolCall(1, "call_b", "g", "{}")))


def test_deltas_are_values():
    assert ContentDelta("a") == ContentDelta("a") and ContentDelta("a") != ReasoningDelta("a")
    with pytest.raises(AttributeError):
        ContentDelta("a").text = "b"
