"""Output parsers: tool calls and reasoning, one module per model family.

:func:`build` makes a request's parser from a tool-call parser's name and a reasoning
parser's (the names :func:`detect.detect` picks from a chat template); ``get(name)()``
makes one alone. ``feed(text)`` turns each piece of output into typed deltas and
``finish()`` flushes the rest (base.py). A new family is one module here that subclasses
:class:`ToolParser` (toolcall.py, written over the generator primitives of stream.py) or
:class:`StreamParser`, decorates it with ``@register("name")``, and is imported below.
Each tool parser's ``tool_grammar`` writes the grammar that forces a call (grammar.py).
"""

from . import deepseek, glm, granite, hermes, kimi, llama3_json, mistral, plain, qwen3_coder, think  # noqa: F401
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
from .compose import ComposedParser, build
from .detect import detect, reasoning_opened
from .registry import (
                       ParserFactory,
                       check_parser_name,
                       get,
                       names,
                       parser_names,
                       reasoning_parser_names,
                       register,
                       served,
                       syntax_of,
                       tool_parser_names,
)
from .stream import StreamParser
from .toolcall import ToolParser

PLAIN = "plain"

__all__ = ["ComposedParser", "ContentDelta", "Delta", "OutputAssembler", "OutputParser", "PLAIN", "ParsedOutput",
           "ParserFactory", "ReasoningDelta", "StreamParser", "ToolCall", "ToolCallArguments", "ToolCallEnd",
           "ToolCallStart", "ToolParser", "build", "check_parser_name", "detect", "get", "names", "parser_names",
           "reasoning_opened", "reasoning_parser_names", "register", "served", "syntax_of",
           "tool_parser_names"]
