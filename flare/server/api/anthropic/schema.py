"""Validation of Anthropic Messages bodies: ``POST /v1/messages`` and ``/v1/messages/count_tokens``.

A body becomes the chat request every family renders: the messages as
messages.py converts them, tools as OpenAI function tools (``name``,
``description``, ``input_schema`` -> ``parameters``), and template options: a
conversation that ends with an assistant turn is continued (prefill),
``thinking`` reaches the template as ``enable_thinking`` and
``output_config.effort`` as ``reasoning_effort``; ``output_config.format`` (or
the beta's top-level ``output_format``) becomes the request's grammar
(../structured.py).

Every field the SDK can send is listed here: honoured, or refused with a 400
naming it when set to a value we cannot honour (forced tool use, server tools,
containers, ...). ``null`` counts as absent. What the body leaves out of the
sampling settings takes the served model's generation defaults, else
Anthropic's (which are OpenAI's: temperature 1, top_p 1, top_k off).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ....request import GenerationDefaults, GrammarRequest, SamplingParams
from ...generation import resolve_max_tokens
from ...request_body import shorten
from ...tool_calls import AUTO, ToolChoice, check_one_constraint
from ..openai.schema import (
    MAX_STOP_CHARS,
    MAX_STOP_STRINGS,
    ChatPrompt,
    _bool,
    _check_fields,
    _int,
    _invalid,
    _name,
    _number,
    _top_p,
    _unsupported,
)
from ..structured import anthropic_format
from .messages import check_cache_control, check_keys, conversation, string_field, system_messages

# What shapes the prompt: count_tokens takes exactly these.
PROMPT_FIELDS = frozenset({"model", "messages", "system", "tools", "tool_choice", "thinking", "output_config",
                           "output_format", "cache_control", "speed"})
MESSAGES_FIELDS = PROMPT_FIELDS | {"max_tokens", "stop_sequences", "metadata", "stream", "temperature", "top_p",
                                   "top_k", "service_tier", "container", "diagnostics", "inference_geo"}
# Accepted only as null: what each would ask of a server that has no such thing.
_ABSENT_ONLY = {
    "container": "code-execution containers are not served",
    "diagnostics": "prompt-cache diagnostics are not served",
    "inference_geo": "there is no choice of inference region",
}
EFFORTS = ("low", "medium", "high", "xhigh", "max")
MIN_THINKING_BUDGET = 1024  # Anthropic's minimum budget_tokens

_TOOL_KEYS = frozenset({"type", "name", "description", "input_schema", "cache_control", "strict", "defer_loading",
                        "input_examples", "eager_input_streaming", "allowed_callers"})


@dataclass(frozen=True)
class MessagesRequest:
    """A validated Messages body (count_tokens: no max_tokens, no sampling)."""

    model: str
    prompt: ChatPrompt
    max_tokens: int | None = None
    sampling: dict[str, Any] | None = None  # SamplingParams fields but max_tokens
    stop_sequences: tuple[str, ...] = ()
    stream: bool = False
    is_thinking_shown: bool = True  # thinking.display is not "omitted"
    tool_choice: ToolChoice = AUTO

    def sampling_params(self, prompt_len: int, context_len: int, context_hint: str = "") -> SamplingParams:
        """Resolve max_tokens against the context; 400 when prompt + output do not fit."""
        max_tokens = resolve_max_tokens(self.max_tokens, prompt_len, context_len, param="max_tokens",
                                        prompt_param="messages", context_hint=context_hint)
        return SamplingParams(max_tokens=max_tokens, **(self.sampling or {}))


def parse_messages(body: Any, defaults: GenerationDefaults) -> MessagesRequest:
    """Validate a /v1/messages body; ``defaults`` are the served model's."""
    body = _object(body)
    _check_fields(body, MESSAGES_FIELDS)
    if body.get("max_tokens") is None:
        raise _invalid("'max_tokens' is required", "max_tokens")
    max_tokens = _int(body, "max_tokens", 1)
    for name, why in _ABSENT_ONLY.items():
        if body.get(name) is not None:
            raise _unsupported(f"'{name}' is not supported: {why}", name)
    _choice(body, "service_tier", ("auto", "standard_only"), "one service tier")
    _metadata(body.get("metadata"))
    stops = _stop_sequences(body.get("stop_sequences"))
    model, prompt, is_shown, choice = _prompt(body, max_tokens)
    grammar = _output_format(body)
    check_one_constraint(choice, grammar)
    top_k = _int(body, "top_k", 0)
    if top_k is None:
        top_k = defaults.top_k
    sampling = {
        "temperature": _number(body, "temperature", defaults.sampling_default("temperature"), 0.0, 1.0),
        "top_p": _top_p(body, defaults.sampling_default("top_p")),
        "top_k": 0 if top_k in (None, -1) else top_k,
        "min_p": defaults.sampling_default("min_p"),
        "repetition_penalty": defaults.sampling_default("repetition_penalty"),
        "stop": stops,
        "grammar": grammar,
    }
    return MessagesRequest(model=model, prompt=prompt, max_tokens=max_tokens, sampling=sampling,
                           stop_sequences=stops, stream=_bool(body, "stream"), is_thinking_shown=is_shown,
                           tool_choice=choice)


