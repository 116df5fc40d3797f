"""StopText: the one stop-string implementation, against the whole-output definition."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from flare.engine.output import StopText

ALPHABET = "ab c\u00e9\u65e5"


def reference(output: str, stops: list[str]) -> tuple[str, str | None]:
    """The output up to the earliest stop string in it (the longest at one position)."""
    found = [(output.find(s), -len(s), s) for s in stops if s and s in output]
    if not found:
        return output, None
    at, _, stop = min(found)
    return output[:at], stop


def run(deltas: list[str], stops: list[str]) -> tuple[str, str | None, list[str]]:
    matcher = StopText(stops)
    published, stop = [], None
    for delta in deltas:
        text, stop = matcher.feed(delta)
        published.append(text)
        if stop is not None:
            break
    if stop is None:
        text, stop = matcher.flush()
        published.append(text)
    return "".join(published), stop, published


@settings(max_examples=400, deadline=None)
@given(st.lists(st.text(ALPHABET, max_size=4), max_size=12), st.lists(st.text(ALPHABET, max_size=4), max_size=4))
def test_any_split_matches_the_whole_output(deltas, stops):
    text, stop, _ = run(deltas, stops)
    expected, expected_stop = reference("".join(deltas), stops)
    assert text == expected
    assert (stop is None) == (expected_stop is None)
    if stop is not None:
        assert stop == expected_stop


def test_a_longer_stop_that_starts_earlier_wins():
    # "c" completes first in time, but "abcd" starts earlier in the output.
    assert run(["ab", "c", "d"], ["abcd", "c"])[:2] == ("", "abcd")
    assert run(["ab", "c", "x"], ["abcd", "c"])[:2] == ("ab", "c")


def test_a_longer_stop_at_the_same_place_is_awaited():
    assert run(["x", "日", "日y"], ["日", "日日"])[:2] == ("x", "日日")
    assert run(["x", "日", "y"], ["日", "日日"])[:2] == ("x", "日")
    assert run(["x", "日"], ["日", "日日"])[:2] == ("x", "日")  # the output ended: the shorter one


def test_withheld_text_is_released_when_it_cannot_start_a_stop():
    _, _, published = run(["Hel", "lo", " wor", "ld"], ["lo!"])
    assert published == ["He", "l", "lo wor", "ld", ""]


def test_nothing_after_a_stop_is_published():
    matcher = StopText(["END"])
    assert matcher.feed("xEN") == ("x", None)
    assert matcher.feed("Dy") == ("", "END")
    assert matcher.feed("more") == ("", "END")
    assert matcher.flush("tail") == ("", "END")


def test_no_stops_passes_text_through():
    matcher = StopText(["", ""])
    assert matcher.feed("abc") == ("abc", None) and matcher.flush() == ("", None)
