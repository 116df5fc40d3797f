"""What a generation request's output is parsed for, and the grammar that forces a tool call.

Every chat-shaped family (OpenAI chat, Responses, Anthropic, Ollama) reduces its
tool settings to one :class:`ToolChoice`; :func:`output_plan` turns that, the
request's tools and the served parsers into an :class:`OutputPlan`:

- the output parser the request's text goes through (frontend/parsers: the
  served reasoning parser, then the tool-call parser when the request has tools
  and its tool choice is not ``none``);
- for ``required`` and a named function, a grammar over the served tool parser's
  syntax whose arguments follow each tool's parameter schema, so the model
  always produces a call (structured output's machinery, frontend/grammar);
- ``parallel`` false keeps only the first call (and the grammar allows one).

Tools are OpenAI function objects (``{"type": "function", "function": {...}}``),
the form every family already hands the chat template.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ..errors import AdmissionError
from ..frontend import parsers
from ..frontend.parsers import Delta, OutputParser, ToolCallArguments, ToolCallEnd, ToolCallStart
from ..frontend.parsers.detect import reasoning_opened
from ..request import GrammarRequest, PreparedPrompt

TOOL_CHOICE_MODES = ("auto", "none", "required", "function")


@dataclass(frozen=True)
class ToolChoice:
    """A request's tool choice, whatever its family called it."""

    mode: str = "auto"  # auto | none | required | function
    name: str | None = None  # the function a "function" choice names
    parallel: bool = True  # more than one call allowed (OpenAI's parallel_tool_calls)
    param: str = "tool_choice"  # the request field, for errors

    @property
    def is_forced(self) -> bool:
        return self.mode in ("required", "function")


AUTO = ToolChoice()


@dataclass(frozen=True)
class OutputPlan:
    """How one request's output is parsed, and the grammar that forces its tool call."""

    tool_parser: str | None = None
    reasoning_parser: str | None = None
    tools: tuple[dict[str, Any], ...] | None = None
    grammar: GrammarRequest | None = None
    single_call: bool = False

    def parser(self, prompt: PreparedPrompt) -> OutputParser:
        """The request's parser; a prompt that opened the reasoning tag starts inside it."""
        opened = False
        if self.reasoning_parser and prompt.text:
            # the reasoning parser's own tags ([THINK] too); a parser without tags never starts open
            factory = parsers.get(self.reasoning_parser)
            open_tag = getattr(factory, "open_tag", None)
            opened = open_tag is not None and reasoning_opened(prompt.text, open_tag, factory.close_tag)
        parser = parsers.build(self.tool_parser, self.reasoning_parser,
                               tools=list(self.tools) if self.tools is not None else None, reasoning_opened=opened)
        return FirstCallOnly(parser) if self.single_call and self.tool_parser else parser


PLAIN_OUTPUT = OutputPlan()


def output_plan(tool_parser: str | None, reasoning_parser: str | None, tools: Sequence[dict[str, Any]] | None,
                choice: ToolChoice = AUTO, *, reasoning: bool = True,
                special_tokens: Mapping[str, int] | None = None) -> OutputPlan:
    """The plan for a chat request: ``tool_parser`` and ``reasoning_parser`` are the served
    ones (None: none), ``reasoning`` False leaves thinking text in the content (Ollama
    without ``think``), ``special_tokens`` the parser markers that are special tokens
    (text -> id: a forced call writes them as those tokens). 400 when the choice cannot be
    honoured."""
    reasoning_name = reasoning_parser if reasoning else None
    tools = tuple(tools) if tools else ()
    if choice.mode == "none" or not tools:
        if choice.is_forced:
            raise AdmissionError(f"tool_choice '{choice.mode}' needs at least one tool in 'tools'", status=400,
                                 code="invalid_request_error", param=choice.param)
        return OutputPlan(reasoning_parser=reasoning_name)
    grammar = None
    if choice.is_forced:
        if tool_parser is None:
            raise AdmissionError(f"tool_choice '{choice.mode}' needs a tool-call parser, and the served model has "
                                 f"none (start flare-serve with --tool-parser NAME)", status=400,
                                 code="unsupported_parameter", param=choice.param)
        for index, tool in enumerate(tools):
            parameters = tool["function"].get("parameters")
            if parameters is not None and not isinstance(parameters, dict):
                raise AdmissionError(f"tools[{index}].function.parameters must be a JSON Schema object to force a "
                                     f"call", status=400, code="invalid_request_error",
                                     param=f"tools[{index}].function.parameters")
        names = [tool_name(tool) for tool in tools]
        if choice.mode == "function" and choice.name not in names:
            raise AdmissionError(f"tool_choice names the function '{choice.name}', which is not among the "
                                 f"request's tools ({', '.join(map(str, names))})", status=400,
                                 code="invalid_request_error", param=choice.param)
        try:
            text = parsers.get(tool_parser).tool_grammar(list(tools), name=choice.name, parallel=choice.parallel,
                                                         special_tokens=special_tokens)
        except ValueError as exc:  # a tool the family's syntax cannot force
            raise AdmissionError(f"tool_choice '{choice.mode}' cannot be forced: {exc}", status=400,
                                 code="invalid_request_error", param=choice.param) from None
        grammar = GrammarRequest("grammar", text, param=choice.param)
    return OutputPlan(tool_parser, reasoning_name, tools, grammar, single_call=not choice.parallel)


def check_one_constraint(choice: ToolChoice, grammar: GrammarRequest | None) -> None:
    """A forced tool call is a grammar of its own: it cannot also follow a response format."""
    if choice.is_forced and grammar is not None:
        raise AdmissionError(f"tool_choice '{choice.mode}' cannot be combined with a structured-output constraint "
                             f"('{grammar.param}'): the call's arguments already follow the tool's schema",
                             status=400, code="invalid_request_error", param=choice.param)


def tool_name(tool: dict[str, Any]) -> str | None:
    function = tool.get("function") if isinstance(tool, dict) else None
    return function.get("name") if isinstance(function, dict) else None


class FirstCallOnly(OutputParser):
    """``parallel_tool_calls: false`` on an unforced request: the first call, none after it."""

    __slots__ = ("_inner",)

    def __init__(self, inner: OutputParser):
        self._inner = inner

    @property
    def malformed(self) -> int:
        return getattr(self._inner, "malformed", 0)

    def feed(self, text: str) -> list[Delta]:
        return self._first(self._inner.feed(text))

    def finish(self) -> list[Delta]:
        return self._first(self._inner.finish())

    @staticmethod
    def _first(deltas: list[Delta]) -> list[Delta]:
        return [d for d in deltas if not (type(d) in (ToolCallStart, ToolCallArguments, ToolCallEnd) and d.index)]
