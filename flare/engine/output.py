"""Output processing shared by every engine: stop strings over decoded text.

A request's output arrives as decoded text deltas. :class:`StopText` decides
what of it may be published now. The output ends at the earliest position where
any stop string occurs in the whole output, whatever the deltas' boundaries
(one token or many, characters split across tokens): text from a position where
a stop string could still complete is withheld until it does (the output ends
there; neither the stop string nor anything after it is published) or can no
longer do so. The real runtime and the fake engine both run this one
implementation, so the server tests exercise the code users run.
"""

from __future__ import annotations

from typing import Sequence


class StopText:
    """Stop-string state of one request's decoded output."""

    __slots__ = ("stops", "pending", "stopped")

    def __init__(self, stops: Sequence[str]):
        self.stops = tuple(s for s in stops if s)
        self.pending = ""  # decoded, not published: a stop string may start in it
        self.stopped: str | None = None  # the stop string that ended the output

    def feed(self, text: str, *, final: bool = False) -> tuple[str, str | None]:
        """Publishable text once ``text`` arrives, and the stop string that ended the output.

        ``final``: nothing follows, so withheld text that no stop string completed is
        released. After a stop string matched, later text is dropped.
        """
        if self.stopped is not None:
            return "", self.stopped
        if not self.stops:
            return text, None
        text = self.pending + text
        at, stop = self._earliest_match(text)
        hold_from = len(text) if final else len(text) - self._partial_tail(text)
        if stop is not None and at < hold_from:
            # No occurrence that starts earlier (or a longer one at the same place) can
            # still complete: this one is first.
            self.pending, self.stopped = "", stop
            return text[:at], stop
        self.pending = text[hold_from:]
        return text[:hold_from], None

    def flush(self, text: str = "") -> tuple[str, str | None]:
        """The output ends with ``text``: what is left to publish, and any stop string."""
        return self.feed(text, final=True)

    def _earliest_match(self, text: str) -> tuple[int, str | None]:
        """The first complete stop string in ``text`` (the longest at one position)."""
        best, found = len(text) + 1, None
        for stop in self.stops:
            at = text.find(stop)
            if at >= 0 and (at < best or (at == best and len(stop) > len(found))):
                best, found = at, stop
        return best, found

    def _partial_tail(self, text: str) -> int:
        """Length of the longest suffix of ``text`` that is a proper prefix of a stop string."""
        hold = 0
        for stop in self.stops:
            for k in range(min(len(stop) - 1, len(text)), hold, -1):
                if text.endswith(stop[:k]):
                    hold = k
                    break
        return hold
