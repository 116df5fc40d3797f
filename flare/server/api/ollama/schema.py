"""Validation of Ollama's /api/chat and /api/generate bodies.

Every accepted field and option is listed here; anything else, or a value we
cannot honour (``images``, ``suffix``, ``context``, Mirostat), is a 400 naming
it. ``format`` (``"json"`` or a JSON schema) becomes the request's grammar
(../structured.py). ``null`` counts as absent and ``stream`` defaults to true, as
in Ollama. Chat messages become the OpenAI-style messages the frontend renders
(``thinking`` as ``reasoning_content``, ``tool_name`` as ``name``, tool-call
arguments kept as objects); the sampling options go through the OpenAI
family's validators, so a value means the same on every route, and what a
request leaves out takes the served model's defaults, else OpenAI's (not
Ollama's: temperature 0.8, top_k 40, ...).

Options that place or thread the model (``num_gpu``, ``num_thread``, ...) are
hints a loaded core does not take: checked for type and otherwise without
effect. Options whose "off" value is all we serve (``mirostat`` 0, ``tfs_z``
and ``typical_p`` 1) are accepted at that value only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

from ....errors import AdmissionError
from ....request import MAX_TOP_LOGPROBS, GenerationDefaults, SamplingParams
from ...generation import resolve_max_tokens
from ...tool_calls import AUTO, ToolChoice, check_one_constraint
from ..openai.schema import (
    _bool,
    _check_fields,
    _int,
    _invalid,
    _message,
    _name,
    _number,
    _sampling,
    _tools,
    _unsupported,
    openai_tool_choice,
)
from ..structured import ollama_format

_COMMON = frozenset({"model", "format", "options", "stream", "keep_alive", "think", "logprobs", "top_logprobs"})
CHAT_FIELDS = _COMMON | {"messages", "tools"}
GENERATE_FIELDS = _COMMON | {"prompt", "suffix", "images", "system", "template", "raw", "context"}

# Ollama option -> the SamplingParams field it sets (validated by the OpenAI family's _sampling).
SAMPLING_OPTIONS = {
    "temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
    "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
    "repeat_penalty": "repetition_penalty", "seed": "seed", "stop": "stop",
}
_OPTION_OF = {field_name: option for option, field_name in SAMPLING_OPTIONS.items()}
# Where and how the model runs is the server's (flags, the core), not a request's: checked, no effect.
HARDWARE_HINTS = {"numa": "bool", "low_vram": "bool", "f16_kv": "bool", "use_mmap": "bool", "use_mlock": "bool",
                  "num_batch": "int", "num_gpu": "int", "main_gpu": "int", "num_thread": "int"}
# Served only at the value that turns them off.
OFF_VALUES = {"mirostat": 0, "tfs_z": 1.0, "typical_p": 1.0, "logits_all": False, "vocab_only": False,
              "embedding_only": False}
OTHER_OPTIONS = frozenset({"num_predict", "num_ctx", "num_keep", "repeat_last_n", "penalize_newline",
                           "mirostat_tau", "mirostat_eta"})
KNOWN_OPTIONS = frozenset(SAMPLING_OPTIONS) | frozenset(HARDWARE_HINTS) | frozenset(OFF_VALUES) | OTHER_OPTIONS
THINK_LEVELS = ("low", "medium", "high")
# A Go duration ("5m", "1h30m", "-1s", "0") or a number of seconds as a string.
_DURATION = re.compile(r"-?(\d+(\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)?((\d+(\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h))*")


@dataclass(frozen=True)
class OllamaRequest:
    """A validated /api/chat or /api/generate request."""

    is_chat: bool
    model: str  # as the client named it (responses echo it)
    messages: list[dict[str, Any]] | None = None  # OpenAI-style, for engine.prepare_chat
    tools: list[dict[str, Any]] | None = None
    chat_options: dict[str, Any] = field(default_factory=dict)  # template options (enable_thinking, ...)
    chat_template: str | None = None  # a request's own Jinja template (--trust-request-chat-template)
    prompt: str | None = None  # /api/generate with raw = true: tokenized as it is
    think: bool | str | None = None
    sampling: dict[str, Any] = field(default_factory=dict)  # SamplingParams fields but max_tokens
    max_tokens: int | None = None  # options.num_predict; None = the model's default, else the rest
    default_max_tokens: int | None = None  # the model's max_new_tokens (None after num_predict -1 / -2)
    num_ctx: int | None = None  # options.num_ctx: the context this request may fill
    stream: bool = True
    is_load: bool = False  # nothing to generate (no prompt, no messages): Ollama's "load the model"
    tool_choice: ToolChoice = AUTO  # options.tool_choice, Flare's extension

    @property
    def is_raw(self) -> bool:
        return self.prompt is not None

    def sampling_params(self, prompt_len: int, context_len: int, context_hint: str = "") -> SamplingParams:
        """Resolve num_predict against the context (or num_ctx); 400 when prompt + output do not fit."""
        limit = context_len if self.num_ctx is None else min(self.num_ctx, context_len)
        try:
            max_tokens = resolve_max_tokens(self.max_tokens, prompt_len, limit, param="options.num_predict",
                                            prompt_param="messages" if self.is_chat else "prompt",
                                            context_hint=context_hint, default=self.default_max_tokens)
        except AdmissionError as exc:  # name the option the client sent
            message = exc.message.replace("max_tokens of", "num_predict of")
            if self.num_ctx is not None and self.num_ctx < context_len:
                message = message.replace(f"the context of {limit} tokens", f"options.num_ctx of {limit} tokens")
            raise AdmissionError(message, status=exc.status, code=exc.code, param=exc.param) from None
        return SamplingParams(max_tokens=max_tokens, **self.sampling)


def _renamed(exc: AdmissionError, prefix: str = "options.") -> AdmissionError:
    """An OpenAI validator's error, naming the Ollama option instead."""
    name = exc.param or ""
    option = _OPTION_OF.get(name, name)
    message = exc.message.replace(f"'{name}'", f"'{prefix}{option}'") if name else exc.message
    return AdmissionError(message, status=exc.status, code=exc.code, param=f"{prefix}{option}" if name else None)


