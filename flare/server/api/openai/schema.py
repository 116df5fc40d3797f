"""Validation of OpenAI chat and completion request bodies.

Every accepted field is listed here; any other field, or an accepted field at
a value we cannot honour (``n`` > 1, a non-empty ``logit_bias``), is a 400
naming it, never silently ignored. ``response_format`` and vLLM's
``structured_outputs`` become the request's grammar (../structured.py).
``null`` counts as absent, as in the OpenAI API. The result is a :class:`GenerationRequest`
whose sampling settings become :class:`SamplingParams` once the prompt
length is known. What a request leaves out comes from the served model's
:class:`GenerationDefaults`, else OpenAI's defaults (``max_tokens``: the model's
``max_new_tokens`` clamped to the room the prompt leaves, else the rest of the
context; a completion's is at most 16, OpenAI's default there).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from ....request import MAX_TOP_LOGPROBS, GenerationDefaults, SamplingParams
from ...generation import resolve_max_tokens
from ...request_body import decode_json, shorten
from ...tool_calls import AUTO, ToolChoice, check_one_constraint
from ..refusals import invalid as _invalid
from ..refusals import unsupported as _unsupported
from ..structured import openai_grammar

# Fields every generation route accepts, beside its own.
_COMMON = frozenset({
    "model", "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
    "repetition_penalty", "seed", "stop", "stop_token_ids", "max_tokens", "n", "logprobs", "ignore_eos",
    "stream", "stream_options", "user", "logit_bias", "response_format", "structured_outputs",
})
# What a chat prompt is made of (chat completions and /tokenize share them).
CHAT_PROMPT_FIELDS = frozenset({"messages", "tools", "documents", "chat_template", "chat_template_kwargs",
                                "add_generation_prompt", "continue_final_message"})
CHAT_FIELDS = _COMMON | CHAT_PROMPT_FIELDS | {"tool_choice", "parallel_tool_calls", "max_completion_tokens",
                                              "top_logprobs", "store"}
COMPLETION_FIELDS = _COMMON | {"prompt", "echo", "best_of", "suffix"}

ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 1024  # one stop string
MAX_NAME_CHARS = 1024  # model names, message names, tool call IDs and function names
MAX_TOKEN_ID = 2**31 - 1  # token IDs are int32 on the device; the engine checks the vocabulary
# OpenAI caps completions' integer logprobs at 5; we serve up to the runtime's limit.
MAX_COMPLETION_LOGPROBS = MAX_TOP_LOGPROBS
# The legacy completions API's max_tokens when a request leaves it out (OpenAI's documented
# default, and vLLM's CompletionRequest field default); a model's max_new_tokens may lower it.
COMPLETION_MAX_TOKENS = 16


@dataclass(frozen=True)
class GenerationRequest:
    """A validated chat or completion request."""

    is_chat: bool
    model: str | None
    messages: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    chat_options: dict[str, Any] = field(default_factory=dict)
    chat_template: str | None = None  # a request's own template (--trust-request-chat-template)
    prompt: str | list[int] | None = None
    sampling: dict[str, Any] = field(default_factory=dict)  # SamplingParams fields but max_tokens
    max_tokens: int | None = None  # None = default_max_tokens, else the rest of the context
    # the model's max_new_tokens (a completion's: at most 16), clamped to the room left
    default_max_tokens: int | None = None
    stream: bool = False
    include_usage: bool = False
    tool_choice: ToolChoice = AUTO

    def sampling_params(self, prompt_len: int, context_len: int, context_hint: str = "") -> SamplingParams:
        """Resolve max_tokens against the context; 400 when prompt + output do not fit."""
        max_tokens = resolve_max_tokens(self.max_tokens, prompt_len, context_len, param="max_tokens",
                                        prompt_param="messages" if self.is_chat else "prompt",
                                        context_hint=context_hint, default=self.default_max_tokens)
        return SamplingParams(max_tokens=max_tokens, **self.sampling)


def _number(body: Mapping[str, Any], name: str, default: float, lo: float, hi: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _invalid(f"'{name}' must be a number", name)
    if not lo <= value <= hi:
        raise _invalid(f"'{name}' must be between {lo:g} and {hi:g}, got {value}", name)
    return float(value)


def _int(body: Mapping[str, Any], name: str, lo: int, hi: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _invalid(f"'{name}' must be an integer", name)
    if value < lo or (hi is not None and value > hi):
        bound = f"between {lo} and {hi}" if hi is not None else f"at least {lo}"
        raise _invalid(f"'{name}' must be {bound}, got {value}", name)
    return value


def _bool(body: Mapping[str, Any], name: str, default: bool = False) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _invalid(f"'{name}' must be a boolean", name)
    return value


def _check_fields(body: Mapping[str, Any], allowed: frozenset[str]) -> None:
    unknown = sorted(key for key in body if key not in allowed)
    if unknown:
        names = [shorten(key, 64) for key in unknown[:8]]
        more = f" and {len(unknown) - 8} more" if len(unknown) > 8 else ""
        raise _unsupported(f"unsupported field(s): {', '.join(names)}{more}", names[0])
    # ``user`` identifies the end user to the API provider and changes nothing here, but a
    # value of another type is a client's mistake, as on OpenAI's API and vLLM's
    if body.get("user") is not None and not isinstance(body["user"], str):
        raise _invalid("'user' must be a string", "user")


def _sampling(body: Mapping[str, Any], defaults: GenerationDefaults) -> dict[str, Any]:
    """SamplingParams fields but max_tokens and logprobs; ``defaults`` fill in what the body leaves out."""
    top_k = _int(body, "top_k", -1)
    if top_k is None:
        top_k = defaults.top_k
    stop = body.get("stop")
    if stop is None:
        stops: tuple[str, ...] = ()
    elif isinstance(stop, str):
        stops = (stop,) if stop else ()
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stops = tuple(s for s in stop if s)
    else:
        raise _invalid("'stop' must be a string or a list of strings", "stop")
    if len(stops) > MAX_STOP_STRINGS:
        raise _invalid(f"'stop' accepts at most {MAX_STOP_STRINGS} strings", "stop")
    if any(len(s) > MAX_STOP_CHARS for s in stops):
        raise _invalid(f"a stop string may have at most {MAX_STOP_CHARS} characters", "stop")
    stop_ids = body.get("stop_token_ids")
    if stop_ids is None:
        stop_ids = []
    if not isinstance(stop_ids, list) or not all(_is_token_id(t) for t in stop_ids):
        raise _invalid(f"'stop_token_ids' must be a list of token IDs (integers 0..{MAX_TOKEN_ID})",
                       "stop_token_ids")
    if len(stop_ids) > 1024:
        raise _invalid("'stop_token_ids' accepts at most 1024 IDs", "stop_token_ids")
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not -2**63 <= seed < 2**64):
        raise _invalid("'seed' must be a 64-bit integer", "seed")
    if body.get("n") not in (None, 1):
        raise _unsupported("only n = 1 is supported", "n")
    if body.get("logit_bias"):
        raise _unsupported("'logit_bias' is not supported", "logit_bias")
    return {
        "temperature": _number(body, "temperature", defaults.sampling_default("temperature"), 0.0, 2.0),
        "top_p": _top_p(body, defaults.sampling_default("top_p")),
        "top_k": 0 if top_k in (None, -1) else top_k,
        "min_p": _number(body, "min_p", defaults.sampling_default("min_p"), 0.0, 1.0),
        "presence_penalty": _number(body, "presence_penalty", 0.0, -2.0, 2.0),
        "frequency_penalty": _number(body, "frequency_penalty", 0.0, -2.0, 2.0),
        "repetition_penalty": _number(body, "repetition_penalty", defaults.sampling_default("repetition_penalty"),
                                      1e-3, 10.0),
        "seed": seed,
        "stop": stops,
        "stop_token_ids": tuple(stop_ids),
        "ignore_eos": _bool(body, "ignore_eos"),
    }


def _is_token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_TOKEN_ID


def _name(value: Any, param: str) -> str:
    """A short identifier string (model, message name, tool call ID, function name)."""
    if not isinstance(value, str):
        raise _invalid(f"'{param}' must be a string", param)
    if len(value) > MAX_NAME_CHARS:
        raise _invalid(f"'{param}' may have at most {MAX_NAME_CHARS} characters, got {len(value)}", param)
    return value


def _top_p(body: Mapping[str, Any], default: float) -> float:
    top_p = _number(body, "top_p", default, 0.0, 1.0)
    if top_p <= 0.0:
        raise _invalid("'top_p' must be greater than 0", "top_p")
    return top_p


def _stream_options(body: Mapping[str, Any], stream: bool) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    if not isinstance(options, dict):
        raise _invalid("'stream_options' must be an object", "stream_options")
    if not stream:
        raise _invalid("'stream_options' is only allowed with stream = true", "stream_options")
    unknown = sorted(k for k in options if k != "include_usage")
    if unknown:
        raise _unsupported(f"unsupported stream option(s): {', '.join(unknown)}", "stream_options")
    return _bool(options, "include_usage")


def _model(body: Mapping[str, Any]) -> str | None:
    model = body.get("model")
    return None if model is None else _name(model, "model")


@dataclass(frozen=True)
class ChatPrompt:
    """What the template renders: messages, tools and options (chat_template_kwargs included)."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    options: dict[str, Any]
    chat_template: str | None = None


