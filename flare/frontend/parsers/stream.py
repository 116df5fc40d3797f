"""The streaming machinery under the parsers: a family's syntax written as one generator.

A :class:`StreamParser` reads its output through ``_main``, a generator built from the
primitives below. Each primitive consumes what it can decide now and suspends (``yield``)
when it needs more text; ``feed`` appends the piece and resumes the generator where it
stopped, so the syntax reads top to bottom while parsing stays incremental. What a
primitive cannot decide yet (a suffix that could begin a marker, a literal cut short)
stays unread in the buffer: at most one marker's length, so every character is examined
a bounded number of times and ``feed`` costs about as much as its text is long.

At ``finish`` the primitives see the end of the output and decide with what they have:
none of them suspends then, so the generator runs to its end.
"""

from __future__ import annotations

import re
from typing import Callable, Generator, Iterable

from .base import ContentDelta, Delta, OutputParser

Reader = Generator[None, None, object]  # a primitive: suspends for more text, returns its result

_WHITESPACE = re.compile(r"[ \t\r\n]*")


def find_first(text: str, start: int, stops: Iterable[str]) -> tuple[int, str | None]:
    """The earliest of ``stops`` in ``text[start:]``: (its index, the stop), or (-1, None)."""
    best, found = -1, None
    for stop in stops:
        at = text.find(stop, start)
        if at >= 0 and (best < 0 or at < best):
            best, found = at, stop
    return best, found


def partial_len(text: str, start: int, stops: Iterable[str]) -> int:
    """The length of the longest suffix of ``text[start:]`` that begins one of ``stops``."""
    longest = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text) - start), longest, -1):
            if text.endswith(stop[:size]):
                longest = size
                break
    return longest


class StreamParser(OutputParser):
    """A parser whose syntax is the generator ``_main`` (subclasses write it)."""

    __slots__ = ("_buf", "_pos", "_eof", "_out", "_run")

    def __init__(self):
        self._buf = ""  # NOTE: only _buf[_pos:] is unread; it stays shorter than a marker between feeds
        self._pos = 0
        self._eof = False
        self._out: list[Delta] = []
        self._run: Reader | None = self._main()

    def feed(self, text: str) -> list[Delta]:
        if text:
            self._buf = self._buf[self._pos:] + text
            self._pos = 0
            self._resume()
        return self._flush()

    def finish(self) -> list[Delta]:
        self._eof = True
        self._resume()
        return self._flush()

    def _main(self) -> Reader:
        raise NotImplementedError

    def _resume(self) -> None:
        if self._run is not None:
            try:
                next(self._run)
            except StopIteration:
                self._run = None

    def _flush(self) -> list[Delta]:
        out, self._out = self._out, []
        return out

    # -- primitives: each is a generator (``yield from``) unless it says otherwise ------------

    def _consumed(self, piece: str) -> None:
        """Called with every piece a primitive consumes (content scanning aside)."""

    def _take(self, size: int) -> str:
        """Consume the next ``size`` unread characters (a plain method)."""
        piece = self._buf[self._pos:self._pos + size]
        self._pos += size
        self._consumed(piece)
        return piece

    def _more(self) -> Reader:
        """Suspend until the next piece arrives; False at the end of the output."""
        if self._eof:
            return False
        yield
        return True

    def _wait(self) -> Reader:
        """True once an unread character is available; False at the end of the output."""
        while self._pos >= len(self._buf):
            if not (yield from self._more()):
                return False
        return True

    def _peek(self) -> Reader:
        """The next character, unconsumed; None at the end of the output."""
        return self._buf[self._pos] if (yield from self._wait()) else None

    def _at(self, literal: str) -> Reader:
        """Whether the unread text starts with ``literal`` (nothing consumed)."""
        while True:
            have = self._buf[self._pos:self._pos + len(literal)]
            if not literal.startswith(have):
                return False
            if len(have) == len(literal):
                return True
            if not (yield from self._more()):
                return False

    def _literal(self, literal: str) -> Reader:
        """Consume ``literal`` if the unread text starts with it; whether it did."""
        if (yield from self._at(literal)):
            self._take(len(literal))
            return True
        return False

    def _skip_ws(self) -> Reader:
        """Consume whitespace up to the next other character (or the end); return it."""
        skipped = []
        while (yield from self._wait()):
            end = _WHITESPACE.match(self._buf, self._pos).end()
            skipped.append(self._take(end - self._pos))
            if end < len(self._buf):
                break
        return "".join(skipped)

    def _reach(self, stops: tuple[str, ...]) -> tuple[int, str | None]:
        """How far the unread text may be consumed before one of ``stops`` (a plain method):
        (the first stop's index, that stop), or (the end less a suffix that could begin
        one, None)."""
        hit, stop = find_first(self._buf, self._pos, stops)
        if stop is not None:
            return hit, stop
        return len(self._buf) - (0 if self._eof else partial_len(self._buf, self._pos, stops)), None

    def _content(self, stops: tuple[str, ...], kind: Callable[[str], Delta] = ContentDelta) -> Reader:
        """Pass text on as ``kind`` deltas up to the first of ``stops``; consume that stop and
        return it, or None when the output ends first. Only a suffix that could begin a stop
        is held back."""
        while True:
            buf, pos = self._buf, self._pos
            end, stop = self._reach(stops)
            if end > pos:
                self._out.append(kind(buf[pos:end]))
            self._pos = end
            if stop is not None:
                self._pos += len(stop)
                return stop
            if not (yield from self._more()):
                return None

    def _until(self, stops: tuple[str, ...], *, allowed: re.Pattern | None = None, limit: int | None = None,
               sink: Callable[[str], None] | None = None) -> Reader:
        """Read text up to the first of ``stops`` and consume that stop: (text, stop), where the
        text went to ``sink`` instead when one is given. None when the output ends first, a
        character outside ``allowed`` comes (it stays unread) or the text exceeds ``limit``."""
        parts: list[str] = []
        size = 0
        while True:
            buf, pos = self._buf, self._pos
            end, stop = self._reach(stops)
            refused = False
            if allowed is not None:
                good = allowed.match(buf, pos, end).end()
                if good < end:
                    end, stop, refused = good, None, True
            piece = self._take(end - pos)
            size += len(piece)
            if limit is not None and size > limit:
                return None
            if sink is not None:
                sink(piece)
            elif piece:
                parts.append(piece)
            if refused:
                return None
            if stop is not None:
                self._take(len(stop))
                return "".join(parts), stop
            if not (yield from self._more()):
                return None
