"""The interface between the HTTP server and whatever runs the model.

The real implementation is :class:`flare.engine.runtime.ModelRuntime` (one
model thread owning the scheduler and an executor); tests and benchmarks use
fakes that implement the same protocol. The server never imports torch.

Threading contract:

- ``prepare_chat``/``prepare_text`` run on a frontend worker thread (CPU work:
  template rendering, tokenization). They raise :class:`AdmissionError` or
  :class:`FrontendError` for bad input.
- ``submit`` is called from the event loop; it must not block. It raises
  :class:`AdmissionError` (status 400 for a prompt + output beyond the context,
  503 when model admission capacity is exhausted or the worker is gone).
- The sink passed to ``submit`` is called from the model thread, once per event,
  in order; the last event is a FinishEvent or an ErrorEvent. The server
  forwards events to the loop with ``call_soon_threadsafe``.
- ``RequestTicket.cancel`` may be called from any thread, any number of times;
  after it, the sink receives at most one more terminal event.
"""

from __future__ import annotations

from typing import Any, Mapping, Protocol, Sequence

from ..errors import Error
from ..request import EventSink, GenerationDefaults, GrammarRequest, ModelCard, PreparedPrompt, SamplingParams
from .telemetry import EngineStats


class RequestTicket(Protocol):
    def cancel(self) -> None: ...


class Engine(Protocol):
    card: ModelCard
    context_len: int  # prompt + output tokens must fit
    max_active: int  # concurrent model requests (sizes the HTTP queue: 4 x max_active by default)
    failure: Error | None  # set when the runtime failed and cannot go on (the server then exits 1)
    # The model's request defaults (its generation_config.json, recorded in the core); the
    # server applies them unless --generation-config none.
    generation_defaults: GenerationDefaults
    # The served output parsers' markers that are special tokens (text -> id): they stay in the
    # output text, and a forced tool call's grammar writes them as those tokens.
    special_markers: Mapping[str, int]

    def prepare_chat(self, messages: Sequence[Mapping[str, Any]], *, tools: Sequence[Mapping[str, Any]] | None,
                     options: Mapping[str, Any], chat_template: str | None = None) -> PreparedPrompt:
        """Render the chat template and tokenize. ``options`` holds add_generation_prompt,
        documents, enable_thinking and other chat_template_kwargs; ``chat_template`` is a
        request's own template (the server checked it may send one)."""

    def prepare_text(self, prompt: str | Sequence[int]) -> PreparedPrompt:
        """Tokenize a raw completion prompt (a string or token IDs)."""

    def token_bytes(self, token_id: int) -> bytes:
        """The UTF-8 bytes a single token decodes to (for logprobs output)."""

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        """Tokenize text as /tokenize and completions do."""

    def decode(self, token_ids: Sequence[int]) -> str:
        """Detokenize with special tokens kept (/detokenize); FrontendError for IDs outside the vocabulary."""

    def token_strings(self, token_ids: Sequence[int]) -> list[str]:
        """The vocabulary string of each token (/tokenize's token_strs)."""

    def prepare_grammar(self, request: GrammarRequest) -> Any:
        """Compile a structured-output constraint (on a frontend worker) into the matcher that
        :meth:`submit` takes; GrammarError (400) when it cannot be enforced."""

    def submit(self, prompt: PreparedPrompt, params: SamplingParams, sink: EventSink,
               grammar: Any = None) -> RequestTicket:
        """Queue a request; ``grammar`` is :meth:`prepare_grammar`'s result when ``params.grammar`` is set."""

    def stats(self) -> EngineStats:
        """Counters and gauges for /metrics and snapshots (flare/engine/telemetry.py)."""

    def shed_queued(self, error: Error) -> None:
        """End every request still waiting for a model slot with ``error`` (shutdown
        starts: queued requests are answered at once, active ones get the grace period)."""

    def close(self, timeout: float | None = None) -> None:
        """Stop admission, drain execution, release resources."""
