"""Validation of OpenAI Responses request bodies (``POST /v1/responses``).

Every field ``openai``'s ``responses.create`` can send is listed here: it is
honoured, or refused with a 400 naming it when it asks for something we do not
do (built-in tools, background runs, conversations); ``text.format`` becomes
the request's grammar (../structured.py). ``null`` counts as absent. Sampling
goes through the OpenAI family's validators and the served model's generation
defaults (openai/schema.py), so a Responses request samples exactly as the chat
request it converts to would.

``input`` becomes OpenAI chat messages (items.py), the form
``engine.prepare_chat`` takes; ``instructions`` become a system message in
front of them and are not carried into the stored conversation (OpenAI's rule:
a continued response does not inherit the earlier instructions).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from ....request import MAX_TOP_LOGPROBS, GenerationDefaults, GrammarRequest, SamplingParams
from ...generation import resolve_max_tokens
from ...request_body import shorten
from ...tool_calls import AUTO, ToolChoice, check_one_constraint
from ..openai.schema import _bool, _check_fields, _int, _invalid, _name, _sampling, _unsupported
from ..structured import text_format
from .items import input_messages

# What this route honours.
FIELDS = frozenset({
    "model", "input", "instructions", "previous_response_id", "store", "stream", "stream_options",
    "max_output_tokens", "temperature", "top_p", "top_logprobs", "include", "tools", "tool_choice",
    "parallel_tool_calls", "max_tool_calls", "text", "reasoning", "metadata", "user", "safety_identifier",
    "prompt_cache_key", "prompt_cache_retention", "truncation", "service_tier", "background",
})
# What the SDK can send and we refuse unless it is null: the reason, for the 400.
REFUSED = {
    "conversation": "the Conversations API is not served; continue with previous_response_id",
    "prompt": "stored prompt templates are not served",
    "context_management": "context management (compaction) is not supported",
    "access_programs": "access programs are not supported",
    "background_options": "background responses are not supported",
    "image": "image inputs are not supported",
    "moderation": "moderation is not supported",
    "prompt_cache_options": "the prefix cache is automatic; it takes no options",
}
ACCEPTED = FIELDS | frozenset(REFUSED)  # refused fields may still be sent as null
LOGPROBS_INCLUDE = "message.output_text.logprobs"
REASONING_EFFORTS = frozenset({"none", "minimal", "low", "medium", "high", "xhigh", "max"})
MAX_METADATA_PAIRS = 16  # OpenAI's limits on metadata
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512


@dataclass(frozen=True)
class ResponsesRequest:
    """A validated Responses request; ``echo`` holds the settings the response object reports."""

    model: str | None
    messages: list[dict[str, Any]]  # this request's input as chat messages (instructions not included)
    instructions: str | None
    previous_response_id: str | None
    tools: list[dict[str, Any]] | None  # in the chat form the template takes
    options: dict[str, Any]  # template options (add_generation_prompt, reasoning_effort)
    sampling: dict[str, Any]  # SamplingParams fields but max_tokens
    max_output_tokens: int | None
    default_max_tokens: int | None  # the model's max_new_tokens, clamped to the room left
    stream: bool = False
    store: bool = True
    echo: dict[str, Any] = field(default_factory=dict)
    tool_choice: ToolChoice = AUTO

    def prompt_messages(self, earlier: tuple[dict[str, Any], ...] = ()) -> list[dict[str, Any]]:
        """What the template renders: the instructions, the earlier turns, this input."""
        head = [{"role": "system", "content": self.instructions}] if self.instructions is not None else []
        return [*head, *earlier, *self.messages]

    def sampling_params(self, prompt_len: int, context_len: int, context_hint: str = "") -> SamplingParams:
        """Resolve max_output_tokens against the context; 400 when prompt + output do not fit."""
        max_tokens = resolve_max_tokens(self.max_output_tokens, prompt_len, context_len, param="max_output_tokens",
                                        prompt_param="input", context_hint=context_hint,
                                        default=self.default_max_tokens)
        return SamplingParams(max_tokens=max_tokens, **self.sampling)


def parse_responses(body: Any, defaults: GenerationDefaults) -> ResponsesRequest:
    """Validate a /v1/responses body; ``defaults`` are the served model's."""
    if not isinstance(body, dict):
        raise _invalid("request body must be a JSON object", None)
    for name, reason in REFUSED.items():
        if body.get(name) is not None:
            raise _unsupported(f"'{name}' is not supported: {reason}", name)
    _check_fields(body, ACCEPTED)
    _refuse_unless(body, "background", (False,), "background responses are not supported")
    _refuse_unless(body, "truncation", ("disabled",), "only truncation 'disabled' is supported: a conversation "
                   "beyond the context is a 400, never silently shortened")
    _refuse_unless(body, "service_tier", ("auto", "default"), "only service_tier 'auto' and 'default' exist here")
    _refuse_unless(body, "prompt_cache_retention", ("in_memory",),
                   "the prefix cache lives in memory: only prompt_cache_retention 'in_memory' is supported")
    stream = _bool(body, "stream")
    _stream_options(body, stream)
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise _invalid("'instructions' must be a string", "instructions")
    previous = body.get("previous_response_id")
    if previous is not None:
        previous = _name(previous, "previous_response_id")
    raw_input = body.get("input")
    if raw_input is None:
        if previous is None:
            raise _invalid("'input' is required (a string or a list of input items)", "input")
        messages: list[dict[str, Any]] = []
    else:
        messages = input_messages(raw_input)
    if not messages and instructions is None and previous is None:
        raise _invalid("'input' must hold at least one item", "input")
    tools, echo_tools = _tools(body.get("tools"))
    tool_choice = body.get("tool_choice")
    parallel = _bool(body, "parallel_tool_calls", True)
    choice = _tool_choice(tool_choice, parallel)
    logprobs = _include(body.get("include"))
    top_logprobs = _int(body, "top_logprobs", 0, MAX_TOP_LOGPROBS) or 0
    sampling = _sampling({"temperature": body.get("temperature"), "top_p": body.get("top_p")}, defaults)
    grammar, text = _text(body.get("text"))
    sampling.update(logprobs=logprobs or top_logprobs > 0, top_logprobs=top_logprobs, grammar=grammar)
    check_one_constraint(choice, grammar)
    options: dict[str, Any] = {"add_generation_prompt": True}
    reasoning = _reasoning(body.get("reasoning"))
    if reasoning.get("effort") is not None:
        options["reasoning_effort"] = reasoning["effort"]  # the name chat templates read (gpt-oss's)
    echo = {
        "instructions": instructions,
        "tools": echo_tools,
        "tool_choice": tool_choice or "auto",
        "parallel_tool_calls": parallel,
        "max_tool_calls": _int(body, "max_tool_calls", 1),  # bounds built-in tool calls: there are none
        "text": text,
        "reasoning": reasoning,
        "metadata": _metadata(body.get("metadata")),
        "top_logprobs": top_logprobs,
        "temperature": sampling["temperature"],
        "top_p": sampling["top_p"],
        **{key: _optional_name(body, key) for key in ("user", "safety_identifier", "prompt_cache_key")},
    }
    model = body.get("model")
    return ResponsesRequest(model=None if model is None else _name(model, "model"), messages=messages,
                            instructions=instructions, previous_response_id=previous, tools=tools, options=options,
                            sampling=sampling, max_output_tokens=_int(body, "max_output_tokens", 1),
                            default_max_tokens=defaults.max_new_tokens, stream=stream,
                            store=_bool(body, "store", True), echo=echo, tool_choice=choice)