def chat_prompt(body: Mapping[str, Any]) -> ChatPrompt:
    """The chat-prompt fields of a body, as vLLM reads them: chat_template_kwargs override the
    top-level options (add_generation_prompt, continue_final_message, documents)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _invalid("'messages' must be a non-empty list", "messages")
    normalized = [_message(m, i) for i, m in enumerate(messages)]
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise _invalid("'chat_template_kwargs' must be an object", "chat_template_kwargs")
    options: dict[str, Any] = {"add_generation_prompt": _bool(body, "add_generation_prompt", True)}
    if _bool(body, "continue_final_message"):
        options["continue_final_message"] = True
    documents = body.get("documents")
    if documents is not None:
        if not isinstance(documents, list) or not all(isinstance(d, dict) for d in documents):
            raise _invalid("'documents' must be a list of objects", "documents")
        options["documents"] = documents
    options.update(kwargs or {})
    template = body.get("chat_template")
    if template is not None and not isinstance(template, str):
        raise _invalid("'chat_template' must be a string", "chat_template")
    return ChatPrompt(normalized, _tools(body.get("tools")), options, template)


def parse_chat(body: Any, defaults: GenerationDefaults) -> GenerationRequest:
    """Validate a /v1/chat/completions body; ``defaults`` are the served model's."""
    if not isinstance(body, dict):
        raise _invalid("request body must be a JSON object", None)
    _check_fields(body, CHAT_FIELDS)
    prompt = chat_prompt(body)
    normalized, tools, options = prompt.messages, prompt.tools, prompt.options
    parallel = _bool(body, "parallel_tool_calls") if body.get("parallel_tool_calls") is not None else True
    choice = openai_tool_choice(body.get("tool_choice"), parallel)
    if body.get("store"):
        raise _unsupported("'store' is not supported", "store")
    logprobs = _bool(body, "logprobs")
    top_logprobs = _int(body, "top_logprobs", 0, MAX_TOP_LOGPROBS)
    if top_logprobs and not logprobs:
        raise _invalid("'top_logprobs' requires 'logprobs' = true", "top_logprobs")
    max_tokens = _int(body, "max_completion_tokens", 1)
    if max_tokens is None:
        max_tokens = _int(body, "max_tokens", 1)
    stream = _bool(body, "stream")
    sampling = _sampling(body, defaults)
    sampling.update(logprobs=logprobs, top_logprobs=top_logprobs or 0, grammar=openai_grammar(body))
    check_one_constraint(choice, sampling["grammar"])
    return GenerationRequest(is_chat=True, model=_model(body), messages=normalized, tools=tools,
                             chat_options=options, chat_template=prompt.chat_template, sampling=sampling,
                             max_tokens=max_tokens, default_max_tokens=defaults.max_new_tokens, stream=stream,
                             include_usage=_stream_options(body, stream), tool_choice=choice)


