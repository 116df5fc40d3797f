"""flare.frontend.continuations: a prompt that carries a recorded output back takes the
tokens it was generated with, over a real byte-level BPE (Llama 3's tokenizer)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flare import fixtures
from flare.frontend.continuations import GeneratedSpans
from flare.frontend.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tokenizer(fixture_root: Path) -> Tokenizer:
    return Tokenizer(fixtures.llama3_tokenizer_json(fixture_root).read_bytes())


def _ids(tokenizer: Tokenizer, text: str) -> np.ndarray:
    return np.asarray(tokenizer.encode(text), dtype=np.int32)


def _bytes(tokenizer: Tokenizer, ids) -> bytes:
    return b"".join(tokenizer.token_bytes(int(t)) for t in ids)


def _spelled(tokenizer: Tokenizer, text: str) -> list[int]:
    """``text`` spelled one character a token (never the tokenizer's own spelling of a word)."""
    return [tokenizer.encode(ch)[0] for ch in text]


PROMPT = "<|start_header_id|>user<|end_header_id|>\n\nWeather in Paris?<|eot_id|>" \
         "<|start_header_id|>assistant<|end_header_id|>\n\n"
CALL = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}'
AFTER = "<|eot_id|><|start_header_id|>ipython<|end_header_id|>\n\n{\"temperature\": 21}<|eot_id|>"


def test_a_carried_back_output_takes_its_generated_tokens(tokenizer):
    spans = GeneratedSpans(tokenizer.token_bytes)
    prompt = _ids(tokenizer, PROMPT)
    generated = _ids(tokenizer, CALL[:-2]).tolist() + _spelled(tokenizer, "}}")  # '}' '}' where '}}' is a token
    assert _bytes(tokenizer, generated) == CALL.encode()
    spans.record(prompt, generated)
    turn_two = _ids(tokenizer, PROMPT + CALL + AFTER)
    assert turn_two[len(prompt):len(prompt) + len(generated)].tolist() != generated  # the re-encoding differs
    spliced = spans.splice(turn_two)
    assert spliced.token_ids[:len(prompt)].tolist() == prompt.tolist()
    assert spliced.token_ids[len(prompt):len(prompt) + len(generated)].tolist() == generated
    assert _bytes(tokenizer, spliced.token_ids) == _bytes(tokenizer, turn_two)  # the text is unchanged
    assert spans.stats().prompts == 1 and spans.stats().tokens == len(generated)


def test_a_canonical_output_leaves_the_prompt_as_it_is(tokenizer):
    spans = GeneratedSpans(tokenizer.token_bytes)
    prompt = _ids(tokenizer, PROMPT)
    spans.record(prompt, tokenizer.encode(CALL))
    turn_two = _ids(tokenizer, PROMPT + CALL + AFTER)
    spliced = spans.splice(turn_two)
    assert spliced.spans == () and spliced.token_ids.tolist() == turn_two.tolist()
    assert spans.stats().prompts == 0


def test_only_the_stretch_that_agrees_and_ends_on_both_tokenizations_is_taken(tokenizer):
    """A client that sends back less than was generated (a stop string trimmed it, or it
    edited the text) gets the generated tokens only as far as both spell the same bytes and
    both have a token boundary."""
    spans = GeneratedSpans(tokenizer.token_bytes)
    prompt = _ids(tokenizer, PROMPT)
    generated = _spelled(tokenizer, "Sunny and warm today")
    spans.record(prompt, generated)
    edited = _ids(tokenizer, PROMPT + "Sunny and cold today" + AFTER)
    spliced = spans.splice(edited)
    # the bytes agree through "Sunny and ", and the re-encoding's last boundary there is after " and"
    taken = spliced.token_ids[len(prompt):len(prompt) + len("Sunny and")].tolist()
    assert taken == generated[:len("Sunny and")]
    assert [(start, taken) for start, _, taken in spliced.spans] == [(len(prompt), len("Sunny and"))]
    assert _bytes(tokenizer, spliced.token_ids) == _bytes(tokenizer, edited)
    # Nothing in common after the prompt: nothing changes.
    other = _ids(tokenizer, PROMPT + "Rain" + AFTER)
    assert spans.splice(other).token_ids.tolist() == other.tolist()
    # A prompt that only starts like the recorded one is not its continuation.
    unrelated = _ids(tokenizer, PROMPT.replace("Paris", "Oslo") + "Sunny and warm today")
    assert spans.splice(unrelated).token_ids.tolist() == unrelated.tolist()


