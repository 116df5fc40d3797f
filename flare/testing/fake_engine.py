"""A deterministic fake model behind the Engine protocol, for tests and benchmarks.

:class:`FakeEngine` is the real serving runtime with a fake device: a
:class:`~flare.engine.runtime.ModelRuntime` and
:class:`~flare.scheduler.scheduler.RequestScheduler` over a
:class:`~flare.testing.fake_executor.FakeExecutor`, with a real
:class:`~flare.frontend.tokenizer.Tokenizer` built from a byte-level
tokenizer.json made here (token ``b`` is byte ``b``; :data:`EOS_ID` is the one
special token). Admission, scheduling, prefix reuse, detokenization
(IncrementalDecoder), stop strings, stop tokens, max_tokens, ignore_eos,
logprobs, cancellation, capacity and failure are therefore the ones users run;
only the token choice is fake.

Chat messages render in a ChatML-like layout. Chat replies echo the last user
message ("You said: ..."), completions continue with a fixed filler text; then
comes EOS, and after it (ignore_eos) the filler repeats until max_tokens. The
executor's sample hook (:class:`_Replies`) finds where the prompt ended in a
slot's history by the prompts submitted here and returns the reply's next byte.
Each decode step takes ``1 / tokens_per_s`` seconds of simulated device time
(0: steps back to back).

It raises the admission errors of the real runtime (400 context, 503 capacity
beyond ``max_active + max_pending`` requests, 503 when failed or closed) and
reports the runtime's statistics (docs/metrics.md). Two markers inject
failures: ``FLARE_FAKE_CRASH`` in a prompt makes the device fail the step after
that request's second token, so the runtime fails every request and sets
``failure`` (which makes the server exit 1); ``FLARE_FAKE_TEMPLATE_ERROR`` makes
chat preparation raise a FrontendError.

``python -m flare.testing.fake_engine`` serves it through :func:`flare.server.session.serve`
(used by the subprocess lifecycle tests and the benchmark).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from ..config import PAGE_TOKENS, PolicyConfig
from ..contract import GraphKind, GraphSpec, PreparedContract
from ..engine.runtime import ModelRuntime, RuntimeTicket
from ..engine.telemetry import EngineStats
from ..errors import AdmissionError, Error, ExecutionError, FrontendError
from ..frontend.annotations import sha256_hex
from ..frontend.forms import STRING, adapt_content
from ..frontend.frontend import AssetFingerprints, Frontend, RequestTemplates, TokenSettings
from ..frontend.tokenizer import _bytes_to_unicode
from ..request import (
    EventSink,
    GenerationDefaults,
    GrammarRequest,
    ModelCard,
    ModelDetails,
    PreparedPrompt,
    SamplingParams,
)
from ..scheduler.scheduler import RequestScheduler
from .fake_executor import FakeExecutor

EOS_ID = 256
EOS_TOKEN = "<|endoftext|>"
VOCAB_SIZE = 257
CRASH_MARKER = "FLARE_FAKE_CRASH"
TEMPLATE_ERROR_MARKER = "FLARE_FAKE_TEMPLATE_ERROR"
FILLER = ("The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs. "
          "How vexingly quick daft zebras jump! ")
_FILLER_BYTES = FILLER.encode("utf-8")
PREFILL_CHUNK = 512  # tokens per prefill step (the largest prefill graph)
STEP_OVERHEAD_S = 0.0002  # simulated device time of every step that is not a decode
MIN_REMEMBERED_PROMPTS = 1024


def byte_tokenizer_json() -> bytes:
    """tokenizer.json of a byte-level BPE without merges: id b is byte b, EOS_ID is special."""
    alphabet = _bytes_to_unicode()
    level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    config = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": EOS_ID, "content": EOS_TOKEN, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}],
        "normalizer": None, "pre_tokenizer": level, "post_processor": None, "decoder": level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": False, "vocab": {alphabet[b]: b for b in range(256)}, "merges": []},
    }
    return json.dumps(config).encode("utf-8")


@dataclass(frozen=True)
class FakeEngineConfig:
    """Knobs of the fake model."""

    identifier: str = "flare-test/fake-model"
    served_names: tuple[str, ...] = ()
    context_len: int = 4096
    max_active: int = 8  # model slots
    max_pending: int = 64  # admitted requests waiting for a slot; beyond: 503
    tokens_per_s: float = 200.0  # per request (one decode step); 0 = steps back to back
    reply_prefix: str = "You said: "
    capacity_hint: str = ""  # appended to the runtime's capacity errors (ServerConfig.capacity_hint)
    generation: GenerationDefaults = GenerationDefaults()  # the model's request defaults (none by default)


@dataclass(frozen=True)
class _Reply:
    text: bytes  # the reply's bytes, before EOS
    is_crash: bool  # the device fails after two tokens


class _Replies:
    """The reply each submitted prompt expects, found again from a slot's history (thread-safe).

    Keys are (prompt length, digest of its tokens); a history is matched against the
    longest remembered prompt it starts with, so a later turn that extends an earlier
    prompt finds its own reply. The oldest prompts are forgotten beyond ``capacity``
    (at least the runtime's admission capacity, so no admitted request loses its own).
    """

    def __init__(self, capacity: int):
        self._capacity = capacity
        self._lock = threading.Lock()
        self._by_key: OrderedDict[tuple[int, bytes], _Reply] = OrderedDict()
        self._lengths: Counter[int] = Counter()
        self._sorted: list[int] = []  # remembered lengths, longest first

    @staticmethod
    def _digest(tokens: np.ndarray) -> bytes:
        return hashlib.blake2b(np.ascontiguousarray(tokens, dtype=np.int64).tobytes(), digest_size=16).digest()

    def add(self, ids: np.ndarray, reply: _Reply) -> None:
        key = (len(ids), self._digest(ids))
        with self._lock:
            if key in self._by_key:
                self._by_key.move_to_end(key)
            else:
                self._lengths[key[0]] += 1
                if len(self._by_key) >= self._capacity:
                    (length, _), _ = self._by_key.popitem(last=False)
                    self._lengths[length] -= 1
                    if not self._lengths[length]:
                        del self._lengths[length]
                self._sorted = sorted(self._lengths, reverse=True)
            self._by_key[key] = reply

    def find(self, history: np.ndarray) -> tuple[int, _Reply] | None:
        """(prompt length, reply) of the longest remembered prompt that ``history`` starts with."""
        with self._lock:
            lengths = self._sorted
            for length in lengths:
                if length <= len(history):
                    reply = self._by_key.get((length, self._digest(history[:length])))
                    if reply is not None:
                        return length, reply
        return None

    def sample(self, history: np.ndarray) -> int:
        """The FakeExecutor sample hook: reply byte k, then EOS, then the filler."""
        found = self.find(history)
        if found is None:  # a prompt that did not come through FakeEngine.submit
            return _FILLER_BYTES[len(history) % len(_FILLER_BYTES)]
        length, reply = found
        k = len(history) - length  # tokens this request generated so far
        if reply.is_crash and k >= 2:
            raise ExecutionError(f"fake execution failure ({CRASH_MARKER})")
        if k < len(reply.text):
            return reply.text[k]
        if k == len(reply.text):
            return EOS_ID
        return _FILLER_BYTES[(k - len(reply.text) - 1) % len(_FILLER_BYTES)]


def fake_contract(config: FakeEngineConfig) -> PreparedContract:
    """Every slot can hold a full context, and as much again is left for the prefix cache."""
    pages_per_request = -(-config.context_len // PAGE_TOKENS)
    return PreparedContract.build(max_active=config.max_active, context=config.context_len,
                                  prefill_chunk_size=PREFILL_CHUNK,
                                  num_pages=2 * config.max_active * pages_per_request,
                                  num_snapshot_rows=max(16, 4 * config.max_active),
                                  vocab_size=VOCAB_SIZE, hidden_size=8)


class FakeEngine:
    """See the module docstring. Implements flare.engine.base.Engine."""

    def __init__(self, config: FakeEngineConfig = FakeEngineConfig()):
        if config.max_active < 1 or config.context_len < 2:
            raise ExecutionError(f"the fake model needs max_active >= 1 and context_len >= 2, got "
                                 f"{config.max_active} and {config.context_len}")
        self.config = config
        self.context_len = config.context_len
        self.max_active = config.max_active
        self.generation_defaults = config.generation
        self.special_markers: dict[str, int] = {}  # its byte tokenizer has no special markers
        identity = hashlib.sha256(b"flare-fake:" + config.identifier.encode("utf-8")).digest()
        # The byte layout renders tools (byte_chat_prompt); there is no Jinja source and no weights.
        details = ModelDetails(family="fake", architecture="FakeByteModel", dtype="float32", device="cpu",
                               digest=identity.hex(), renders_tools=True,
                               hyperparameters={"vocab_size": VOCAB_SIZE})
        self.card = ModelCard(identifier=config.identifier, served_names=config.served_names,
                              max_model_len=config.context_len, created=int(time.time()), details=details)
        tokenizer_json = byte_tokenizer_json()
        self._frontend = Frontend.load(tokenizer_json, None, AssetFingerprints(sha256_hex(tokenizer_json)),
                                       TokenSettings(eos_token="<|im_end|>"))
        self.tokenizer = self._frontend.tokenizer  # the one byte-level Tokenizer
        self._request_templates = RequestTemplates(self._frontend)
        capacity = config.max_active + config.max_pending
        self._replies = _Replies(max(MIN_REMEMBERED_PROMPTS, 2 * capacity))
        contract = fake_contract(config)
        interval = 1.0 / config.tokens_per_s if config.tokens_per_s > 0 else 0.0

        def device_time(graph: GraphSpec) -> float:
            return interval if graph.kind == GraphKind.DECODE else STEP_OVERHEAD_S

        self.executor = FakeExecutor(contract, sample=self._replies.sample,
                                     device_time=device_time if interval else None)
        scheduler = RequestScheduler(contract, identity, PolicyConfig(), eos_token_ids=(EOS_ID,))
        self.runtime = ModelRuntime(scheduler, self.executor, decoder_factory=self.tokenizer.incremental_decoder,
                                    capacity=capacity, capacity_hint=config.capacity_hint,
                                    name="flare-fake-model")

    @property
    def failure(self) -> ExecutionError | None:
        return self.runtime.failure

    # -- frontend (worker threads) -------------------------------------------

    def prepare_chat(self, messages: Sequence[Mapping[str, Any]], *, tools: Sequence[Mapping[str, Any]] | None,
                     options: Mapping[str, Any], chat_template: str | None = None) -> PreparedPrompt:
        if chat_template is not None:  # a request's own template: the real frontend over the byte tokenizer
            return self._request_templates.get(chat_template).prepare_chat(messages, tools, options)
        return byte_chat_prompt(messages, tools, options)

    def prepare_text(self, prompt: str | Sequence[int]) -> PreparedPrompt:
        return byte_text_prompt(prompt)

    def token_bytes(self, token_id: int) -> bytes:
        return self.tokenizer.token_bytes(token_id)

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        return _byte_ids(text).tolist()  # the byte vocabulary has no special tokens to add

    def decode(self, token_ids: Sequence[int]) -> str:
        return self._frontend.decode(self._frontend.check_token_ids(token_ids), skip_special_tokens=False)

    def token_strings(self, token_ids: Sequence[int]) -> list[str]:
        return self._frontend.token_strings(token_ids)

    # -- admission (event loop) ----------------------------------------------

    def prepare_grammar(self, request: GrammarRequest):
        raise FrontendError("structured output needs a model: the fake engine's executor samples no masks",
                            code="unsupported", param=request.param)

    def submit(self, prompt: PreparedPrompt, params: SamplingParams, sink: EventSink, grammar=None) -> RuntimeTicket:
        if len(prompt) + params.max_tokens > self.context_len:
            raise AdmissionError(f"prompt of {len(prompt)} tokens plus max_tokens of {params.max_tokens} exceeds "
                                 f"the context of {self.context_len} tokens", status=400,
                                 code="context_length_exceeded")
        text = prompt.text if prompt.text is not None else bytes(
            int(t) for t in prompt.token_ids if t < 256).decode("utf-8", "replace")
        self._replies.add(prompt.token_ids, _Reply(self._reply(text), CRASH_MARKER in text))
        return self.runtime.submit(prompt, params, sink, grammar)

    def _reply(self, prompt_text: str) -> bytes:
        if prompt_text.endswith("<|im_start|>assistant\n"):
            start = prompt_text.rfind("<|im_start|>user\n")
            last = prompt_text[start + 17:].split("<|im_end|>", 1)[0] if start >= 0 else ""
            return (self.config.reply_prefix + last).encode("utf-8")
        return _FILLER_BYTES

    def stats(self) -> EngineStats:
        return self.runtime.stats()

    def shed_queued(self, error: Error) -> None:
        """End every request still waiting for a slot with ``error`` (shutdown)."""
        self.runtime.shed_queued(error)

    def close(self, timeout: float | None = None) -> None:
        self.runtime.close(timeout)


def byte_chat_prompt(messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None,
                     options: Mapping[str, Any]) -> PreparedPrompt:
    """The fake chat layout (ChatML-like), one token a byte; message ends are its endpoints."""
    pieces: list[str] = []
    endpoints: list[int] = []
    num_bytes = 0

    def emit(text: str, mark: bool) -> None:
        nonlocal num_bytes
        pieces.append(text)
        num_bytes += len(text.encode("utf-8"))
        if mark:
            endpoints.append(num_bytes)

    if tools:
        emit("<|im_start|>system\nTools: " + json.dumps(list(tools), sort_keys=True) + "<|im_end|>\n", True)
    for message in messages:
        content = adapt_content(message.get("content"), STRING) or ""  # a string-content template
        if TEMPLATE_ERROR_MARKER in content:
            raise FrontendError("template raised an exception: fake template error")
        calls = message.get("tool_calls")
        if calls:
            content += "".join("<tool_call>" + json.dumps(c["function"], sort_keys=True) + "</tool_call>"
                               for c in calls)
        emit(f"<|im_start|>{message['role']}\n{content}<|im_end|>\n", True)
    if options.get("add_generation_prompt", True):
        emit("<|im_start|>assistant\n", False)
    text = "".join(pieces)
    ids = _byte_ids(text)
    inside = tuple(e for e in endpoints if 0 < e < len(ids))
    return PreparedPrompt(token_ids=ids, message_endpoints=inside, text=text)


def byte_text_prompt(prompt: str | Sequence[int]) -> PreparedPrompt:
    """A raw prompt, one token a byte, or token IDs checked against the byte vocabulary."""
    if isinstance(prompt, str):
        return PreparedPrompt(token_ids=_byte_ids(prompt), text=prompt)
    bad = [t for t in prompt if not 0 <= t < VOCAB_SIZE]
    if bad:
        raise FrontendError(f"token ID {bad[0]} is outside the vocabulary of {VOCAB_SIZE}")
    return PreparedPrompt(token_ids=np.asarray(prompt, dtype=np.int32))


def _byte_ids(text: str) -> np.ndarray:
    """The byte tokenizer's encoding without the tokenizers call: token b is byte b."""
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32)


def main(argv: Sequence[str] | None = None) -> int:
    """Serve a FakeEngine with the normal server flags (tests and benchmarks)."""
    import argparse
    import os

    from ..server.options import add_server_arguments, load_server_config
    from ..server.session import serve

    parser = argparse.ArgumentParser(prog="python -m flare.testing.fake_engine", description=main.__doc__)
    add_server_arguments(parser)
    parser.add_argument("--tokens-per-s", type=float, default=FakeEngineConfig.tokens_per_s)
    parser.add_argument("--model-slots", type=int, default=FakeEngineConfig.max_active)
    parser.add_argument("--model-queue", type=int, default=FakeEngineConfig.max_pending)
    parser.add_argument("--context-len", type=int, default=FakeEngineConfig.context_len)
    args = parser.parse_args(argv)
    config = load_server_config(args, os.environ)
    fake = FakeEngineConfig(served_names=config.served_names, context_len=args.context_len,
                            max_active=args.model_slots, max_pending=args.model_queue,
                            tokens_per_s=args.tokens_per_s, capacity_hint=config.capacity_hint)
    return serve(lambda progress: FakeEngine(fake), config)


if __name__ == "__main__":
    raise SystemExit(main())
