"""The frontend's tokenizer: Hugging Face ``tokenizers`` plus offsets and incremental decoding.

:class:`Tokenizer` wraps one ``tokenizers.Tokenizer`` parsed from tokenizer.json
bytes. Besides encode/decode it gives token character offsets that are never
trimmed (message endpoints are cut where no token straddles a position, so a
post-processor that trims whitespace from offsets would hide straddling
tokens), and the raw bytes of a single token for logprobs.

:class:`IncrementalDecoder` turns generated token ids into text as they arrive.
It decodes a short window of recent tokens and emits only what the newest
tokens added, holding text back while it ends in an incomplete UTF-8 sequence
(U+FFFD from a partial byte-level or byte-fallback token). The concatenation
of everything :meth:`IncrementalDecoder.push` and :meth:`IncrementalDecoder.flush`
return equals one full decode of the same ids.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from typing import Iterable, Sequence

import numpy as np
import tokenizers

from ..errors import FrontendError

REPLACEMENT = "\ufffd"


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: every byte as a printable character."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    chars = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, map(chr, chars)))


_UNICODE_TO_BYTE = {char: byte for byte, char in _bytes_to_unicode().items()}


def _decoder_kinds(config: dict | None) -> set[str]:
    """The decoder types a tokenizer.json uses (flattening Sequence decoders)."""
    if not config:
        return set()
    if config.get("type") == "Sequence":
        kinds: set[str] = set()
        for item in config.get("decoders", []):
            kinds |= _decoder_kinds(item)
        return kinds
    return {config.get("type", "")}


def _trims_offsets(config: dict | None) -> bool:
    """Whether a post-processor rewrites offsets (ByteLevel/RoBERTa with trim_offsets)."""
    if not config:
        return False
    if config.get("type") == "Sequence":
        return any(_trims_offsets(item) for item in config.get("processors", []))
    return config.get("type") in ("ByteLevel", "RobertaProcessing") and bool(config.get("trim_offsets", False))


# Texts shorter than this are encoded holding the GIL (well under a millisecond); longer
# ones through the batch entry point, which releases it.
GIL_FREE_ENCODE_CHARS = 4096


def _encode_batch_fast(backend: "tokenizers.Tokenizer"):
    """``encode_batch_fast`` (ids without character offsets) where the release has it."""
    return getattr(backend, "encode_batch_fast", backend.encode_batch)


class Tokenizer:
    """A Hugging Face tokenizer parsed from tokenizer.json bytes. Thread-safe for encode/decode."""

    def __init__(self, data: bytes):
        try:
            config = json.loads(data)
            self._inner = tokenizers.Tokenizer.from_str(data.decode("utf-8"))
        except Exception as exc:  # json, UTF-8 and tokenizers (which raises plain Exception) errors alike
            raise FrontendError(f"tokenizer.json could not be parsed: {exc}") from None
        # Offsets come from a copy without the post-processor when that one trims
        # them; ids are identical without special tokens, which is how chats encode.
        if _trims_offsets(config.get("post_processor")):
            self._plain = tokenizers.Tokenizer.from_str(data.decode("utf-8"))
            self._plain.post_processor = None
        else:
            self._plain = self._inner
        decoders = _decoder_kinds(config.get("decoder"))
        self._byte_level = "ByteLevel" in decoders
        self._byte_fallback = "ByteFallback" in decoders
        self._metaspace = "Metaspace" in decoders or "Replace" in decoders
        added = config.get("added_tokens", [])
        self.special_ids = frozenset(t["id"] for t in added if t.get("special"))
        self._added_ids = frozenset(t["id"] for t in added)
        self.vocab_size = self._inner.get_vocab_size(with_added_tokens=True)
        self._token_bytes: dict[int, bytes] = {}
        self._lock = threading.Lock()

    @property
    def backend(self) -> tokenizers.Tokenizer:
        """The underlying ``tokenizers.Tokenizer``."""
        return self._inner

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``; ``add_special_tokens`` applies the tokenizer.json post-processor.

        A long text is encoded through the batch entry point, which releases the GIL
        while it works (``encode`` holds it: about 19 ms per 100k characters, so a
        megabyte prompt would stall the event loop and every stream for 0.3 s).
        """
        if len(text) < GIL_FREE_ENCODE_CHARS:
            return self._inner.encode(text, add_special_tokens=add_special_tokens).ids
        return _encode_batch_fast(self._inner)([text], add_special_tokens=add_special_tokens)[0].ids

    def encode_offsets(self, text: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(ids int32, starts, ends)``: ids without special tokens and each token's character span."""
        if len(text) < GIL_FREE_ENCODE_CHARS:
            encoding = self._plain.encode(text, add_special_tokens=False)
            ids = np.asarray(encoding.ids, dtype=np.int32)
            offsets = np.asarray(encoding.offsets, dtype=np.int64).reshape(-1, 2)
            return ids, offsets[:, 0], offsets[:, 1]
        # Long text: the encoding releases the GIL (see encode). Its character offsets are
        # one C call that holds it while it builds a tuple per token (about 100 ms for a
        # megabyte when the memory is new), so a byte-level vocabulary derives them from
        # the tokens' bytes instead, vectorized, whenever those bytes spell the text.
        encoding = self._plain.encode_batch([text], add_special_tokens=False)[0]
        ids = np.asarray(encoding.ids, dtype=np.int32)
        spans = self._byte_spans(text, ids) if self._byte_level else None
        if spans is not None:
            return ids, spans[0], spans[1]
        time.sleep(0)
        pairs = encoding.offsets
        time.sleep(0)
        offsets = np.fromiter(itertools.chain.from_iterable(pairs), dtype=np.int64, count=2 * len(pairs))
        offsets = offsets.reshape(-1, 2)
        return ids, offsets[:, 0], offsets[:, 1]

    def _byte_spans(self, text: str, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """Each token's character span, from its bytes; None unless they spell ``text`` exactly.

        A token that ends inside a character spans that whole character (as the
        tokenizer's own offsets do), so a cut there is never clean.
        """
        unique = np.unique(ids)
        lengths = np.zeros(int(unique[-1]) + 1 if len(unique) else 1, np.int64)
        for i, token_id in enumerate(unique.tolist()):
            lengths[token_id] = len(self.token_bytes(token_id))
            if i % 1024 == 1023:
                time.sleep(0)  # hand the GIL over on a long list of new tokens
        raw = text.encode("utf-8")
        token_lengths = lengths[ids]
        ends = np.cumsum(token_lengths)
        if len(ends) and int(ends[-1]) != len(raw):
            return None
        if b"".join([self.token_bytes(t) for t in ids.tolist()]) != raw:
            return None
        starts = ends - token_lengths
        data = np.frombuffer(raw, np.uint8)
        continuation = (data & 0xC0) == 0x80
        # chars_before[b]: characters that start before byte b.
        chars_before = np.concatenate(([0], np.cumsum(~continuation)))
        inside = np.concatenate((continuation, [False]))
        return chars_before[starts] - inside[starts], chars_before[ends]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._inner.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str | None:
        return self._inner.id_to_token(token_id)

    def token_to_id(self, token: str) -> int | None:
        return self._inner.token_to_id(token)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for, even when they are not complete UTF-8 (for logprobs)."""
        cached = self._token_bytes.get(token_id)
        if cached is not None:
            return cached
        token = self._inner.id_to_token(token_id)
        if token is None:
            raise FrontendError(f"token id {token_id} is outside the vocabulary of {self.vocab_size}")
        if token_id in self._added_ids:
            value = token.encode("utf-8")
        elif self._byte_level and all(c in _UNICODE_TO_BYTE for c in token):
            value = bytes(_UNICODE_TO_BYTE[c] for c in token)
        elif self._byte_fallback and len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
            value = bytes([int(token[3:5], 16)])
        elif self._metaspace:
            value = token.replace("\u2581", " ").encode("utf-8")
        else:
            value = self._inner.decode([token_id], skip_special_tokens=False).encode("utf-8")
        with self._lock:
            self._token_bytes[token_id] = value
        return value

    def incremental_decoder(self, skip_special_tokens: bool = True,
                            keep: frozenset[int] = frozenset()) -> "IncrementalDecoder":
        return IncrementalDecoder(self, skip_special_tokens=skip_special_tokens, keep=keep)

    def special_token_ids(self, texts: Iterable[str]) -> dict[str, int]:
        """The texts among ``texts`` that are one special token each, with that token's id."""
        out = {}
        for text in texts:
            token_id = self._inner.token_to_id(text)
            if token_id is not None and token_id in self.special_ids:
                out[text] = token_id
        return out

    def decode_keeping(self, ids: Sequence[int], keep: frozenset[int]) -> str:
        """``decode(ids)`` without special tokens but those in ``keep``, which show as their text
        (tokenizers decodes special tokens apart from the text around them, so the runs between
        them decode as they would alone)."""
        out, start = [], 0
        for i, token_id in enumerate(ids):
            if token_id in keep:
                out.append(self.decode(ids[start:i]))
                out.append(self._inner.id_to_token(token_id))
                start = i + 1
        out.append(self.decode(ids[start:]))
        return "".join(out)


class IncrementalDecoder:
    """Streams the text of generated tokens; one instance per generation, one thread at a time.

    Each :meth:`push` decodes only the tokens since the last emitted chunk plus
    the chunk before it as context (so decoders that strip a leading space or
    join pieces see the same neighbours as a full decode): the cost is
    O(new tokens), not O(all tokens). Text that ends in U+FFFD is held back
    until a later token completes the character; in a valid UTF-8 stream that
    takes a few tokens (a character is at most 4 bytes). When more than
    :attr:`HOLD_TOKENS` tokens from earlier pushes are still pending, the text
    before the trailing U+FFFD run is released (it can no longer change). When
    the text is one U+FFFD run for :attr:`MAX_STALLS` pushes and more than
    :attr:`MAX_PENDING` pending tokens, the stream holds invalid bytes (a valid
    one completes a character within 4 bytes): all but its last 3 characters
    are released and the window slides, which bounds it.

    NOTE: byte-fallback decoding (tokenizers' ByteFallback) turns a whole run
    of byte tokens into one U+FFFD per byte as soon as the run holds one invalid
    byte, retroactively. For such invalid runs the stream keeps the characters
    it already returned; for valid UTF-8 the concatenation equals a full decode.
    """

    HOLD_TOKENS = 16
    MAX_PENDING = 32
    MAX_STALLS = 8

    __slots__ = ("_tokenizer", "_skip", "_keep", "_ids", "_read", "_emitted", "_stalls", "_num_tokens")

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True, keep: frozenset[int] = frozenset()):
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._keep = keep  # special tokens whose text stays in the output (an output parser's markers)
        self._ids: list[int] = []  # the window: context tokens, then pending ones
        self._read = 0  # window[:_read] is context whose text was already returned
        self._emitted = 0  # characters of decode(window) already returned
        self._stalls = 0  # pushes in a row whose text ended in an incomplete character
        self._num_tokens = 0

    @property
    def num_tokens(self) -> int:
        """Tokens pushed so far."""
        return self._num_tokens

    def push(self, token_ids: Iterable[int]) -> str:
        """Add generated tokens; return the text they completed (may be empty)."""
        new_ids = [int(t) for t in token_ids]
        if not new_ids:
            return ""
        self._num_tokens += len(new_ids)
        pending_before = len(self._ids) - self._read
        self._ids.extend(new_ids)
        text = self._decode()
        if len(text) <= self._emitted:
            return ""  # nothing visible yet (skipped special tokens): keep the context as it is
        held = 0
        if text.endswith(REPLACEMENT):  # an incomplete character: wait for its remaining bytes
            self._stalls += 1
            if pending_before <= self.HOLD_TOKENS:
                return ""
            stable = text.rstrip(REPLACEMENT)
            if len(stable) > self._emitted:
                # Release what precedes the incomplete run but keep the window: the run's first
                # bytes must stay in it, or their character could not complete.
                delta, self._emitted = stable[self._emitted:], len(stable)
                return delta
            if pending_before <= self.MAX_PENDING or self._stalls <= self.MAX_STALLS:
                return ""
            held = 3  # invalid bytes: give up on completing them, all but the last 3 characters go out
            text = text[:-held]
        delta = text[self._emitted:]
        # Slide the window: the pending tokens become the next context.
        del self._ids[:self._read]
        self._read = len(self._ids)
        self._emitted = max(0, len(self._decode()) - held)
        self._stalls = 0
        return delta

    def _decode(self) -> str:
        if self._keep and self._skip and not self._keep.isdisjoint(self._ids):
            return self._tokenizer.decode_keeping(self._ids, self._keep)
        return self._tokenizer.decode(self._ids, skip_special_tokens=self._skip)

    def flush(self) -> str:
        """End of generation: return whatever is still held back (incomplete bytes as U+FFFD)."""
        delta = self._decode()[self._emitted:]
        self._ids.clear()
        self._read = 0
        self._emitted = 0
        self._stalls = 0
        return delta
