"""PrefixHistory: incremental keys, conditioning events and stability under appends."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flare.cache import ConditioningEvent, HistoryError, PrefixHistory

from . import reference

IDENTITY = bytes(range(32))
OTHER_IDENTITY = bytes(range(1, 33))


def _tokens(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 1 << 31, size=n, dtype=np.int64).astype(np.int32)


def _all_keys(history: PrefixHistory) -> list[bytes]:
    return [history.key_at(t) for t in range(history.num_tokens + 1)]


def test_keys_match_the_documented_construction():
    rng = random.Random(5)
    tokens = _tokens(333, seed=1)
    events = [(0, rng.randbytes(32)), (70, rng.randbytes(32)), (70, rng.randbytes(32)),
              (128, rng.randbytes(32)), (300, rng.randbytes(32))]
    history = PrefixHistory(IDENTITY, tokens, events)
    assert history.num_tokens == 333 and history.num_blocks == 5 and history.num_events == 5
    assert history.root_key == reference.root_key(IDENTITY)
    assert [row.tobytes() for row in history.block_keys] == reference.block_keys(IDENTITY, tokens, events)
    for endpoint in range(334):
        assert history.key_at(endpoint) == reference.key_at(IDENTITY, tokens, events, endpoint), endpoint


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_incremental_appends_equal_one_shot_hashing(data):
    n = data.draw(st.integers(0, 400))
    tokens = _tokens(n, seed=n)
    positions = sorted(data.draw(st.lists(st.integers(0, n + 5), max_size=6)))
    events = [(p, bytes([i]) * 32) for i, p in enumerate(positions)]
    whole = PrefixHistory(IDENTITY, tokens, events)
    # Grow a second history in random chunks, adding each event once the
    # tokens before it are present.
    grown = PrefixHistory(IDENTITY)
    pending = list(events)
    at = 0
    while at < n:
        while pending and pending[0][0] <= at:
            grown.append_event(*pending.pop(0))
        step = data.draw(st.integers(1, 150))
        next_event = pending[0][0] if pending else n
        step = min(step, n - at, max(1, next_event - at))
        grown.append(tokens[at:at + step])
        at += step
    for event in pending:  # positions at or past the end
        grown.append_event(*event)
    assert grown.num_tokens == n
    assert grown.events == whole.events
    assert _all_keys(grown) == _all_keys(whole)


def test_appending_never_changes_existing_keys():
    tokens = _tokens(500, seed=2)
    history = PrefixHistory(IDENTITY, tokens[:150], [(20, b"a" * 32)])
    before = _all_keys(history)
    history.append_event(150, b"b" * 32)  # at the current end: not yet consumed
    history.append(tokens[150:300])
    history.append_event(420, b"c" * 32)  # in the future
    history.append(tokens[300:500])
    assert _all_keys(history)[:151] == before


def test_an_event_first_affects_prefixes_that_consume_its_position():
    tokens = _tokens(200, seed=3)
    plain = PrefixHistory(IDENTITY, tokens)
    for position in (0, 63, 64, 100, 199):
        conditioned = PrefixHistory(IDENTITY, tokens, [ConditioningEvent(position, b"\x07" * 32)])
        for endpoint in range(201):
            same = plain.key_at(endpoint) == conditioned.key_at(endpoint)
            assert same == (endpoint <= position), (position, endpoint)


def test_events_at_one_position_keep_their_order():
    tokens = _tokens(100, seed=4)
    first, second = b"\x01" * 32, b"\x02" * 32
    ordered = PrefixHistory(IDENTITY, tokens, [(70, first), (70, second)])
    swapped = PrefixHistory(IDENTITY, tokens, [(70, second), (70, first)])
    single = PrefixHistory(IDENTITY, tokens, [(70, first)])
    assert ordered.events == (ConditioningEvent(70, first), ConditioningEvent(70, second))
    assert ordered.key_at(70) == swapped.key_at(70)
    keys = {ordered.key_at(71), swapped.key_at(71), single.key_at(71)}
    assert len(keys) == 3
    # Equal events at different positions of one block also differ.
    assert PrefixHistory(IDENTITY, tokens, [(65, first)]).key_at(100) != \
        PrefixHistory(IDENTITY, tokens, [(66, first)]).key_at(100)


def test_complete_block_keys_do_not_depend_on_the_partial_tail():
    tokens = _tokens(192, seed=5)
    a = PrefixHistory(IDENTITY, tokens[:150], [(140, b"x" * 32)])
    b = PrefixHistory(IDENTITY, np.concatenate([tokens[:128], tokens[:20] + 1]))
    assert a.block_keys.tobytes() == b.block_keys.tobytes()
    assert a.key_at(128) == b.key_at(128)
    assert a.key_at(129) != b.key_at(129)
    assert a.aligned_key(150) == a.key_at(128) == a.block_key(1)


def test_endpoint_keys_encode_the_length():
    # A prefix and a longer history with a zero token appended differ.
    tokens = np.zeros(100, dtype=np.int32)
    history = PrefixHistory(IDENTITY, tokens)
    assert len({history.key_at(t) for t in range(101)}) == 101


def test_identity_separates_every_key():
    tokens = _tokens(130, seed=6)
    a, b = PrefixHistory(IDENTITY, tokens), PrefixHistory(OTHER_IDENTITY, tokens)
    assert not set(_all_keys(a)) & set(_all_keys(b))


def test_token_inputs_are_validated_and_converted():
    as_list = PrefixHistory(IDENTITY, [1, 2, 3, 4] * 20)
    as_int64 = PrefixHistory(IDENTITY, np.array([1, 2, 3, 4] * 20, dtype=np.int64))
    as_uint16 = PrefixHistory(IDENTITY, np.array([1, 2, 3, 4] * 20, dtype=np.uint16))
    assert as_list.key_at(80) == as_int64.key_at(80) == as_uint16.key_at(80)
    assert as_list.tokens.dtype == np.int32
    with pytest.raises(ValueError):
        as_list.tokens[0] = 5  # read-only view
    for bad, message in [(np.zeros((2, 64), np.int32), "one-dimensional"),
                         (np.zeros(64, np.float32), "integers"),
                         (["a"] * 3, "integers"),
                         ([-1, 2], r"\[0, 2147483647\]"),
                         ([1 << 31], r"\[0, 2147483647\]")]:
        with pytest.raises(HistoryError, match=message):
            PrefixHistory(IDENTITY, bad)


def test_invalid_growth_leaves_the_history_unchanged():
    history = PrefixHistory(IDENTITY, _tokens(100, seed=7), [(90, b"e" * 32)])
    before = (_all_keys(history), history.events, history.tokens.copy())
    bad_calls = [
        (lambda: history.append_event(99, b"f" * 32), "precedes the 100 tokens"),
        (lambda: history.append([1, -2]), r"\[0, 2147483647\]"),
        (lambda: history.append_event(100, b"short"), "32 bytes"),
        (lambda: history.append_event("100", b"f" * 32), "integer"),
    ]
    for call, message in bad_calls:
        with pytest.raises(HistoryError, match=message):
            call()
    history.append_event(150, b"g" * 32)
    with pytest.raises(HistoryError, match="precedes the previous event at 150"):
        history.append_event(120, b"h" * 32)
    assert _all_keys(history) == before[0]
    assert history.events[:1] == before[1] and np.array_equal(history.tokens, before[2])


def test_constructor_and_endpoint_validation():
    with pytest.raises(HistoryError, match="identity must be 32 bytes"):
        PrefixHistory(b"\x00" * 31)
    with pytest.raises(HistoryError, match="identity must be 32 bytes"):
        PrefixHistory("not bytes")
    with pytest.raises(HistoryError, match="pair"):
        PrefixHistory(IDENTITY, [], [(1, b"x" * 32, 3)])
    with pytest.raises(HistoryError, match="precedes the previous event"):
        PrefixHistory(IDENTITY, [], [(5, b"x" * 32), (4, b"y" * 32)])
    history = PrefixHistory(IDENTITY, [1] * 10)
    with pytest.raises(HistoryError, match="outside the history"):
        history.key_at(11)
    with pytest.raises(HistoryError, match="outside the history"):
        history.key_at(-1)
    with pytest.raises(HistoryError, match="not complete"):
        history.block_key(0)
    assert history.key_at(0) == history.root_key == history.prefix_keys()


def test_prefix_keys_lists_every_aligned_prefix():
    history = PrefixHistory(IDENTITY, _tokens(200, seed=8))
    keys = history.prefix_keys()
    assert len(keys) == 16 * 4
    assert [keys[16 * b:16 * b + 16] for b in range(4)] == [history.key_at(64 * b) for b in range(4)]
    history.append(_tokens(60, seed=9))
    assert len(history.prefix_keys()) == 16 * 5
