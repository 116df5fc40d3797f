"""Request and event types shared by the runtime, the scheduler and the server.

Pure data: no torch, no sockets. The HTTP layer turns request bodies into a
:class:`PreparedPrompt` (on a frontend worker) and :class:`SamplingParams`,
hands them to the runtime, and receives :class:`TokenEvent`,
:class:`FinishEvent` or :class:`ErrorEvent` objects through the sink it gave.
A model's :class:`GenerationDefaults` (its generation_config.json, recorded in
the core) fill in what a request leaves out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Mapping, NamedTuple, Union

import numpy as np

from .errors import Error, FrontendError

MAX_TOP_LOGPROBS = 20


GRAMMAR_KINDS = ("json_object", "json_schema", "regex", "choice", "grammar")


@dataclass(frozen=True, eq=False)
class GrammarRequest:
    """A request's output constraint, as parsed from its body (compiled later, on a frontend worker).

    ``kind`` is one of GRAMMAR_KINDS; ``value`` is None for json_object, the schema (a dict)
    for json_schema, the pattern for regex, a tuple of strings for choice and the grammar
    text (Lark, or GBNF when it has ``::=`` rules) for grammar. ``param`` names the request
    field that carried it, for the 400 a grammar that does not compile gets.
    """

    kind: str
    value: Any = None
    param: str = "response_format"

    def __post_init__(self):
        if self.kind not in GRAMMAR_KINDS:
            raise ValueError(f"unknown grammar kind {self.kind!r}")


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling and stopping settings (OpenAI semantics)."""

    max_tokens: int = 256
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = disabled
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: bool = False
    top_logprobs: int = 0
    grammar: GrammarRequest | None = None  # structured output (frontend/grammar)

    @property
    def is_greedy(self) -> bool:
        return self.temperature <= 0.0 or self.top_k == 1


class _Range(NamedTuple):
    """A generation default's kind and range: the range a request may set (the OpenAI schema's)."""

    is_integer: bool
    low: float
    high: float | None = None  # None = unbounded
    is_low_open: bool = False  # low itself is excluded


_DEFAULT_RANGES = {
    "temperature": _Range(False, 0.0, 2.0),
    "top_p": _Range(False, 0.0, 1.0, is_low_open=True),
    "top_k": _Range(True, -1),  # -1 and 0 disable it
    "min_p": _Range(False, 0.0, 1.0),
    "repetition_penalty": _Range(False, 1e-3, 10.0),
    "max_new_tokens": _Range(True, 1),  # the default max_tokens
}
GENERATION_KEYS = tuple(_DEFAULT_RANGES)


def generation_problem(key: str, value: Any) -> str | None:
    """What the default ``key`` (one of GENERATION_KEYS) must be, when ``value`` is not that; else None."""
    rule = _DEFAULT_RANGES[key]
    kinds = int if rule.is_integer else (int, float)
    if isinstance(value, kinds) and not isinstance(value, bool) and (isinstance(value, int) or math.isfinite(value)) \
            and (value > rule.low if rule.is_low_open else value >= rule.low) \
            and (rule.high is None or value <= rule.high):
        return None
    kind = "an integer" if rule.is_integer else "a number"
    if rule.high is None:
        return f"must be {kind} of at least {rule.low:g}"
    if rule.is_low_open:
        return f"must be {kind} above {rule.low:g} and at most {rule.high:g}"
    return f"must be {kind} from {rule.low:g} to {rule.high:g}"


@dataclass(frozen=True)
class GenerationDefaults:
    """A model's default sampling settings (vLLM's ``--generation-config auto``).

    They apply to every generation request that leaves the setting out (null
    counts as absent); what a request sets wins. A field left None falls back to
    the built-in OpenAI default (:class:`SamplingParams`' field defaults; for
    ``max_new_tokens``, the rest of the context). ``max_new_tokens`` is the
    default ``max_tokens``, clamped to the room the prompt leaves.
    """

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None  # -1 and 0 disable it
    min_p: float | None = None
    repetition_penalty: float | None = None
    max_new_tokens: int | None = None

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], *, source: str = "generation defaults") -> "GenerationDefaults":
        """Checked defaults from ``{key: value}`` (None values count as absent).

        An unknown key or a value out of range raises FrontendError naming ``source``
        and the key (``param`` is the key).
        """
        checked: dict[str, Any] = {}
        for key, value in values.items():
            if key not in _DEFAULT_RANGES:
                raise FrontendError(f"{source}: {key!r} is not a generation default; known: "
                                    f"{', '.join(GENERATION_KEYS)}", param=key)
            if value is None:
                continue
            problem = generation_problem(key, value)
            if problem is not None:
                raise FrontendError(f"{source}: {key} {problem}, got {value!r}", param=key)
            checked[key] = int(value) if _DEFAULT_RANGES[key].is_integer else float(value)
        return cls(**checked)

    def to_json(self) -> dict[str, int | float]:
        """The defaults that are set, in GENERATION_KEYS order (core.json's ``generation``)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    def sampling_default(self, name: str) -> Any:
        """The default of SamplingParams field ``name``: the model's, else the built-in one."""
        value = getattr(self, name)
        return _BUILTIN[name] if value is None else value

    @property
    def is_empty(self) -> bool:
        """No default set: every request gets the built-in ones."""
        return not self.to_json()


