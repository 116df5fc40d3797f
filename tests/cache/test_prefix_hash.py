"""The compiled BLAKE2b and key construction against hashlib."""

from __future__ import annotations

import hashlib
import os
import random
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flare._fast import prefix_hash

from . import reference

IDENTITY = bytes(range(32))
NO_POSITIONS = np.zeros(0, dtype=np.int64)
NO_IDENTITIES = np.zeros((0, 32), dtype=np.uint8)


def test_blake2b_matches_hashlib_across_block_boundaries():
    rng = random.Random(7)
    lengths = sorted({0, 1, 63, 64, 111, 127, 128, 129, 255, 256, 257, 304, 383, 384, 385, 1024}
                     | {rng.randrange(0, 2000) for _ in range(40)})
    for length in lengths:
        data = rng.randbytes(length)
        for digest_size in (1, 16, 20, 32, 48, 64):
            for person in (None, b"", b"x", b"flare-prefix-bk1"):
                expected = hashlib.blake2b(data, digest_size=digest_size, person=person or b"").digest()
                assert prefix_hash.blake2b(data, digest_size, person) == expected, (length, digest_size)


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=1500), digest_size=st.integers(1, 64),
       person=st.one_of(st.none(), st.binary(max_size=16)))
def test_blake2b_matches_hashlib_on_random_inputs(data, digest_size, person):
    expected = hashlib.blake2b(data, digest_size=digest_size, person=person or b"").digest()
    assert prefix_hash.blake2b(data, digest_size, person) == expected


def test_blake2b_rfc7693_appendix_a_vector():
    # RFC 7693 Appendix A: BLAKE2b-512("abc").
    expected = bytes.fromhex(
        "ba80a53f981c4d0d6a2797b69f12f6e94c212f14685ac4b74b12bb6fdbffa2d1"
        "7d87c5392aab792dc252d5de4533cc9518d38aa8dbf1925ab92386edd4009923")
    assert prefix_hash.blake2b(b"abc", 64) == expected


def test_blake2b_rejects_bad_parameters():
    with pytest.raises(ValueError, match="digest_size"):
        prefix_hash.blake2b(b"", 0)
    with pytest.raises(ValueError, match="digest_size"):
        prefix_hash.blake2b(b"", 65)
    with pytest.raises(ValueError, match="person"):
        prefix_hash.blake2b(b"", 16, b"x" * 17)


def test_root_key_is_blake2b_of_identity():
    assert prefix_hash.root_key(IDENTITY) == reference.root_key(IDENTITY)
    with pytest.raises(ValueError, match="identity must be 32 bytes"):
        prefix_hash.root_key(b"short")


def _events(n_tokens: int, count: int, rng: random.Random) -> list[tuple[int, bytes]]:
    positions = sorted(rng.randrange(0, n_tokens) for _ in range(count))
    # Repeat one position so that equal-position ordering is exercised.
    if count >= 2:
        positions[1] = positions[0]
    return [(p, rng.randbytes(32)) for p in positions]


def _event_arrays(events):
    positions = np.array([p for p, _ in events], dtype=np.int64)
    identities = np.frombuffer(b"".join(i for _, i in events), dtype=np.uint8).reshape(-1, 32).copy()
    return positions, identities


@pytest.mark.parametrize("num_blocks,num_events", [(1, 0), (5, 0), (7, 3), (12, 9)])
def test_chain_keys_match_reference(num_blocks, num_events):
    rng = random.Random(num_blocks * 31 + num_events)
    tokens = np.array([rng.randrange(0, 1 << 31) for _ in range(num_blocks * 64)], dtype=np.int32)
    events = _events(len(tokens), num_events, rng)
    out = np.zeros((num_blocks, 16), dtype=np.uint8)
    prefix_hash.chain_keys(IDENTITY, reference.root_key(IDENTITY), tokens, 0, *_event_arrays(events), out)
    assert [row.tobytes() for row in out] == reference.block_keys(IDENTITY, tokens, events)


