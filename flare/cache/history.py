"""PrefixHistory: the incremental key chain of one request's token history.

A history is a token sequence plus conditioning events (images), each event
fixed to the absolute position of the first token that depends on it. It
hashes every complete 64-token block as soon as the block is complete
(BLAKE2b-128, chained from the model/recipe identity; the construction is
documented in ``flare/_fast/prefix_hash.pyx``) and derives the key of any exact
endpoint on demand. Keys only ever extend: appending tokens or events never
changes a key that could already be computed, so the scheduler can grow one
history with a request's prompt and output.
"""

from __future__ import annotations

from typing import Iterable, NamedTuple

import numpy as np

from .._fast import prefix_hash
from .errors import HistoryError

BLOCK_TOKENS = prefix_hash.TOKENS_PER_BLOCK  # 64, flare.config.PAGE_TOKENS
KEY_BYTES = prefix_hash.KEY_SIZE  # 16
IDENTITY_BYTES = prefix_hash.IDENTITY_SIZE  # 32

_INT32_MAX = np.iinfo(np.int32).max


class ConditioningEvent(NamedTuple):
    """A conditioning input (an image) consumed at a token position."""

    position: int  # absolute position of the first token that depends on the event
    identity: bytes  # 32-byte semantic identity of the input


def _identity_bytes(identity: object, what: str) -> bytes:
    if not isinstance(identity, (bytes, bytearray, memoryview)):
        raise HistoryError(f"{what} must be {IDENTITY_BYTES} bytes, got {type(identity).__name__}")
    identity = bytes(identity)
    if len(identity) != IDENTITY_BYTES:
        raise HistoryError(f"{what} must be {IDENTITY_BYTES} bytes, got {len(identity)}")
    return identity


def _token_array(tokens: object) -> np.ndarray:
    """Validate token IDs and return them as a contiguous int32 array."""
    array = np.asarray(tokens)
    if array.ndim != 1:
        raise HistoryError(f"token IDs must be one-dimensional, got shape {array.shape}")
    if array.size == 0:
        return np.empty(0, dtype=np.int32)
    if array.dtype.kind not in "iu":
        raise HistoryError(f"token IDs must be integers, got dtype {array.dtype}")
    low, high = int(array.min()), int(array.max())
    if low < 0 or high > _INT32_MAX:
        raise HistoryError(f"token IDs must lie in [0, {_INT32_MAX}], got range [{low}, {high}]")
    return np.ascontiguousarray(array, dtype=np.int32)


def _position(position: object) -> int:
    if isinstance(position, bool) or not isinstance(position, (int, np.integer)):
        raise HistoryError(f"event position must be an integer, got {type(position).__name__}")
    return int(position)