def _checked(check: Callable[..., Any], options: Mapping[str, Any], name: str, *args: Any) -> Any:
    """``check(options, name, *args)`` (an OpenAI validator) with its error naming ``options.<name>``."""
    try:
        return check(options, name, *args)
    except AdmissionError as exc:
        raise _renamed(exc) from None


@dataclass(frozen=True)
class _Options:
    sampling: dict[str, Any]
    max_tokens: int | None
    default_max_tokens: int | None
    num_ctx: int | None


def _options(value: Any, defaults: GenerationDefaults, context_len: int) -> _Options:
    """The ``options`` object: sampling settings, num_predict, num_ctx; 400 for what we cannot honour."""
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise _invalid("'options' must be an object", "options")
    unknown = sorted(key for key in value if key not in KNOWN_OPTIONS)
    if unknown:
        raise _unsupported(f"unsupported option(s): {', '.join(unknown[:8])}", f"options.{unknown[0]}")
    options = {key: item for key, item in value.items() if item is not None}
    mapped = {field_name: options.get(option) for option, field_name in SAMPLING_OPTIONS.items()}
    seed = mapped.get("seed")
    if isinstance(seed, int) and not isinstance(seed, bool) and seed < 0:
        mapped["seed"] = None  # Ollama's -1: a random seed
    try:
        sampling = _sampling(mapped, defaults)
    except AdmissionError as exc:
        raise _renamed(exc) from None
    for name, kind in HARDWARE_HINTS.items():
        if kind == "bool":
            _checked(_bool, options, name)
        else:
            _checked(_int, options, name, -1)
    for name, off in OFF_VALUES.items():
        if name in options:
            checked = _checked(_bool, options, name) if isinstance(off, bool) else \
                _checked(_number, options, name, off, -1e9, 1e9)
            if checked != off:
                raise _unsupported(f"'options.{name}' is served only at {str(off).lower()} (off), got "
                                   f"{options[name]!r}", f"options.{name}")
    for name in ("mirostat_tau", "mirostat_eta"):  # read by Mirostat only, which is off
        _checked(_number, options, name, 0.0, 0.0, 1e9)
    _checked(_int, options, "num_keep", -1)  # prompts are never truncated: every token is kept
    _penalty_window(options, sampling, context_len)
    num_predict = _checked(_int, options, "num_predict", -2)
    if num_predict == 0:
        raise _invalid("'options.num_predict' must be -1, -2 or at least 1, got 0", "options.num_predict")
    num_ctx = _checked(_int, options, "num_ctx", 1)
    if num_ctx is not None and num_ctx > context_len:
        raise AdmissionError(f"options.num_ctx of {num_ctx} tokens exceeds the model's context of {context_len} "
                             f"tokens", status=400, code="context_length_exceeded", param="options.num_ctx")
    if num_predict is not None and num_predict < 0:  # -1 (no limit) and -2 (fill the context)
        return _Options(sampling, None, None, num_ctx)
    return _Options(sampling, num_predict, defaults.max_new_tokens, num_ctx)


