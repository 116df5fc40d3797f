"""Request and event types shared by the runtime, the scheduler and the server.

Pure data: no torch, no sockets. The HTTP layer turns request bodies into a
:class:`PreparedPrompt` (on a frontend worker) and :class:`SamplingParams`,
hands them to the runtime, and receives :class:`TokenEvent`,
:class:`FinishEvent` or :class:`ErrorEvent` objects through the sink it gave.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Union

import numpy as np

from .errors import Error

MAX_TOP_LOGPROBS = 20


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

    @property
    def is_greedy(self) -> bool:
        return self.temperature <= 0.0 or self.top_k == 1


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


@dataclass(frozen=True)
class FinishEvent:
    """Terminal success. ``reason`` is "stop" (EOS, stop token or string) or "length"."""

    reason: str
    usage: Usage
    stop: str | int | None = None  # the stop string or token that matched, if any


@dataclass(frozen=True)
class ErrorEvent:
    """Terminal failure; ``error`` carries the status and display message."""

    error: Error


Event = Union[TokenEvent, FinishEvent, ErrorEvent]
EventSink = Callable[[Event], None]


@dataclass(frozen=True)
class ModelCard:
    """What discovery routes report about the served model."""

    identifier: str  # the checkpoint identifier (root)
    served_names: tuple[str, ...] = ()
    max_model_len: int = 0
    capabilities: tuple[str, ...] = ("completion", "chat")
    created: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def id(self) -> str:
        for name in self.served_names:
            if name:
                return name
        return self.identifier

    def matches(self, name: str) -> bool:
        return name == self.identifier or name in self.served_names
