"""Matcher: one constrained request's state in its grammar, and its next-token bitmask.

The model thread owns every Matcher once the request is submitted: after each step it
feeds the sampled tokens (:func:`advance_all`) and refills the masks of the rows that
sample next (:func:`fill_masks`); both run a batch on llguidance's own threads with the
GIL released. The sampling program reads ``mask`` from the slot's
device row: bit ``t % 32`` of word ``t // 32`` set means token ``t`` is allowed.
"""

from __future__ import annotations

import re
import threading
from typing import Sequence

import numpy as np

from ...errors import GrammarError

MAX_ERROR_CHARS = 300  # of the engine's message (its first line; the rest dumps the grammar)
TOO_COMPLEX = frozenset({"LexerTooComplex", "ParserTooComplex"})
NO_EXTENSION = frozenset({"NoExtension", "NoExtensionBias"})  # no token can continue the output

# The engine's worker threads. Two served batch 64 best on the H200 host (tools/bench_gpu.py,
# 2026-12-01: steady constrained decode 1.38x the free step time with 2 threads, 1.48x with 4,
# 1.53x with 8, 1.44x with llguidance's default of 12): more threads only spin beside the
# model thread, and on a small machine they take the event loop's core.
EXECUTOR_THREADS = 2

_executor = None
_executor_lock = threading.Lock()


def _parallel():
    global _executor
    with _executor_lock:
        if _executor is None:
            import llguidance

            _executor = llguidance.LLExecutor(num_threads=EXECUTOR_THREADS)
        return _executor


class Matcher:
    """A request's walk through a compiled grammar (model thread only, once submitted)."""

    __slots__ = ("_matcher", "mask")

    def __init__(self, matcher, words: int):
        self._matcher = matcher  # an llguidance LLMatcher of its own
        self.mask = np.empty(words, dtype=np.int32)  # the next token's bitmask row
        self._fill_one()

    @property
    def is_stopped(self) -> bool:
        """The grammar is complete and admits no further token: the response ends here."""
        return self._matcher.is_stopped()

    def advance(self, token_ids: Sequence[int]) -> GrammarError | None:
        """Consume tokens the model sampled under this grammar's masks (:func:`advance_all`
        for one matcher); the error when the engine refuses one."""
        advance_all([(self, token_ids)])
        return self.failure

    @property
    def failure(self) -> GrammarError | None:
        """Why the matcher stopped working (it stays failed), or None. A grammar that grew
        beyond the engine's limits (its lexer or parser too complex) or that no token can
        continue is the request's doing, a 400; anything else is a fault, a 500."""
        if not self._matcher.is_error():
            return None
        text = self._matcher.get_error().strip()
        first = (text.splitlines() or [""])[0][:MAX_ERROR_CHARS]
        # The reason: the error's own "Stop: <reason>" line, or (at the first mask) its text.
        stated = re.search(r"^Stop: (\w+)", text, re.MULTILINE)
        reason = stated.group(1) if stated else first if first in TOO_COMPLEX | NO_EXTENSION \
            else self._matcher.stop_reason()
        if reason in TOO_COMPLEX:
            return GrammarError(f"the constraint became too complex to enforce: {first}", status=400,
                                code="grammar_too_complex")
        if reason in NO_EXTENSION:
            return GrammarError("the constraint admits no (further) output in this model's vocabulary", status=400,
                                code="grammar_unsatisfiable")
        return GrammarError(f"structured output failed: {first}", status=500, code="grammar_failed")

    def _fill_one(self) -> None:
        # Through the engine's executor, which releases the GIL (the matcher's own method
        # holds it, and a first mask can take half a second to build its lexer).
        _parallel().unsafe_compute_mask_ptr([(self._matcher, 0)], self.mask.ctypes.data, self.mask.nbytes, 1)


def advance_all(steps: Sequence[tuple[Matcher, Sequence[int]]]) -> None:
    """Feed each matcher its tokens (in parallel across matchers); a matcher that refuses
    one reports it through :attr:`Matcher.failure`."""
    # The executor releases the GIL (a token can make the lexer build states for a while);
    # a step of several tokens per request (none today) goes token by token.
    pending = [(m, list(tokens)) for m, tokens in steps]
    while pending:
        _parallel().consume_token_par([(m._matcher, tokens[0]) for m, tokens in pending])
        pending = [(m, tokens[1:]) for m, tokens in pending if len(tokens) > 1 and not m._matcher.is_error()]


def fill_masks(matchers: Sequence[Matcher]) -> None:
    """Recompute each matcher's ``mask`` for its current state (a batch in parallel). A matcher
    that fails here reports it through :attr:`Matcher.failure`."""
    if not matchers:
        return
    if len(matchers) == 1:  # straight into its own row, no copy
        matchers[0]._fill_one()
        return
    words = matchers[0].mask.shape[0]
    rows = np.empty((len(matchers), words), dtype=np.int32)
    _parallel().unsafe_compute_mask_ptr([(m._matcher, i) for i, m in enumerate(matchers)], rows.ctypes.data,
                                        words * 4, len(matchers))
    for i, m in enumerate(matchers):
        m.mask[:] = rows[i]