def openai_tool_choice(choice: Any, parallel: bool) -> ToolChoice:
    """Chat's ``tool_choice``: "auto", "none", "required" or {"type": "function", "function": {"name"}}."""
    if choice is None or choice in ("auto", "none", "required"):
        return ToolChoice(choice or "auto", parallel=parallel)
    if isinstance(choice, dict) and choice.get("type") == "function":
        function = choice.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if isinstance(name, str) and name:
            return ToolChoice("function", name, parallel)
        raise _invalid("tool_choice.function must name the function", "tool_choice.function")
    raise _invalid("'tool_choice' must be 'auto', 'none', 'required' or {\"type\": \"function\", \"function\": "
                   "{\"name\": ...}}", "tool_choice")


def parse_completion(body: Any, defaults: GenerationDefaults) -> GenerationRequest:
    """Validate a /v1/completions body; ``defaults`` are the served model's."""
    if not isinstance(body, dict):
        raise _invalid("request body must be a JSON object", None)
    _check_fields(body, COMPLETION_FIELDS)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, list):
        if not prompt or not all(_is_token_id(t) for t in prompt):
            raise _unsupported(f"'prompt' must be a string or a list of token IDs (integers 0..{MAX_TOKEN_ID}, "
                               f"one prompt per request)", "prompt")
    elif not isinstance(prompt, str):
        raise _invalid("'prompt' must be a string or a list of token IDs", "prompt")
    if body.get("echo"):
        raise _unsupported("'echo' is not supported", "echo")
    if body.get("best_of") not in (None, 1):
        raise _unsupported("only best_of = 1 is supported", "best_of")
    if body.get("suffix"):
        raise _unsupported("'suffix' is not supported", "suffix")
    logprobs = _int(body, "logprobs", 0, MAX_COMPLETION_LOGPROBS)
    stream = _bool(body, "stream")
    sampling = _sampling(body, defaults)
    sampling.update(logprobs=logprobs is not None, top_logprobs=logprobs or 0, grammar=openai_grammar(body))
    default_max_tokens = min(COMPLETION_MAX_TOKENS, defaults.max_new_tokens or COMPLETION_MAX_TOKENS)
    return GenerationRequest(is_chat=False, model=_model(body), prompt=prompt, sampling=sampling,
                             max_tokens=_int(body, "max_tokens", 1), default_max_tokens=default_max_tokens,
                             stream=stream, include_usage=_stream_options(body, stream))