def _tool_choice(choice: Any, parallel: bool) -> ToolChoice:
    """"auto", "none", "required" or {"type": "function", "name": ...} (the Responses form)."""
    if choice is None or choice in ("auto", "none", "required"):
        return ToolChoice(choice or "auto", parallel=parallel)
    if isinstance(choice, dict) and choice.get("type") == "function":
        return ToolChoice("function", _name(choice.get("name"), "tool_choice.name"), parallel)
    raise _invalid("'tool_choice' must be 'auto', 'none', 'required' or {\"type\": \"function\", \"name\": ...}",
                   "tool_choice")


def _refuse_unless(body: Mapping[str, Any], name: str, allowed: tuple[Any, ...], reason: str) -> None:
    value = body.get(name)
    if value is not None and value not in allowed:
        raise _unsupported(f"'{name}' {shorten(value, 64)} is not supported: {reason}", name)


def _stream_options(body: Mapping[str, Any], stream: bool) -> None:
    options = body.get("stream_options")
    if options is None:
        return
    if not isinstance(options, dict):
        raise _invalid("'stream_options' must be an object", "stream_options")
    if not stream:
        raise _invalid("'stream_options' is only allowed with stream = true", "stream_options")
    unknown = sorted(key for key in options if key != "include_obfuscation")
    if unknown:
        raise _unsupported(f"unsupported stream option(s): {', '.join(unknown)}", "stream_options")
    if _bool(options, "include_obfuscation"):
        raise _unsupported("stream obfuscation is not supported: leave 'include_obfuscation' unset or false",
                           "stream_options.include_obfuscation")


