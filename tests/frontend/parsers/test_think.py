"""The ``think`` reasoning parser (and ``mistral_think``, the same with ``[THINK]`` tags)."""

from __future__ import annotations

import pytest

from flare.frontend.parsers import ContentDelta, ReasoningDelta, build, get

from .outputs import parse


@pytest.mark.parametrize("text, reasoning, content", [
    ("<think>\nThe user wants the capital.\n</think>\n\nParis.", "The user wants the capital.", "Paris."),
    ("<think>\n\n</think>\n\nParis.", "", "Paris."),
    ("\n<think>a\n\nb</think>Paris.\n", "a\n\nb", "Paris.\n"),
    ("No reasoning here.", "", "No reasoning here."),
    ("Before <think>x</think> after", "x", "Before  after"),
    ("<think>one</think>two<think>three</think>", "one", "two<think>three</think>"),
    ("<think>\nunfinished\n", "unfinished\n", ""),
    ("<thin", "", "<thin"),
])
def test_reasoning_is_separated_from_content(text, reasoning, content):
    result = parse(None, text, "think")
    assert (result.output.reasoning, result.output.content) == (reasoning, content)


@pytest.mark.parametrize("text, reasoning, content", [
    ("The user wants the capital.\n</think>\n\nParis.", "The user wants the capital.", "Paris."),
    ("<think>\nagain\n</think>\nParis.", "again", "Paris."),
    ("never closed", "never closed", ""),
])
def test_a_block_the_prompt_opened(text, reasoning, content):
    result = parse(None, text, "think", opened=True)
    assert (result.output.reasoning, result.output.content) == (reasoning, content)


def test_reasoning_streams_and_holds_back_only_line_breaks_and_a_partial_tag():
    parser = get("think")()
    assert parser.feed("<think>\nStep") == [ReasoningDelta("Step")]
    assert parser.feed(" one.\n\n") == [ReasoningDelta(" one.")]
    assert parser.feed("Step two.</th") == [ReasoningDelta("\n\nStep two.")]
    assert parser.feed("ink>\n\nAnswer") == [ContentDelta("Answer")]
    assert parser.feed(" <think>") == [ContentDelta(" <think>")]  # after the block, content passes straight on
    assert parser.finish() == []


def test_mistral_think_reads_its_own_tags():
    result = parse(None, "[THINK]Let me see.[/THINK]It is 4.", "mistral_think")
    assert (result.output.reasoning, result.output.content) == ("Let me see.", "It is 4.")
    assert parse(None, "<think>x</think>", "mistral_think").output.content == "<think>x</think>"


def test_reasoning_parsers_never_count_malformed():
    parser = build(None, "think")
    parser.feed("<think>never closed")
    parser.finish()
    assert parser.malformed == 0


def test_a_prompt_that_opened_the_mistral_tag_starts_inside_it():
    """The output plan reads the served reasoning parser's own tags, not <think>'s."""
    import numpy as np

    from flare.request import PreparedPrompt
    from flare.server.tool_calls import OutputPlan
    prompt = PreparedPrompt(np.zeros(1, dtype=np.int32), (), "[INST]hi[/INST][THINK]")
    parser = OutputPlan(reasoning_parser="mistral_think").parser(prompt)
    assert [type(d).__name__ for d in parser.feed("why[/THINK]because")] == ["ReasoningDelta", "ContentDelta"]