class PrefixHistory:
    """The key chain of a growing token history under one model/recipe identity.

    ``key_at(T)`` is the exact key of the first T tokens together with every
    event whose position is below T. Complete-block keys are computed
    incrementally in compiled code with the GIL released; partial endpoints are
    hashed on demand from the aligned block key below them.
    """

    __slots__ = ("_identity", "_root", "_tokens", "_num_tokens", "_keys", "_num_blocks",
                 "_event_positions", "_event_identities", "_num_events", "_key_blob")

    def __init__(self, identity: bytes, tokens: object = (),
                 events: Iterable[ConditioningEvent | tuple[int, bytes]] = ()):
        """Hash ``tokens`` under ``identity`` (32 bytes), with ``events`` at
        nondecreasing absolute positions (any position, including ones past
        the tokens given so far)."""
        self._identity = _identity_bytes(identity, "model/recipe identity")
        self._root = prefix_hash.root_key(self._identity)
        self._tokens = np.empty(0, dtype=np.int32)
        self._num_tokens = 0
        self._keys = np.empty((0, KEY_BYTES), dtype=np.uint8)
        self._num_blocks = 0
        self._event_positions = np.empty(0, dtype=np.int64)
        self._event_identities = np.empty((0, IDENTITY_BYTES), dtype=np.uint8)
        self._num_events = 0
        self._key_blob: bytes | None = None
        for event in events:
            if not isinstance(event, tuple) or len(event) != 2:
                raise HistoryError(f"an event must be a (position, identity) pair, got {event!r}")
            self.append_event(*event)
        self.append(tokens)

    # -- growth -------------------------------------------------------------

    def append(self, tokens: object) -> None:
        """Append token IDs and hash every block they complete."""
        new = _token_array(tokens)
        if new.size == 0:
            return
        start = self._num_tokens
        end = start + new.size
        if end > self._tokens.size:
            grown = np.empty(max(end, 2 * self._tokens.size, 256), dtype=np.int32)
            grown[:start] = self._tokens[:start]
            self._tokens = grown
        self._tokens[start:end] = new
        self._num_tokens = end
        self._hash_complete_blocks()

    def append_event(self, position: int, identity: bytes) -> None:
        """Append a conditioning event at absolute token ``position``.

        The position may not precede the tokens already appended (that would
        change keys that exist) nor an earlier event; events at equal
        positions keep their order.
        """
        position = _position(position)
        identity = _identity_bytes(identity, "event identity")
        if position < self._num_tokens:
            raise HistoryError(f"event at position {position} precedes the {self._num_tokens} "
                               f"tokens already in the history")
        n = self._num_events
        if n and position < int(self._event_positions[n - 1]):
            raise HistoryError(f"event at position {position} precedes the previous event at "
                               f"{int(self._event_positions[n - 1])}")
        if n == self._event_positions.size:
            capacity = max(8, 2 * n)
            positions = np.empty(capacity, dtype=np.int64)
            positions[:n] = self._event_positions[:n]
            identities = np.empty((capacity, IDENTITY_BYTES), dtype=np.uint8)
            identities[:n] = self._event_identities[:n]
            self._event_positions, self._event_identities = positions, identities
        self._event_positions[n] = position
        self._event_identities[n] = np.frombuffer(identity, dtype=np.uint8)
        self._num_events = n + 1

    def _hash_complete_blocks(self) -> None:
        first = self._num_blocks
        last = self._num_tokens // BLOCK_TOKENS
        if last == first:
            return
        if last > self._keys.shape[0]:
            grown = np.empty((max(last, 2 * self._keys.shape[0], 16), KEY_BYTES), dtype=np.uint8)
            grown[:first] = self._keys[:first]
            self._keys = grown
        start, end = first * BLOCK_TOKENS, last * BLOCK_TOKENS
        lo, hi = self._event_range(start, end)
        prefix_hash.chain_keys(self._identity, self._aligned_key(start), self._tokens[start:end],
                               start, self._event_positions[lo:hi], self._event_identities[lo:hi],
                               self._keys[first:last])
        self._num_blocks = last
        self._key_blob = None

    # -- keys ---------------------------------------------------------------

    def key_at(self, endpoint: int) -> bytes:
        """The exact key of the first ``endpoint`` tokens (0..num_tokens) and the
        events they consume."""
        endpoint = self._check_endpoint(endpoint)
        tail_len = endpoint % BLOCK_TOKENS
        aligned = endpoint - tail_len
        parent = self._aligned_key(aligned)
        if tail_len == 0:
            return parent
        lo, hi = self._event_range(aligned, endpoint)
        return prefix_hash.endpoint_key(self._identity, parent, endpoint,
                                        self._tokens[aligned:endpoint],
                                        self._event_positions[lo:hi], self._event_identities[lo:hi])

    def aligned_key(self, endpoint: int) -> bytes:
        """The key of the 64-aligned prefix at or below ``endpoint``: the bucket
        under which the cache indexes a checkpoint at ``endpoint``."""
        endpoint = self._check_endpoint(endpoint)
        return self._aligned_key(endpoint - endpoint % BLOCK_TOKENS)

    def block_key(self, index: int) -> bytes:
        """The key of complete block ``index`` (the prefix of (index + 1) * 64 tokens)."""
        if not 0 <= index < self._num_blocks:
            raise HistoryError(f"block {index} is not complete; the history has "
                               f"{self._num_blocks} complete blocks")
        return self._keys[index].tobytes()

    def prefix_keys(self) -> bytes:
        """Keys of every aligned prefix, 16 bytes each: the root key, then block
        keys 0..num_blocks-1. Cached until the history grows."""
        if self._key_blob is None:
            self._key_blob = self._root + self._keys[:self._num_blocks].tobytes()
        return self._key_blob

    def _aligned_key(self, aligned: int) -> bytes:
        if aligned == 0:
            return self._root
        return self._keys[aligned // BLOCK_TOKENS - 1].tobytes()

    def _check_endpoint(self, endpoint: object) -> int:
        if isinstance(endpoint, bool) or not isinstance(endpoint, (int, np.integer)):
            raise HistoryError(f"endpoint must be an integer, got {type(endpoint).__name__}")
        endpoint = int(endpoint)
        if not 0 <= endpoint <= self._num_tokens:
            raise HistoryError(f"endpoint {endpoint} is outside the history's "
                               f"{self._num_tokens} tokens")
        return endpoint

    def _event_range(self, start: int, end: int) -> tuple[int, int]:
        """Indices of the events with start <= position < end."""
        positions = self._event_positions[:self._num_events]
        lo, hi = np.searchsorted(positions, (start, end), side="left")
        return int(lo), int(hi)

    # -- views --------------------------------------------------------------

    @property
    def identity(self) -> bytes:
        """The 32-byte model/recipe identity every key is chained from."""
        return self._identity

    @property
    def root_key(self) -> bytes:
        return self._root

    @property
    def num_tokens(self) -> int:
        return self._num_tokens

    @property
    def num_blocks(self) -> int:
        """Complete 64-token blocks (all of them hashed)."""
        return self._num_blocks

    @property
    def num_events(self) -> int:
        return self._num_events

    @property
    def tokens(self) -> np.ndarray:
        """The token IDs, a read-only int32 view."""
        view = self._tokens[:self._num_tokens]
        view.flags.writeable = False
        return view

    @property
    def block_keys(self) -> np.ndarray:
        """[num_blocks, 16] uint8 read-only view of the complete-block keys."""
        view = self._keys[:self._num_blocks]
        view.flags.writeable = False
        return view

    @property
    def events(self) -> tuple[ConditioningEvent, ...]:
        return tuple(ConditioningEvent(int(self._event_positions[i]),
                                       self._event_identities[i].tobytes())
                     for i in range(self._num_events))

    def __len__(self) -> int:
        return self._num_tokens

    def __repr__(self) -> str:
        return (f"PrefixHistory(num_tokens={self._num_tokens}, num_blocks={self._num_blocks}, "
                f"num_events={self._num_events})")