def _include(include: Any) -> bool:
    """Whether ``include`` asks for output logprobs, the one inclusion served."""
    if include is None:
        return False
    if not isinstance(include, list) or not all(isinstance(item, str) for item in include):
        raise _invalid("'include' must be a list of strings", "include")
    other = [item for item in include if item != LOGPROBS_INCLUDE]
    if other:
        raise _unsupported(f"'include' {shorten(other[0], 64)} is not supported (only '{LOGPROBS_INCLUDE}')",
                           "include")
    return bool(include)


def _tools(tools: Any) -> tuple[list[dict[str, Any]] | None, list[dict[str, Any]]]:
    """Function tools in the chat form the template takes, and as the response reports them."""
    if tools is None:
        return None, []
    if not isinstance(tools, list):
        raise _invalid("'tools' must be a list", "tools")
    chat = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise _invalid(f"{where} must be an object", where)
        if tool.get("type") != "function":
            raise _unsupported(f"{where}: tool type '{shorten(tool.get('type'), 64)}' is not supported (built-in "
                               f"tools are not served; only function tools)", f"{where}.type")
        name = _name(tool.get("name"), f"{where}.name")
        function: dict[str, Any] = {"name": name}
        for key, kind in (("description", str), ("parameters", dict), ("strict", bool)):
            value = tool.get(key)
            if value is not None and not isinstance(value, kind):
                raise _invalid(f"{where}.{key} must be {'an object' if kind is dict else f'a {kind.__name__}'}",
                               f"{where}.{key}")
            if value is not None:
                function[key] = value
        unknown = sorted(key for key in tool if key not in ("type", "name", "description", "parameters", "strict")
                         and tool[key] is not None)
        if unknown:
            raise _unsupported(f"{where}: unsupported field(s): {', '.join(unknown)}", f"{where}.{unknown[0]}")
        chat.append({"type": "function", "function": function})
    return chat, [dict(tool) for tool in tools]  # [] stays []: templates that test `tools is not none` see it


def _text(text: Any) -> tuple[GrammarRequest | None, dict[str, Any]]:
    """The grammar ``text.format`` asks for, and ``text`` as the response reports it."""
    if text is None:
        return None, {"format": {"type": "text"}}
    if not isinstance(text, dict):
        raise _invalid("'text' must be an object", "text")
    unknown = [shorten(key, 64) for key in sorted(text) if key not in ("format", "verbosity")]
    if unknown:
        raise _unsupported(f"unsupported text option(s): {', '.join(unknown[:8])}", f"text.{unknown[0]}")
    if text.get("verbosity") is not None:
        raise _unsupported("'text.verbosity' is not supported", "text.verbosity")
    fmt = text.get("format")
    grammar = text_format(fmt)
    if fmt is None:
        return None, {"format": {"type": "text"}}
    return grammar, {"format": {key: value for key, value in fmt.items() if value is not None}}


def _reasoning(reasoning: Any) -> dict[str, Any]:
    """``effort`` reaches the template; summaries and the rest cannot be honoured."""
    if reasoning is None:
        return {"effort": None, "summary": None}
    if not isinstance(reasoning, dict):
        raise _invalid("'reasoning' must be an object", "reasoning")
    for key, value in reasoning.items():
        if key != "effort" and value is not None:
            raise _unsupported(f"'reasoning.{shorten(key, 64)}' is not supported (reasoning summaries are not "
                               f"generated)", f"reasoning.{shorten(key, 64)}")
    effort = reasoning.get("effort")
    if effort is not None and effort not in REASONING_EFFORTS:
        raise _invalid(f"'reasoning.effort' must be one of {', '.join(sorted(REASONING_EFFORTS))}",
                       "reasoning.effort")
    return {"effort": effort, "summary": None}


def _metadata(metadata: Any) -> dict[str, str]:
    if metadata is None:
        return {}
    if not isinstance(metadata, dict) or len(metadata) > MAX_METADATA_PAIRS:
        raise _invalid(f"'metadata' must be an object of at most {MAX_METADATA_PAIRS} pairs", "metadata")
    for key, value in metadata.items():
        if len(key) > MAX_METADATA_KEY_CHARS or not isinstance(value, str) or len(value) > MAX_METADATA_VALUE_CHARS:
            raise _invalid(f"'metadata' keys are strings of at most {MAX_METADATA_KEY_CHARS} characters and values "
                           f"strings of at most {MAX_METADATA_VALUE_CHARS}", "metadata")
    return dict(metadata)


def _optional_name(body: Mapping[str, Any], key: str) -> str | None:
    value = body.get(key)
    return None if value is None else _name(value, key)

