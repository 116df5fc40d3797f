"""Output parsers: tool calls and reasoning, one module per model family.

``get(name)()`` creates a request's parser; ``feed(text)`` turns each piece of
output into typed deltas and ``finish()`` flushes the rest (base.py). A new
parser is one module here that subclasses :class:`OutputParser`, decorates it
with ``@register("name")``, and is imported below.
"""

from . import plain  # noqa: F401  (registers "plain")
from .base import (
                   ContentDelta,
                   Delta,
                   OutputAssembler,
                   OutputParser,
                   ParsedOutput,
                   ReasoningDelta,
                   ToolCall,
                   ToolCallArguments,
                   ToolCallEnd,
                   ToolCallStart,
)
from .registry import ParserFactory, get, names, register

PLAIN = "plain"

__all__ = ["ContentDelta", "Delta", "OutputAssembler", "OutputParser", "PLAIN", "ParsedOutput", "ParserFactory",
           "ReasoningDelta", "ToolCall", "ToolCallArguments", "ToolCallEnd", "ToolCallStart", "get", "names",
           "register"]
