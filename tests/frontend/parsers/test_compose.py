"""build() and the registry: names by kind, composition, the plain parser."""

from __future__ import annotations

import pytest

from flare.errors import FrontendError
from flare.frontend import parsers
from flare.frontend.parsers import (
    ComposedParser,
    ContentDelta,
    ReasoningDelta,
    ToolCallStart,
    build,
    check_parser_name,
    get,
    names,
    parser_names,
    reasoning_parser_names,
    tool_parser_names,
)

REQUIRED_TOOL_PARSERS = {"hermes", "qwen3_coder", "llama3_json", "mistral", "deepseek_v3", "deepseek_v31", "granite"}


def test_the_registry_lists_parsers_by_kind():
    assert REQUIRED_TOOL_PARSERS <= set(tool_parser_names())
    assert "think" in reasoning_parser_names()
    assert set(names()) == {*tool_parser_names(), *reasoning_parser_names(), "plain"}
    assert get("plain")().is_plain and get(parsers.PLAIN).name == "plain"
    for name in names():
        assert get(name).name == name


def test_parser_names_by_kind_and_checked_names():
    assert parser_names("tool") == tool_parser_names() and parser_names("reasoning") == reasoning_parser_names()
    assert check_parser_name("hermes", "tool") == "hermes"
    with pytest.raises(FrontendError, match=r"no reasoning parser named 'hermes' \(known: .*think"):
        check_parser_name("hermes", "reasoning")


def test_build_with_nothing_is_the_plain_parser():
    parser = build(None, None)
    assert parser.is_plain and parser.malformed == 0
    assert build("plain", None).is_plain


def test_build_one_kind_alone():
    tool = build("hermes", None, tools=[])
    assert tool.name == "hermes" and tool.kind == "tool" and not tool.is_plain
    reasoning = build(None, "think", reasoning_opened=True)
    assert reasoning.name == "think" and reasoning.opened


def test_build_refuses_a_name_of_the_wrong_kind_or_none_at_all():
    with pytest.raises(LookupError, match="not a tool parser"):
        build("think", None)
    with pytest.raises(LookupError, match="not a reasoning parser"):
        build(None, "hermes")
    with pytest.raises(LookupError, match="no output parser named 'nope'"):
        build("nope", None)


def test_composed_reasoning_goes_first_and_content_goes_through_the_tool_parser():
    parser = build("hermes", "think", tools=[])
    assert isinstance(parser, ComposedParser) and not parser.is_plain
    deltas = parser.feed('<think>\nA <tool_call> in thought.\n</think>\n\nOk.\n<tool_call>\n{"name": "f", ')
    assert deltas == [ReasoningDelta("A <tool_call> in thought."), ContentDelta("Ok.\n")]
    deltas = parser.feed('"arguments": {}}\n</tool_call><tool_call>\nbro')
    assert type(deltas[0]) is ToolCallStart and deltas[0].name == "f"
    assert deltas[-2:] == [ContentDelta("<tool_call>\n"), ContentDelta("bro")]
    assert parser.feed("ken") == [ContentDelta("ken")] and parser.finish() == []
    assert parser.malformed == 1 == parser.tool.malformed + parser.reasoning.malformed


def test_each_request_gets_its_own_parser():
    first, second = build("hermes", "think"), build("hermes", "think")
    first.feed("<think>x")
    assert second.feed("y") == [ContentDelta("y")]