def _message(message: Any, index: int) -> dict[str, Any]:
    """One chat message, checked for what the API requires and otherwise passed as sent.

    Content and tool-call arguments keep the client's form (the frontend adapts
    them to the template, frontend/forms.py); keys we do not know reach the
    template too, as Transformers passes them.
    """
    param = f"messages[{index}]"
    if not isinstance(message, dict):
        raise _invalid(f"{param} must be an object", param)
    role = message.get("role")
    if not isinstance(role, str) or role not in ROLES:
        raise _invalid(f"{param}.role must be one of {', '.join(sorted(ROLES))}", f"{param}.role")
    out = dict(message)
    content = message.get("content")
    tool_calls = message.get("tool_calls")
    if content is None:
        if role != "assistant" or not (tool_calls or message.get("function_call")):
            raise _invalid(f"{param}.content is required", f"{param}.content")
    else:
        out["content"] = _content(content, f"{param}.content")
    for key in ("name", "tool_call_id", "reasoning_content", "reasoning", "thinking"):
        value = message.get(key)
        if value is not None:
            if not isinstance(value, str):
                raise _invalid(f"{param}.{key} must be a string", f"{param}.{key}")
            if key in ("name", "tool_call_id"):
                _name(value, f"{param}.{key}")
    if tool_calls is not None:
        if role != "assistant" and tool_calls:
            raise _invalid(f"{param}.tool_calls is only allowed on assistant messages", f"{param}.tool_calls")
        out["tool_calls"] = _tool_calls(tool_calls, f"{param}.tool_calls")
    return out


def _content(content: Any, param: str) -> str | list[dict[str, Any]]:
    """Text content: a string, or a list of text parts (kept as parts: frontend/forms.py)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _invalid(f"{param} must be a string or a list of content parts", param)
    parts = []
    for i, part in enumerate(content):
        if not isinstance(part, dict):
            raise _invalid(f"{param}[{i}] must be an object", f"{param}[{i}]")
        kind = part.get("type")
        if kind != "text":
            raise _unsupported(f"{param}[{i}]: content part type '{shorten(kind, 64)}' is not supported",
                               f"{param}[{i}].type")
        if not isinstance(part.get("text"), str):
            raise _invalid(f"{param}[{i}].text must be a string", f"{param}[{i}].text")
        parts.append(dict(part))
    return parts


def _tool_calls(calls: Any, param: str) -> list[dict[str, Any]]:
    """Assistant tool calls; ``arguments`` stay as sent (a JSON string or an object) once checked."""
    if not isinstance(calls, list):
        raise _invalid(f"{param} must be a list", param)
    out = []
    for i, call in enumerate(calls):
        where = f"{param}[{i}]"
        if not isinstance(call, dict) or call.get("type", "function") != "function":
            raise _invalid(f"{where} must be a function tool call", where)
        function = call.get("function")
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise _invalid(f"{where}.function must name the function", f"{where}.function")
        _name(function["name"], f"{where}.function.name")
        arguments = function.get("arguments")
        where_args = f"{where}.function.arguments"
        if isinstance(arguments, str):
            # The OpenAI form: a string holding a JSON object ("" counts as {}).
            parsed = decode_json(arguments.encode("utf-8"), what=where_args, param=where_args) \
                if arguments.strip() else {}
            if not isinstance(parsed, dict):
                raise _invalid(f"{where_args} must hold a JSON object", where_args)
        elif arguments is not None and not isinstance(arguments, dict):
            raise _invalid(f"{where_args} must be a JSON object or a string holding one", where_args)
        call_id = call.get("id")
        entry = dict(call)
        if call_id is not None:
            entry["id"] = _name(str(call_id) if type(call_id) is int else call_id, f"{where}.id")
        out.append(entry)
    return out


def _tools(tools: Any) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise _invalid("'tools' must be a list", "tools")
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise _unsupported(f"tools[{i}]: only function tools are supported", f"tools[{i}]")
        function = tool.get("function")
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise _invalid(f"tools[{i}].function must name the function", f"tools[{i}].function")
        if function.get("parameters") is not None and not isinstance(function["parameters"], dict):
            raise _invalid(f"tools[{i}].function.parameters must be a JSON Schema object",
                           f"tools[{i}].function.parameters")
    return tools  # [] stays []: templates that test `tools is not none` see it, as in Transformers
