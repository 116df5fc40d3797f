"""The streaming contract, for every parser on every sample output: however the text is
split into ``feed`` pieces, the assembled result is the one the whole text gives."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flare.frontend.parsers import (
    ContentDelta,
    ReasoningDelta,
    ToolCallArguments,
    ToolCallEnd,
    ToolCallStart,
    build,
    tool_parser_names,
)

from .outputs import REASONED, SAMPLES, TOOLS, run, without_ids

CASES = [(tool, reasoning, text) for tool, texts in SAMPLES.items() for text in texts
         for reasoning in (None, "think")]
CASES += [(tool, "think", prefix + SAMPLES[tool][0]) for tool in SAMPLES for prefix in REASONED]
CASES += [(None, "think", prefix + "Paris.") for prefix in REASONED] + [(None, "think", "no reasoning at all <thin")]


def _parse(tool, reasoning, pieces):
    result = run(build(tool, reasoning, tools=TOOLS), pieces)
    return without_ids(result.output), result.malformed, result.deltas


def test_every_tool_parser_has_samples():
    assert set(SAMPLES) == set(tool_parser_names())


@pytest.mark.parametrize("tool, reasoning, text", CASES)
def test_a_split_at_any_boundary_gives_the_whole_texts_result(tool, reasoning, text):
    whole = _parse(tool, reasoning, text)[:2]
    for cut in range(1, len(text)):
        assert _parse(tool, reasoning, [text[:cut], text[cut:]])[:2] == whole, cut
    assert _parse(tool, reasoning, list(text))[:2] == whole


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=st.sampled_from(CASES), data=st.data())
def test_random_multi_splits_give_the_whole_texts_result(case, data):
    tool, reasoning, text = case
    cuts = sorted(data.draw(st.sets(st.integers(0, len(text)), max_size=12)))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
    assert _parse(tool, reasoning, pieces)[:2] == _parse(tool, reasoning, text)[:2]


@pytest.mark.parametrize("tool, reasoning, text", CASES)
def test_deltas_are_well_formed_for_every_prefix(tool, reasoning, text):
    """Truncated anywhere, an output still parses (no exception), every call starts once,
    its fragments come between its start and its end, and no delta is empty."""
    for end in range(len(text) + 1):
        _, _, deltas = _parse(tool, reasoning, list(text[:end]))
        started, ended = set(), set()
        for delta in deltas:
            kind = type(delta)
            if kind in (ContentDelta, ReasoningDelta):
                assert delta.text
            elif kind is ToolCallStart:
                assert delta.index == len(started) and delta.name and delta.id
                started.add(delta.index)
            elif kind is ToolCallArguments:
                assert delta.fragment and delta.index in started - ended
            else:
                assert kind is ToolCallEnd and delta.index in started - ended
                ended.add(delta.index)
        assert started == ended, end


def test_content_streams_promptly():
    """Only a suffix that could begin a marker is held back."""
    parser = build("hermes", None)
    assert parser.feed("Hello <") == [ContentDelta("Hello ")]
    assert parser.feed("b>") == [ContentDelta("<b>")]
    assert parser.feed(" and <tool_") == [ContentDelta(" and ")]
    assert parser.feed("x") == [ContentDelta("<tool_x")]


def test_arguments_stream_as_they_arrive():
    parser = build("hermes", None)
    assert parser.feed('<tool_call>\n{"name": "get_weather", "argu') == []
    start, first = parser.feed('ments": {"city": "Pa')
    assert type(start) is ToolCallStart and start.name == "get_weather"
    assert first == ToolCallArguments(0, '{"city": "Pa')
    assert parser.feed('ris"}') == [ToolCallArguments(0, 'ris"}')]
    assert parser.feed("}\n</tool_call>") == [ToolCallEnd(0)]