def _penalty_window(options: Mapping[str, Any], sampling: dict[str, Any], context_len: int) -> None:
    """``repeat_last_n`` and ``penalize_newline``: the penalties here cover the whole request.

    -1 (the whole context) is what we serve and 0 turns the penalties off; any other
    window, or sparing newlines, is a 400 while a penalty is in force and moot otherwise.
    """
    last_n = _checked(_int, options, "repeat_last_n", -1)
    penalize_newline = _checked(_bool, options, "penalize_newline", True)
    if last_n == 0:
        sampling.update(repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0)
        return
    is_penalized = sampling["repetition_penalty"] != 1.0 or sampling["presence_penalty"] != 0.0 \
        or sampling["frequency_penalty"] != 0.0
    if not is_penalized:
        return
    if last_n is not None and last_n != -1 and last_n < context_len:
        raise _unsupported(f"'options.repeat_last_n' of {last_n} is not served: the penalties cover the whole "
                           f"context (-1), or nothing (0)", "options.repeat_last_n")
    if not penalize_newline:
        raise _unsupported("'options.penalize_newline' false is not served: the penalties apply to every token",
                           "options.penalize_newline")


def _common(body: Mapping[str, Any]) -> dict[str, Any]:
    """Fields both routes share but the prompt and the options."""
    model = body.get("model")
    if model is None or model == "":
        raise _invalid("model is required", "model")
    _name(model, "model")
    grammar = ollama_format(body.get("format"))
    keep_alive = body.get("keep_alive")
    if keep_alive is not None:  # accepted: the model stays loaded while the server runs
        if isinstance(keep_alive, str):
            if len(keep_alive) > 64 or not _DURATION.fullmatch(keep_alive.strip()):
                raise _invalid("'keep_alive' must be a duration (\"5m\", \"1h\") or a number of seconds",
                               "keep_alive")
        elif isinstance(keep_alive, bool) or not isinstance(keep_alive, (int, float)):
            raise _invalid("'keep_alive' must be a duration (\"5m\", \"1h\") or a number of seconds", "keep_alive")
    think = body.get("think")
    if think is not None and not isinstance(think, bool) and think not in THINK_LEVELS:
        raise _invalid(f"'think' must be true, false or one of {', '.join(THINK_LEVELS)}", "think")
    logprobs = _bool(body, "logprobs")
    top_logprobs = _int(body, "top_logprobs", 0, MAX_TOP_LOGPROBS)
    if top_logprobs and not logprobs:
        raise _invalid("'top_logprobs' requires 'logprobs' = true", "top_logprobs")
    return {"model": model, "think": think, "stream": _bool(body, "stream", True), "logprobs": logprobs,
            "top_logprobs": top_logprobs or 0, "grammar": grammar}


def _chat_options(think: bool | str | None) -> dict[str, Any]:
    """Template options: ``think`` reaches the template as ``enable_thinking`` (and a level as reasoning_effort)."""
    options: dict[str, Any] = {"add_generation_prompt": True}
    if think is not None:
        options["enable_thinking"] = bool(think)
        if isinstance(think, str):
            options["reasoning_effort"] = think
    return options


def _request(body: Mapping[str, Any], common: dict[str, Any], defaults: GenerationDefaults, context_len: int,
             **fields: Any) -> OllamaRequest:
    options = _options(body.get("options"), defaults, context_len)
    sampling = dict(options.sampling, logprobs=common["logprobs"], top_logprobs=common["top_logprobs"],
                    grammar=common["grammar"])
    return OllamaRequest(model=common["model"], think=common["think"], stream=common["stream"], sampling=sampling,
                         max_tokens=options.max_tokens, default_max_tokens=options.default_max_tokens,
                         num_ctx=options.num_ctx, **fields)


def parse_chat(body: Any, defaults: GenerationDefaults, context_len: int) -> OllamaRequest:
    """Validate an /api/chat body; ``defaults`` are the served model's, ``context_len`` its context."""
    if not isinstance(body, dict):
        raise _invalid("request body must be a JSON object", None)
    _check_fields(body, CHAT_FIELDS)
    common = _common(body)
    messages = body.get("messages")
    if messages is not None and not isinstance(messages, list):
        raise _invalid("'messages' must be a list", "messages")
    converted = [chat_message(message, i) for i, message in enumerate(messages or [])]
    tools = _tools(body.get("tools"))
    body, choice = _tool_choice(body)
    check_one_constraint(choice, common["grammar"])
    return _request(body, common, defaults, context_len, is_chat=True, messages=converted, tool_choice=choice,
                    tools=tools or None,  # Ollama: no tools and [] are the same (the SDK always sends [])
                    chat_options=_chat_options(common["think"]), is_load=not converted)