_BUILTIN = {f.name: f.default for f in fields(SamplingParams)}


@dataclass(frozen=True)
class PreparedPrompt:
    """A tokenized prompt ready for admission.

    ``message_endpoints`` are token counts at which a complete message (or the
    preamble) ends: sorted, unique, strictly inside the prompt. The scheduler
    may place prefix checkpoints there.
    """

    token_ids: np.ndarray  # [T] int32
    message_endpoints: tuple[int, ...] = ()
    text: str | None = None  # the rendered prompt, when there is one

    def __post_init__(self):
        if self.token_ids.dtype != np.int32 or self.token_ids.ndim != 1:
            object.__setattr__(self, "token_ids", np.ascontiguousarray(self.token_ids, dtype=np.int32).reshape(-1))

    def __len__(self) -> int:
        return int(self.token_ids.shape[0])


@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # (token_id, logprob), best first


@dataclass(frozen=True)
class TokenEvent:
    """New output: the committed token IDs and the text they completed."""

    token_ids: tuple[int, ...]
    text: str
    logprobs: tuple[TokenLogprob, ...] | None = None


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0  # prompt tokens served from the prefix cache

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class RequestTimes(NamedTuple):
    """When the runtime saw one request's phases (``time.monotonic()`` seconds)."""

    submitted: float  # engine.submit accepted it
    first_token: float | None  # its first output token was published (None: it produced none)
    finished: float  # it finished


@dataclass(frozen=True)
class FinishEvent:
    """Terminal success. ``reason`` is "stop" (EOS, stop token or string) or "length"."""

    reason: str
    usage: Usage
    stop: str | int | None = None  # the stop string or token that matched, if any
    times: RequestTimes | None = None  # None from engines that do not record them


@dataclass(frozen=True)
class ErrorEvent:
    """Terminal failure; ``error`` carries the status and display message."""

    error: Error


Event = Union[TokenEvent, FinishEvent, ErrorEvent]
EventSink = Callable[[Event], None]


@dataclass(frozen=True)
class ModelDetails:
    """What the served model is, beyond its names (Ollama's /api/show, /api/tags and /api/ps)."""

    family: str = ""  # the architecture family ("llama", "qwen2")
    architecture: str = ""  # the checkpoint's architecture name ("LlamaForCausalLM")
    num_params: int = 0  # parameters of the runtime layout (tied embeddings counted once)
    dtype: str = ""  # the weights' dtype ("float32", "bfloat16")
    weights_bytes: int = 0  # the weights' size on disk
    device: str = ""  # where the weights live ("cpu", "cuda:0")
    digest: str = ""  # hex identity of the weights and assets (the prefix cache's model identity)
    chat_template: str | None = None  # the served chat template's Jinja source
    renders_tools: bool = False  # the chat template shows a request's tools to the model
    tool_parser: str | None = None  # the output parser for its tool calls (frontend/parsers), None: none
    reasoning_parser: str | None = None  # the output parser for its reasoning text, None: none
    hyperparameters: Mapping[str, Any] = field(default_factory=dict)  # the recipe: sizes, heads, rope, ...


@dataclass(frozen=True)
class ModelCard:
    """What discovery routes report about the served model."""

    identifier: str  # the checkpoint identifier (root)
    served_names: tuple[str, ...] = ()
    max_model_len: int = 0
    capabilities: tuple[str, ...] = ("completion", "chat")
    created: int = 0
    extra: dict = field(default_factory=dict)
    details: ModelDetails = ModelDetails()

    @property
    def id(self) -> str:
        for name in self.served_names:
            if name:
                return name
        return self.identifier

    def matches(self, name: str) -> bool:
        return name == self.identifier or name in self.served_names