def test_chain_keys_continue_from_a_parent():
    rng = random.Random(3)
    tokens = np.array([rng.randrange(0, 50000) for _ in range(6 * 64)], dtype=np.int32)
    expected = reference.block_keys(IDENTITY, tokens, [])
    out = np.zeros((4, 16), dtype=np.uint8)
    prefix_hash.chain_keys(IDENTITY, expected[1], tokens[128:], 128, NO_POSITIONS, NO_IDENTITIES, out)
    assert [row.tobytes() for row in out] == expected[2:]


def test_endpoint_key_matches_reference():
    rng = random.Random(11)
    tokens = np.array([rng.randrange(0, 50000) for _ in range(200)], dtype=np.int32)
    events = [(130, rng.randbytes(32)), (130, rng.randbytes(32)), (150, rng.randbytes(32))]
    parent = reference.key_at(IDENTITY, tokens, events, 128)
    for endpoint in (129, 131, 150, 151, 191):
        inside = [(p, i) for p, i in events if 128 <= p < endpoint]
        positions, identities = _event_arrays(inside) if inside else (NO_POSITIONS, NO_IDENTITIES)
        key = prefix_hash.endpoint_key(IDENTITY, parent, endpoint, tokens[128:endpoint], positions, identities)
        assert key == reference.key_at(IDENTITY, tokens, events, endpoint)


def test_low_level_validation():
    root = reference.root_key(IDENTITY)
    tokens = np.zeros(128, dtype=np.int32)
    out = np.zeros((2, 16), dtype=np.uint8)
    with pytest.raises(ValueError, match="parent must be 16 bytes"):
        prefix_hash.chain_keys(IDENTITY, b"x", tokens, 0, NO_POSITIONS, NO_IDENTITIES, out)
    with pytest.raises(ValueError, match="need 128 tokens"):
        prefix_hash.chain_keys(IDENTITY, root, tokens[:100], 0, NO_POSITIONS, NO_IDENTITIES, out)
    with pytest.raises(ValueError, match="multiple of 64"):
        prefix_hash.chain_keys(IDENTITY, root, tokens, 10, NO_POSITIONS, NO_IDENTITIES, out)
    late = np.array([128], dtype=np.int64)
    with pytest.raises(ValueError, match="event 0 is at 128"):
        prefix_hash.chain_keys(IDENTITY, root, tokens, 0, late, np.zeros((1, 32), np.uint8), out)
    unordered = np.array([5, 4], dtype=np.int64)
    with pytest.raises(ValueError, match="nondecreasing"):
        prefix_hash.chain_keys(IDENTITY, root, tokens, 0, unordered, np.zeros((2, 32), np.uint8), out)
    with pytest.raises(ValueError, match="shape"):
        prefix_hash.chain_keys(IDENTITY, root, tokens, 0, late - 1, np.zeros((2, 32), np.uint8), out)
    with pytest.raises(ValueError, match="not a multiple of 64"):
        prefix_hash.endpoint_key(IDENTITY, root, 64, tokens[:0], NO_POSITIONS, NO_IDENTITIES)
    with pytest.raises(ValueError, match="needs 3 tail tokens"):
        prefix_hash.endpoint_key(IDENTITY, root, 67, tokens[:2], NO_POSITIONS, NO_IDENTITIES)


def test_chain_keys_release_the_gil():
    # While one thread hashes, another must run Python code: with the GIL
    # held, no sample of the main thread could fall inside the hashing call.
    tokens = np.frombuffer(os.urandom(4 << 22), dtype=np.int32) & 0x7FFF  # 4M tokens
    out = np.zeros((tokens.size // 64, 16), dtype=np.uint8)
    root = reference.root_key(IDENTITY)
    span: list[float] = []
    started = threading.Event()

    def hash_all():
        started.set()
        begin = time.perf_counter()
        prefix_hash.chain_keys(IDENTITY, root, tokens, 0, NO_POSITIONS, NO_IDENTITIES, out)
        span.extend((begin, time.perf_counter()))

    worker = threading.Thread(target=hash_all)
    worker.start()
    started.wait()
    samples = []
    while worker.is_alive():
        samples.append(time.perf_counter())
    worker.join()
    begin, end = span
    margin = (end - begin) * 0.1
    inside = [t for t in samples if begin + margin < t < end - margin]
    assert inside, f"no Python progress during {1e3 * (end - begin):.1f} ms of hashing"