def _tool_choice(body: dict[str, Any]) -> tuple[dict[str, Any], ToolChoice]:
    """Flare's extension ``options.tool_choice`` (Ollama has none; the SDKs pass options through):
    OpenAI chat's values. Returns the body without it and the choice."""
    options = body.get("options")
    if not isinstance(options, dict) or "tool_choice" not in options:
        return body, AUTO
    try:
        choice = openai_tool_choice(options["tool_choice"], parallel=True)
    except AdmissionError as exc:
        raise _invalid(f"options.tool_choice: {exc.message}", "options.tool_choice") from None
    rest = {key: value for key, value in options.items() if key != "tool_choice"}
    return {**body, "options": rest}, replace(choice, param="options.tool_choice")


def parse_generate(body: Any, defaults: GenerationDefaults, context_len: int) -> OllamaRequest:
    """Validate an /api/generate body: a prompt in the chat template, or as it is with ``raw``."""
    if not isinstance(body, dict):
        raise _invalid("request body must be a JSON object", None)
    _check_fields(body, GENERATE_FIELDS)
    common = _common(body)
    prompt = _text(body, "prompt")
    system = _text(body, "system")
    template = _text(body, "template")
    raw = _bool(body, "raw")
    if _text(body, "suffix"):
        raise _unsupported("'suffix' (fill-in-the-middle) is not served", "suffix")
    if body.get("context"):
        raise _unsupported("'context' is deprecated and not served: send the conversation to /api/chat, whose "
                           "history the prefix cache reuses", "context")
    images = body.get("images")
    if images:
        raise _unsupported("'images' is not served: this model takes text only", "images")
    if raw and (system or template):
        name = "system" if system else "template"
        raise _invalid(f"'{name}' cannot be used with raw = true: the prompt is tokenized as it is", name)
    if raw:
        return _request(body, common, defaults, context_len, is_chat=False, prompt=prompt or "", is_load=not prompt)
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    return _request(body, common, defaults, context_len, is_chat=False, messages=messages,
                    chat_options=_chat_options(common["think"]), chat_template=template or None,
                    is_load=not prompt)


def _text(body: Mapping[str, Any], name: str) -> str:
    value = body.get(name)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise _invalid(f"'{name}' must be a string", name)
    return value


def chat_message(message: Any, index: int) -> dict[str, Any]:
    """One Ollama chat message as the OpenAI-style message the frontend renders.

    ``content`` is a string (absent is ""), ``thinking`` becomes ``reasoning_content``
    (the frontend aliases it under all three names), ``tool_name`` becomes ``name``,
    tool calls keep their object arguments; other keys reach the template as sent.
    """
    param = f"messages[{index}]"
    if not isinstance(message, dict):
        raise _invalid(f"{param} must be an object", param)
    out = {key: value for key, value in message.items() if key not in ("images", "thinking", "tool_name")}
    if message.get("images"):
        raise _unsupported(f"{param}.images is not served: this model takes text only", f"{param}.images")
    content = message.get("content")
    if content is None:
        out["content"] = ""
    elif not isinstance(content, str):
        raise _invalid(f"{param}.content must be a string", f"{param}.content")
    if message.get("thinking") is not None:
        out["reasoning_content"] = message["thinking"]
    if message.get("tool_name") is not None and message.get("name") is None:
        out["name"] = message["tool_name"]
    calls = message.get("tool_calls")
    if calls is not None:
        out["tool_calls"] = _tool_calls(calls, f"{param}.tool_calls")
    return _message(out, index)


def _tool_calls(calls: Any, param: str) -> list[dict[str, Any]]:
    """Ollama's tool calls (``function.arguments`` an object) in the OpenAI form, arguments kept as objects."""
    if not isinstance(calls, list):
        raise _invalid(f"{param} must be a list", param)
    out = []
    for i, call in enumerate(calls):
        where = f"{param}[{i}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            raise _invalid(f"{where}.function must be an object", f"{where}.function")
        arguments = function.get("arguments")
        if arguments is not None and not isinstance(arguments, dict):
            raise _invalid(f"{where}.function.arguments must be an object", f"{where}.function.arguments")
        out.append({"type": "function", **call})
    return out
