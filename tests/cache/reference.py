"""The documented prefix-key construction, recomputed with hashlib only.

This is the specification the compiled keys must equal bit for bit (see the
module docstring of flare/_fast/prefix_hash.pyx).
"""

from __future__ import annotations

import hashlib
import struct
from typing import Sequence

import numpy as np

ROOT_PERSON = b"flare-prefix-rt1"
BLOCK_PERSON = b"flare-prefix-bk1"
ENDPOINT_PERSON = b"flare-prefix-ep1"
P = 64


def _b2(data: bytes, person: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=16, person=person).digest()


def _records(events: Sequence[tuple[int, bytes]], start: int, end: int) -> bytes:
    return b"".join(struct.pack("<Q", pos) + ident for pos, ident in events if start <= pos < end)


def root_key(identity: bytes) -> bytes:
    return _b2(identity, ROOT_PERSON)


def block_keys(identity: bytes, tokens: np.ndarray, events: Sequence[tuple[int, bytes]]) -> list[bytes]:
    """Keys of every complete block of tokens."""
    tokens = np.asarray(tokens, dtype="<i4")
    keys = []
    parent = root_key(identity)
    for b in range(len(tokens) // P):
        start, end = b * P, (b + 1) * P
        message = tokens[start:end].tobytes() + parent + identity + _records(events, start, end)
        parent = _b2(message, BLOCK_PERSON)
        keys.append(parent)
    return keys


def key_at(identity: bytes, tokens: np.ndarray, events: Sequence[tuple[int, bytes]], endpoint: int) -> bytes:
    """The exact key of the first ``endpoint`` tokens."""
    tokens = np.asarray(tokens, dtype="<i4")
    aligned = endpoint - endpoint % P
    chain = block_keys(identity, tokens[:aligned], events)
    parent = chain[-1] if chain else root_key(identity)
    if endpoint == aligned:
        return parent
    message = (struct.pack("<Q", endpoint) + parent + identity + tokens[aligned:endpoint].tobytes()
               + _records(events, aligned, endpoint))
    return _b2(message, ENDPOINT_PERSON)
