"""GeneratedSpans: what the model generated after each recent prompt, kept so that a prompt
which carries that text back is tokenized the way it was generated.

A tokenizer encodes a string one way (its canonical tokenization), but a model may spell
the same text with other tokens: a grammar-forced tool call writes ``"`` then ``,`` where
the tokenizer has ``",``, and sampling does the same now and then. The next turn of that
conversation renders the assistant's text back into the prompt, and re-encoding it gives
the canonical tokens, so the prompt differs from what the model saw and the prefix cache
(which matches token IDs) stops at the first such spot.

So each finished request leaves its visible output tokens here, keyed by its prompt's
prefix key (the prefix cache's own key chain, cache/history.py). When a new prompt starts
with a recorded prompt, and its bytes after that point start with the recorded output's
bytes, the output's own tokens replace the canonical ones over the longest stretch where
both tokenizations end on the same byte. The text is unchanged, so the model reads exactly
what it wrote, and the cache covers it. Recorded prompts are tried in increasing length
over the prompt as already replaced, so a conversation of many turns reuses every turn.

Bounded: at most ``capacity`` entries and ``max_tokens`` output tokens in all (the oldest
go first); outputs longer than ``max_entry_tokens`` are not kept. Thread-safe.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from ..cache.history import PrefixHistory

CAPACITY = 4096  # recorded outputs
MAX_TOKENS = 2_000_000  # output tokens held in all (8 MB of int32, plus the bytes of those carried back)
MAX_ENTRY_TOKENS = 32_768  # a longer output is not kept
# The keys' identity: one store serves one model, so any fixed 32 bytes do.
IDENTITY = bytes(32)


@dataclass(frozen=True)
class SpliceStats:
    """Counters since start (read from any thread; exported by /metrics)."""

    prompts: int = 0  # prompts that took at least one recorded output's tokens
    tokens: int = 0  # prompt tokens that came from recorded outputs (and differed from the re-encoding)
    entries: int = 0  # recorded outputs held now


@dataclass(frozen=True)
class Spliced:
    """A prompt's tokens after the replacement, and the replacements, in the order made."""

    token_ids: np.ndarray  # [T'] int32
    spans: tuple[tuple[int, int, int], ...] = ()  # (start, tokens replaced, tokens put there)

    def moved(self, endpoints: Sequence[int]) -> tuple[int, ...]:
        """Token counts of the old prompt (message endpoints) as counts of the new one; a
        count inside a replaced span moves to the span's start."""
        out = []
        for end in endpoints:
            for start, replaced, taken in self.spans:
                if end >= start + replaced:
                    end += taken - replaced
                elif end > start:
                    end = start
            out.append(end)
        return tuple(sorted({e for e in out if 0 < e < len(self.token_ids)}))


class _Entry:
    __slots__ = ("length", "tokens", "spelling")

    def __init__(self, length: int, tokens: np.ndarray):
        self.length = length  # the recorded prompt's token count
        self.tokens = tokens  # the output's token IDs, int32
        # (their bytes concatenated, the byte offset where each token ends): made by the
        # first prompt that carries the output back, on a frontend worker, not at record
        self.spelling: tuple[bytes, np.ndarray] | None = None


