"""GeneratedSpans: what the model generated after each recent prompt, kept so that a prompt
which carries that text back is tokenized the way it was generated.

A tokenizer encodes a string one way (its canonical tokenization), but a model may spell
the same text with other tokens: a grammar-forced tool call writes ``"`` then ``,`` where
the tokenizer has ``",``, and sampling does the same now and then. The next turn of that
conversation renders the assistant's text back into the prompt, and re-encoding it gives
the canonical tokens, so the prompt differs from what the model saw and the prefix cache
(which matches token IDs) stops at the first such spot.

So each finished request leaves its visible output tokens here, keyed by a BLAKE2b hash
of its prompt's tokens. When a new prompt starts
with a recorded prompt, and its bytes after that point start with the recorded output's
bytes, the output's own tokens replace the canonical ones over the longest stretch where
both tokenizations end on the same byte. The text is unchanged, so the model reads exactly
what it wrote, and the cache covers it. Recorded prompts are tried in increasing length
over the prompt as already replaced, so a conversation of many turns reuses every turn.

Bounded: at most ``capacity`` entries and ``max_tokens`` output tokens in all (the oldest
go first); outputs longer than ``max_entry_tokens`` are not kept. Thread-safe.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

CAPACITY = 4096  # recorded outputs
MAX_TOKENS = 2_000_000  # output tokens held in all (8 MB of int32, plus the bytes of those carried back)
MAX_ENTRY_TOKENS = 32_768  # a longer output is not kept
PRINT_TOKENS = 4  # a recorded prompt's print: its length and its last tokens
_PRINT_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)
_TABLE_SIZE = 1 << 16
_TABLE_MASK = np.uint64(_TABLE_SIZE - 1)


def _prints(ids: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """uint64 prints of the prefixes ``ids[:end]`` for each end (their length and last
    PRINT_TOKENS tokens): a prompt's prefix can be its recorded prompt only where the prints
    agree, so only there is the exact key worth computing."""
    out = ends.astype(np.uint64)
    for k in range(PRINT_TOKENS, 0, -1):  # ids[end - k], or -1 before the start
        at = ends - k
        token = ids[np.maximum(at, 0)].astype(np.int64)
        token[at < 0] = -1
        out = out * _PRINT_MULTIPLIER + token.astype(np.uint64)
    return out


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


def _hasher(ids: np.ndarray | None = None):
    """A prompt's key: BLAKE2b-128 over its int32 tokens (hashlib drops the GIL past 2 KiB;
    a 4k-token prompt takes about 10 us, where a PrefixHistory of it took 250 us)."""
    hasher = hashlib.blake2b(digest_size=16)
    if ids is not None:
        hasher.update(ids.tobytes())
    return hasher


class _Entry:
    __slots__ = ("print", "tokens", "spelling")

    def __init__(self, print_: int, tokens: np.ndarray):
        self.print = print_  # the recorded prompt's print (_prints)
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
        self._prints: dict[int, int] = {}  # recorded prompts' prints -> entries with that print
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
        prompt = np.ascontiguousarray(prompt, dtype=np.int32)
        key = _hasher(prompt).digest()
        entry = _Entry(int(_prints(prompt, np.array([len(prompt)]))[0]), np.asarray(output, dtype=np.int32))
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._forget(old)
            self._entries[key] = entry
            self._prints[entry.print] = self._prints.get(entry.print, 0) + 1
            self._held += len(entry.tokens)
            while len(self._entries) > self.capacity or self._held > self.max_tokens:
                self._forget(self._entries.popitem(last=False)[1])

    def _forget(self, entry: _Entry) -> None:
        self._held -= len(entry.tokens)
        left = self._prints[entry.print] - 1
        if left:
            self._prints[entry.print] = left
        else:
            del self._prints[entry.print]

    # -- replacement ---------------------------------------------------------

    def splice(self, token_ids: np.ndarray) -> Spliced:
        """``token_ids`` with every recorded output it carries back spelled as generated."""
        ids = np.ascontiguousarray(token_ids, dtype=np.int32)
        with self._lock:
            known = np.sort(np.fromiter(self._prints, dtype=np.uint64, count=len(self._prints)))
        if not len(known) or len(ids) < 2:
            return Spliced(ids)
        spans = []
        hasher, hashed = _hasher(), 0
        candidates = self._candidates(ids, 0, known)
        while candidates:
            length = candidates.pop(0)
            # ids before ``length`` never change: the hash only grows over the spliced ids
            hasher.update(ids[hashed:length].tobytes())
            hashed = length
            key = hasher.digest()
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
            candidates = self._candidates(ids, length, known)  # the ids after it changed
        if spans:
            with self._lock:
                self._prompts += 1
                self._tokens += sum(taken for _, _, taken in spans)
        return Spliced(ids, tuple(spans))

    @staticmethod
    def _candidates(ids: np.ndarray, after: int, known: np.ndarray) -> list[int]:
        """Prefix lengths past ``after`` whose print some recorded prompt has, in order
        (``known``: the recorded prints, sorted)."""
        ends = np.arange(after + 1, len(ids), dtype=np.int64)
        prints = _prints(ids, ends)
        # A table over the prints' low bits first (cache-friendly; at 4,096 recorded prompts
        # about 6% of ends get through), then the exact search for those.
        table = np.zeros(_TABLE_SIZE, dtype=bool)
        table[known & _TABLE_MASK] = True
        near = np.flatnonzero(table[prints & _TABLE_MASK])
        at = np.minimum(np.searchsorted(known, prints[near]), len(known) - 1)
        return ends[near[known[at] == prints[near]]].tolist()

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