def parse_count_tokens(body: Any) -> MessagesRequest:
    """Validate a /v1/messages/count_tokens body: the prompt fields of a Messages body."""
    body = _object(body)
    _check_fields(body, PROMPT_FIELDS)
    model, prompt, is_shown, _ = _prompt(body, None)
    _output_format(body)  # checked as on /v1/messages; the prompt does not change
    return MessagesRequest(model=model, prompt=prompt, is_thinking_shown=is_shown)


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise _invalid("request body must be a JSON object", None)
    return body


def _prompt(body: Mapping[str, Any], max_tokens: int | None) -> tuple[str, ChatPrompt, bool, ToolChoice]:
    """(model, the chat prompt, whether thinking is shown, the tool choice)."""
    model = body.get("model")
    if model is None:
        raise _invalid("'model' is required", "model")
    model = _name(model, "model")
    _choice(body, "speed", ("standard",), "one inference speed")
    check_cache_control(body.get("cache_control"), "cache_control")
    messages = system_messages(body.get("system")) + conversation(body.get("messages"))
    options: dict[str, Any] = {"add_generation_prompt": True}
    final = messages[-1]
    if final["role"] == "assistant":  # prefill: the reply continues the final assistant turn
        if final.get("tool_calls"):
            raise _invalid("the final assistant message ends with tool_use: send its tool_result in a user "
                           "message", "messages")
        options = {"add_generation_prompt": False, "continue_final_message": True}
    tools = _tools(body.get("tools"))
    choice = _tool_choice(body.get("tool_choice"))
    is_shown = _thinking(body.get("thinking"), max_tokens, options)
    _output_config(body.get("output_config"), options)
    return model, ChatPrompt(messages, tools, options), is_shown, choice


# -- tools and options -----------------------------------------------------------

