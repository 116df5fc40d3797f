"""The ``think`` reasoning parser: ``<think>...</think>`` (Qwen3, QwQ, DeepSeek-R1, SmolLM3, GLM...).

The text inside the block is reasoning; everything else is content. The block is read
once: the first ``<think>`` opens it (whitespace before it at the very start of the
output is dropped) and after ``</think>`` the rest of the output is content, passed on
as it arrives with nothing held back. With ``opened`` the prompt already opened the block
(the template ended it with ``<think>``, as DeepSeek-R1's and QwQ's do), so the output
starts inside it (a ``<think>`` the model writes again first is dropped). An output that
ends inside the block leaves what it said as reasoning.

Text is kept exactly as written, except the line breaks the templates put around the
tags: those right after ``<think>`` and right after ``</think>`` are dropped, and so are
those right before ``</think>`` (reasoning ``"\\nx\\n"`` between the tags is ``"x"``).
"""

from __future__ import annotations

from typing import ClassVar

from .base import ContentDelta, Delta, ReasoningDelta
from .registry import register
from .stream import Reader, StreamParser

OPEN, CLOSE = "<think>", "</think>"


@register("think")
class ThinkParser(StreamParser):
    """Reasoning in one ``<think>`` block; ``opened``: the prompt ended inside it."""

    __slots__ = ("opened", "_passing")
    name = "think"
    syntax = (OPEN, CLOSE)
    kind = "reasoning"
    open_tag: ClassVar[str] = OPEN
    close_tag: ClassVar[str] = CLOSE

    def __init__(self, opened: bool = False):
        self.opened = opened
        self._passing = False  # after the block: every piece is content as it is
        super().__init__()

    def feed(self, text: str) -> list[Delta]:
        if self._passing and self._pos >= len(self._buf):
            return [ContentDelta(text)] if text else []
        return super().feed(text)

    def _main(self) -> Reader:
        leading = yield from self._skip_ws()
        if not (yield from self._literal(self.open_tag)) and not self.opened:
            if leading:
                self._out.append(ContentDelta(leading))
            if (yield from self._content((self.open_tag,))) is None:
                return
        yield from self._skip_newlines()
        if not (yield from self._reasoning()):
            return
        yield from self._skip_newlines()
        self._passing = True
        yield from self._content(())

    def _skip_newlines(self) -> Reader:
        while (yield from self._wait()):
            end = len(self._buf) - len(self._buf[self._pos:].lstrip("\n"))
            self._pos = end
            if end < len(self._buf):
                return

    def _reasoning(self) -> Reader:
        """Pass reasoning on up to the closing tag (consumed); False when the output ends first.
        Line breaks are held back until it is known whether the tag follows them."""
        newlines = 0
        while True:
            end, stop = self._reach((self.close_tag,))
            text = self._buf[self._pos:end]
            body = text.rstrip("\n")
            if body:
                self._out.append(ReasoningDelta("\n" * newlines + body))
                newlines = 0
            newlines += len(text) - len(body)
            self._pos = end
            if stop:
                self._pos += len(stop)
                return True
            if not (yield from self._more()):
                if newlines:
                    self._out.append(ReasoningDelta("\n" * newlines))
                return False


@register("mistral_think")
class MistralThinkParser(ThinkParser):
    """Magistral and Ministral reasoning: ``[THINK]...[/THINK]``, read as ``think`` reads its tags."""

    __slots__ = ()
    name = "mistral_think"
    open_tag = "[THINK]"
    close_tag = "[/THINK]"
    syntax = ("[THINK]", "[/THINK]")