class GeneratedSpans:
    """Recent (prompt, output tokens) pairs, and the replacement of re-encoded spans by them."""

    def __init__(self, token_bytes: Callable[[int], bytes], *, capacity: int = CAPACITY,
                 max_tokens: int = MAX_TOKENS, max_entry_tokens: int = MAX_ENTRY_TOKENS):
        self._token_bytes = token_bytes
        self.capacity = capacity
        self.max_tokens = max_tokens
        self.max_entry_tokens = max_entry_tokens
        self._lock = threading.Lock()
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()
        self._lengths: dict[int, int] = {}  # recorded prompt length -> entries of that length
        self._held = 0  # output tokens held
        self._prompts = self._tokens = 0

    def stats(self) -> SpliceStats:
        return SpliceStats(self._prompts, self._tokens, len(self._entries))

    # -- recording -----------------------------------------------------------

    def record(self, prompt: np.ndarray, output: Sequence[int]) -> None:
        """Keep ``output`` (a finished request's visible tokens) as what followed ``prompt``
        (on the model thread: the prompt's key, nothing per output token)."""
        if not len(output) or not len(prompt) or len(output) > self.max_entry_tokens:
            return
        key = PrefixHistory(IDENTITY, prompt).key_at(len(prompt))
        entry = _Entry(len(prompt), np.asarray(output, dtype=np.int32))
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._forget(old)
            self._entries[key] = entry
            self._lengths[entry.length] = self._lengths.get(entry.length, 0) + 1
            self._held += len(entry.tokens)
            while len(self._entries) > self.capacity or self._held > self.max_tokens:
                self._forget(self._entries.popitem(last=False)[1])

    def _forget(self, entry: _Entry) -> None:
        self._held -= len(entry.tokens)
        left = self._lengths[entry.length] - 1
        if left:
            self._lengths[entry.length] = left
        else:
            del self._lengths[entry.length]

    # -- replacement ---------------------------------------------------------

    def splice(self, token_ids: np.ndarray) -> Spliced:
        """``token_ids`` with every recorded output it carries back spelled as generated."""
        with self._lock:
            lengths = sorted(n for n in self._lengths if n < len(token_ids))
        ids = np.ascontiguousarray(token_ids, dtype=np.int32)
        if not lengths:
            return Spliced(ids)
        spans = []
        history = PrefixHistory(IDENTITY)
        for length in lengths:
            if length >= len(ids):
                break
            # ids before ``length`` never change: the history only grows over the spliced ids
            history.append(ids[len(history):length])
            key = history.key_at(length)
            with self._lock:
                entry = self._entries.get(key)
                if entry is not None:
                    self._entries.move_to_end(key)
            if entry is None:
                continue
            span = self._match(entry, ids, length)
            if span is None:
                continue
            taken, replaced = span
            if replaced == taken and np.array_equal(ids[length:length + replaced], entry.tokens[:taken]):
                continue  # generated canonically: nothing to replace
            spans.append((length, replaced, taken))
            ids = np.concatenate((ids[:length], entry.tokens[:taken], ids[length + replaced:]))
        if spans:
            with self._lock:
                self._prompts += 1
                self._tokens += sum(taken for _, _, taken in spans)
        return Spliced(ids, tuple(spans))

    def _match(self, entry: _Entry, ids: np.ndarray, start: int) -> tuple[int, int] | None:
        """(output tokens taken, prompt tokens they replace) over the longest stretch from
        ``start`` where the prompt's bytes equal the output's and both end on a token; None
        when not even one token's worth agrees."""
        if entry.spelling is None:  # two workers may both make it: the same value
            pieces = [self._token_bytes(t) for t in entry.tokens.tolist()]
            entry.spelling = b"".join(pieces), np.cumsum([len(p) for p in pieces], dtype=np.int64)
        data, output_ends = entry.spelling
        # Byte offsets after each prompt token from start that agrees whole with the output
        # (every one is at or below ``agreed``), until they cover the output or disagree.
        ends = [0]
        offset = 0
        for token in ids[start:].tolist():
            piece = self._token_bytes(token)
            if data[offset:offset + len(piece)] != piece:
                # agreement ends inside this token; the bytes before it still count
                same, limit = 0, min(len(piece), len(data) - offset)
                while same < limit and piece[same] == data[offset + same]:
                    same += 1
                agreed = offset + same
                break
            offset += len(piece)
            ends.append(offset)
            if offset >= len(data):
                agreed = len(data)
                break
        else:
            agreed = offset
        # The longest byte offset <= agreed where both tokenizations have a boundary.
        prompt_ends = np.asarray(ends, dtype=np.int64)
        common = np.intersect1d(prompt_ends[1:], output_ends[output_ends <= agreed], assume_unique=True)
        if not len(common):
            return None
        boundary = int(common[-1])
        taken = int(np.searchsorted(output_ends, boundary)) + 1
        replaced = int(np.searchsorted(prompt_ends, boundary))
        return taken, replaced
