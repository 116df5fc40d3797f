"""The plain parser: all output text is content, passed on as it arrives."""

from __future__ import annotations

from .base import ContentDelta, Delta, OutputParser
from .registry import register


@register("plain")
class PlainParser(OutputParser):
    """For models (and routes) with no reasoning or tool-call syntax to recognise."""

    __slots__ = ()
    name = "plain"
    is_plain = True

    def feed(self, text: str) -> list[Delta]:
        return [ContentDelta(text)] if text else []