def test_every_turn_of_a_conversation_is_reused(tokenizer):
    """Turn three carries turn one's and turn two's outputs; turn two's prompt was already
    spliced, and the later record is found over the spliced prefix."""
    spans = GeneratedSpans(tokenizer.token_bytes)
    turn = "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nAnd Oslo?<|eot_id|>" \
           "<|start_header_id|>assistant<|end_header_id|>\n\n"
    one, two = "It is sunny, 21 degrees.", "Cold: -3, snow."
    first = _ids(tokenizer, PROMPT)
    spans.record(first, _spelled(tokenizer, one))
    second = spans.splice(_ids(tokenizer, PROMPT + one + turn)).token_ids
    spans.record(second, _spelled(tokenizer, two))
    third = spans.splice(_ids(tokenizer, PROMPT + one + turn + two + AFTER))
    assert len(third.spans) == 2
    assert third.token_ids[:len(second)].tolist() == second.tolist()
    assert third.token_ids[len(second):len(second) + len(two)].tolist() == _spelled(tokenizer, two)
    # message endpoints move with the replacements
    ends = (len(first), len(_ids(tokenizer, PROMPT + one + turn)))
    assert third.moved(ends) == (len(first), len(second))


def test_the_store_is_bounded(tokenizer):
    spans = GeneratedSpans(tokenizer.token_bytes, capacity=3, max_tokens=40, max_entry_tokens=20)
    for k in range(5):
        spans.record(_ids(tokenizer, f"prompt {k}<|eot_id|>"), _spelled(tokenizer, "abcdefghij"))
    assert spans.stats().entries == 3  # prompts 2, 3 and 4
    spans.record(_ids(tokenizer, "long<|eot_id|>"), _spelled(tokenizer, "x" * 21))  # over max_entry_tokens
    assert spans.stats().entries == 3
    spans.record(_ids(tokenizer, "wide<|eot_id|>"), _spelled(tokenizer, "y" * 20))  # 50 tokens > 40: prompt 2 goes
    assert spans.stats().entries == 3
    assert spans.splice(_ids(tokenizer, "prompt 2<|eot_id|>abcdefghij")).spans == ()
    assert spans.splice(_ids(tokenizer, "prompt 3<|eot_id|>abcdefghij")).spans != ()
    head = len(_ids(tokenizer, "wide<|eot_id|>"))
    kept = spans.splice(_ids(tokenizer, "wide<|eot_id|>" + "y" * 20 + "<|eot_id|>"))
    assert kept.token_ids[head:head + 20].tolist() == _spelled(tokenizer, "y" * 20)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 127_999), min_size=1, max_size=12), st.text(max_size=20), st.text(max_size=20))
def test_the_text_never_changes(tokenizer, output, between, after):
    """Whatever was recorded, a splice keeps the prompt's bytes, and the prompt's first
    tokens stay as they were."""
    spans = GeneratedSpans(tokenizer.token_bytes)
    prompt = _ids(tokenizer, PROMPT)
    spans.record(prompt, output)
    raw = _bytes(tokenizer, output)
    text = raw.decode("utf-8", "replace") if raw else ""
    turn_two = _ids(tokenizer, PROMPT + between + text + after)
    spliced = spans.splice(turn_two)
    assert _bytes(tokenizer, spliced.token_ids) == _bytes(tokenizer, turn_two)
    assert spliced.token_ids[:len(prompt)].tolist() == turn_two[:len(prompt)].tolist()
    if not between and raw == text.encode():
        # the output carried back right after its prompt: its own tokens as far as the text agrees
        assert spliced.spans == () or spliced.spans[0][0] == len(prompt)


def test_a_prompt_that_ends_like_a_recorded_one_is_not_taken_for_it(tokenizer):
    """Same length and the same last tokens (the print the search starts from), different
    earlier tokens: the exact key decides, and nothing is replaced."""
    spans = GeneratedSpans(tokenizer.token_bytes)
    recorded = _ids(tokenizer, "Weather in Paris?" + PROMPT)
    other = _ids(tokenizer, "Weather in Rome?" + PROMPT)
    assert len(recorded) == len(other) and recorded[-8:].tolist() == other[-8:].tolist()
    generated = _spelled(tokenizer, "Sunny")
    spans.record(recorded, generated)
    carried = _ids(tokenizer, "Weather in Rome?" + PROMPT + "Sunny" + AFTER)
    assert spans.splice(carried).spans == ()
    assert spans.splice(_ids(tokenizer, "Weather in Paris?" + PROMPT + "Sunny" + AFTER)).spans != ()