def _tools(tools: Any) -> list[dict[str, Any]] | None:
    """Custom tools as OpenAI function tools (name, description, parameters)."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise _invalid("'tools' must be a list", "tools")
    out = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise _invalid(f"{where} must be an object", where)
        kind = tool.get("type")
        if kind not in (None, "custom"):
            raise _unsupported(f"{where}: tool type '{shorten(kind, 64)}' is not supported (server tools are not "
                               f"served; custom tools are: name, description, input_schema)", f"{where}.type")
        check_keys(tool, _TOOL_KEYS, where)
        function: dict[str, Any] = {"name": _name(tool.get("name"), f"{where}.name")}
        if tool.get("description") is not None:
            function["description"] = string_field(tool, "description", where)
        schema = tool.get("input_schema")
        if not isinstance(schema, dict):
            raise _invalid(f"{where}.input_schema must be a JSON schema object", f"{where}.input_schema")
        function["parameters"] = schema
        for key, default, why in (("strict", False, "unforced calls are not schema-constrained (tool_choice any "
                                                        "or tool constrains a call's input to its schema)"),
                                  ("defer_loading", False, "tool search is not served"),
                                  ("input_examples", [], "tool input examples are not rendered"),
                                  ("eager_input_streaming", None, "tool input streams as the model writes it"),
                                  ("allowed_callers", ["direct"], "only direct tool calls are served")):
            if tool.get(key) not in (None, default):
                raise _unsupported(f"{where}.{key} is not supported: {why}", f"{where}.{key}")
        check_cache_control(tool.get("cache_control"), f"{where}.cache_control")
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: Any) -> ToolChoice:
    """auto, any (a call is required), tool (that one) and none (tools are still rendered, as
    the OpenAI routes do); ``disable_parallel_tool_use`` allows one call."""
    if choice is None:
        return AUTO
    if not isinstance(choice, dict) or choice.get("type") not in ("auto", "any", "tool", "none"):
        raise _invalid("'tool_choice' must be an object with type auto, any, tool or none", "tool_choice")
    kind = choice["type"]
    keys = {"auto": {"type", "disable_parallel_tool_use"}, "any": {"type", "disable_parallel_tool_use"},
            "tool": {"type", "name", "disable_parallel_tool_use"}, "none": {"type"}}[kind]
    check_keys(choice, frozenset(keys), "tool_choice")
    parallel = not _bool(choice, "disable_parallel_tool_use")
    if kind == "tool":
        return ToolChoice("function", _name(choice.get("name"), "tool_choice.name"), parallel)
    return ToolChoice({"any": "required"}.get(kind, kind), parallel=parallel)


def _thinking(thinking: Any, max_tokens: int | None, options: dict[str, Any]) -> bool:
    """``enable_thinking`` for the template; whether thinking is shown (display is not "omitted")."""
    if thinking is None:
        return True
    kinds = ("enabled", "adaptive", "disabled", "between_tools")
    if not isinstance(thinking, dict) or thinking.get("type") not in kinds:
        raise _invalid("'thinking' must be an object with type enabled, adaptive or disabled", "thinking")
    kind = thinking["type"]
    if kind == "between_tools":
        raise _unsupported("thinking 'between_tools' is not supported: use enabled, adaptive or disabled",
                           "thinking.type")
    if kind == "disabled":
        check_keys(thinking, frozenset({"type"}), "thinking")
        options["enable_thinking"] = False
        return True
    check_keys(thinking, frozenset({"type", "display", "budget_tokens"} if kind == "enabled" else {"type", "display"}),
          "thinking")
    if kind == "enabled":
        if thinking.get("budget_tokens") is None:
            raise _invalid("thinking.budget_tokens is required with type 'enabled'", "thinking.budget_tokens")
        budget = _int(thinking, "budget_tokens", MIN_THINKING_BUDGET)
        if max_tokens is not None and budget >= max_tokens:
            raise _invalid(f"thinking.budget_tokens ({budget}) must be less than max_tokens ({max_tokens})",
                           "thinking.budget_tokens")
    display = thinking.get("display")
    if display not in (None, "summarized", "omitted"):
        raise _invalid("thinking.display must be 'summarized' or 'omitted'", "thinking.display")
    options["enable_thinking"] = True
    return display != "omitted"


def _output_config(config: Any, options: dict[str, Any]) -> None:
    if config is None:
        return
    if not isinstance(config, dict):
        raise _invalid("'output_config' must be an object", "output_config")
    check_keys(config, frozenset({"effort", "format"}), "output_config")
    effort = config.get("effort")
    if effort is not None:
        if effort not in EFFORTS:
            raise _invalid(f"output_config.effort must be one of {', '.join(EFFORTS)}", "output_config.effort")
        options["reasoning_effort"] = effort


def _output_format(body: Mapping[str, Any]) -> GrammarRequest | None:
    """The grammar of ``output_config.format`` or the beta's ``output_format`` (not both);
    ``output_config`` is already checked to be an object."""
    from_config = anthropic_format((body.get("output_config") or {}).get("format"))
    from_beta = anthropic_format(body.get("output_format"), "output_format")
    if from_config is not None and from_beta is not None:
        raise _invalid("'output_format' and 'output_config.format' cannot both be set: send "
                       "output_config.format", "output_format")
    return from_config or from_beta


def _stop_sequences(stops: Any) -> tuple[str, ...]:
    if stops is None:
        return ()
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise _invalid("'stop_sequences' must be a list of strings", "stop_sequences")
    out = tuple(s for s in stops if s)
    if len(out) > MAX_STOP_STRINGS:
        raise _invalid(f"'stop_sequences' accepts at most {MAX_STOP_STRINGS} strings", "stop_sequences")
    if any(len(s) > MAX_STOP_CHARS for s in out):
        raise _invalid(f"a stop sequence may have at most {MAX_STOP_CHARS} characters", "stop_sequences")
    return out


def _metadata(metadata: Any) -> None:
    if metadata is None:
        return
    if not isinstance(metadata, dict):
        raise _invalid("'metadata' must be an object", "metadata")
    check_keys(metadata, frozenset({"user_id"}), "metadata")
    if metadata.get("user_id") is not None:
        _name(metadata["user_id"], "metadata.user_id")


def _choice(body: Mapping[str, Any], name: str, allowed: tuple[str, ...], why: str) -> None:
    value = body.get(name)
    if value is not None and value not in allowed:
        raise _unsupported(f"'{name}' {shorten(value, 64)!r} is not supported: there is {why} "
                           f"({', '.join(allowed)})", name)
