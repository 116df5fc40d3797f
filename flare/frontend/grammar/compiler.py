"""GrammarCompiler: a request's constraint -> a compiled llguidance grammar, cached.

Compilation runs on a frontend worker (llguidance drops the GIL while it builds a
grammar). Compiled grammars are kept in a bounded LRU keyed by the SHA-256 of the
constraint and the tokenizer's fingerprint; a hit hands out a copy of the cached
matcher, which costs under a microsecond. The llguidance tokenizer (its token tries,
a few hundred milliseconds and 45-120 MiB to build, holding the GIL) is made once, on
first use or by :meth:`GrammarCompiler.warm`, which the server calls before it listens.

JSON grammars default to json.dumps spacing (``", "`` and ``": "``, no other
whitespace), so a model cannot wander into unbounded whitespace; a schema's own
``x-guidance`` options override that, as llguidance documents.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ...contract import mask_words
from ...errors import GrammarError
from ...request import GrammarRequest
from .matcher import Matcher

CACHE_CAPACITY = 256  # compiled grammars kept (each a few KiB to a few MiB)
MAX_MESSAGE_CHARS = 600  # of an engine error quoted in a 400

JSON_DEFAULTS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass(frozen=True)
class GrammarStats:
    """Counters since load (read from any thread; exported by /metrics)."""

    compiles: int = 0  # grammars compiled (cache misses that compiled)
    compile_errors: int = 0  # constraints refused with a 400
    cache_hits: int = 0
    compile_seconds: float = 0.0  # summed wall time of compiles, successful or not
    cached: int = 0  # grammars in the cache now


class Grammar:
    """A compiled constraint; :meth:`matcher` starts one request's walk through it."""

    __slots__ = ("_template", "_words")

    def __init__(self, template, words: int):
        self._template = template  # an llguidance LLMatcher at the grammar's start, never advanced
        self._words = words

    def matcher(self) -> Matcher:
        """A fresh matcher at the start, its first mask already computed; GrammarError when
        even that exceeds the engine's limits."""
        matcher = Matcher(self._template.deep_copy(), self._words)
        failure = matcher.failure
        if failure is not None:
            raise failure
        return matcher


class GrammarCompiler:
    """Compiles :class:`GrammarRequest` values for one tokenizer (thread-safe)."""

    def __init__(self, tokenizer_json: Path, tokenizer_sha256: str, eos_token_ids: Sequence[int], vocab_size: int,
                 capacity: int = CACHE_CAPACITY):
        self._tokenizer_json = tokenizer_json  # read once, when the engine's tokenizer is built
        self.fingerprint = tokenizer_sha256
        self.eos_token_ids = tuple(int(i) for i in eos_token_ids)
        self.vocab_size = vocab_size
        self.words = mask_words(vocab_size)
        self.capacity = capacity
        self._tokenizer = None
        self.unavailable: str | None = None  # why the engine cannot use this tokenizer, once known
        self._tokenizer_lock = threading.Lock()
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, Grammar] = OrderedDict()
        self._compiles = self._errors = self._hits = 0
        self._seconds = 0.0

    # -- tokenizer ---------------------------------------------------------------

    def warm(self) -> str | None:
        """Build the llguidance tokenizer now (the server does, before it listens); why
        structured output is unavailable for this tokenizer, or None."""
        try:
            self._llg_tokenizer()
        except GrammarError:
            pass
        return self.unavailable

    def _llg_tokenizer(self):
        with self._tokenizer_lock:
            if self._tokenizer is None and self.unavailable is None:
                import llguidance

                try:
                    self._tokenizer = llguidance.LLTokenizer(self._tokenizer_json.read_text(encoding="utf-8"),
                                                             n_vocab=self.vocab_size,
                                                             eos_token=list(self.eos_token_ids) or None)
                except Exception as exc:  # noqa: BLE001 - a tokenizer the engine cannot read: no structured output
                    self.unavailable = f"{type(exc).__name__}: {exc}"
            if self._tokenizer is None:
                raise GrammarError(f"structured output is not available for this model's tokenizer "
                                   f"({self.unavailable})", code="unsupported")
            return self._tokenizer

    # -- compile -----------------------------------------------------------------

    def key(self, request: GrammarRequest) -> str:
        """SHA-256 over the tokenizer fingerprint and the constraint's canonical JSON."""
        value = list(request.value) if isinstance(request.value, tuple) else request.value
        text = json.dumps([self.fingerprint, request.kind, value], sort_keys=True, ensure_ascii=False,
                          separators=(",", ":"))
        return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()

    def compile(self, request: GrammarRequest) -> Grammar:
        """The compiled grammar for ``request``; GrammarError (400, naming ``request.param``) when
        the constraint is invalid or uses what the engine cannot enforce."""
        key = self.key(request)
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
                self._hits += 1
                return cached
        started = time.perf_counter()
        try:
            grammar = Grammar(self._build(request), self.words)
        except GrammarError:
            with self._lock:
                self._errors += 1
                self._seconds += time.perf_counter() - started
            raise
        with self._lock:
            self._compiles += 1
            self._seconds += time.perf_counter() - started
            self._cache[key] = grammar
            self._cache.move_to_end(key)
            while len(self._cache) > self.capacity:
                self._cache.popitem(last=False)
        return grammar

    def stats(self) -> GrammarStats:
        with self._lock:
            return GrammarStats(self._compiles, self._errors, self._hits, self._seconds, len(self._cache))

    def _build(self, request: GrammarRequest):
        import llguidance

        tokenizer = self._llg_tokenizer()
        text = _engine_grammar(request)
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(text, tokenizer)
        if is_error:
            raise _refusal(request, messages[0] if messages else "the grammar is invalid")
        matcher = llguidance.LLMatcher(tokenizer, text, log_level=0)
        if matcher.is_error():
            raise _refusal(request, matcher.get_error())
        return matcher


def _engine_grammar(request: GrammarRequest) -> str:
    """llguidance's grammar text for a constraint."""
    from llguidance import LLMatcher
    from llguidance.gbnf_to_lark import GbnfToLarkError, gbnf_to_lark

    kind, value = request.kind, request.value
    if kind == "json_object":
        return LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_DEFAULTS)
    if kind == "json_schema":
        try:
            return LLMatcher.grammar_from_json_schema(value, defaults=JSON_DEFAULTS)
        except (ValueError, TypeError) as exc:
            raise _refusal(request, str(exc)) from None
    if kind == "regex":
        return LLMatcher.grammar_from_regex(value)
    if kind == "choice":
        # Lark string literals take JSON's escapes, so each choice is matched exactly.
        return LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c, ensure_ascii=False) for c in value))
    if "::=" in value:  # GBNF (llama.cpp's grammar format)
        try:
            value = gbnf_to_lark(value)
        except GbnfToLarkError as exc:
            raise _refusal(request, f"GBNF: {exc}") from None
    return LLMatcher.grammar_from_lark(value)


def _refusal(request: GrammarRequest, message: str) -> GrammarError:
    message = " ".join(message.split())
    if len(message) > MAX_MESSAGE_CHARS:
        message = message[:MAX_MESSAGE_CHARS] + "..."
    what = {"json_object": "JSON object constraint", "json_schema": "JSON Schema", "regex": "regex",
            "choice": "choice list", "grammar": "grammar"}[request.kind]
    return GrammarError(f"the {what} in '{request.param}' cannot be enforced: {message}", param=request.param)
