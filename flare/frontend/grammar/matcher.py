"""Matcher: one constrained request's state in its grammar, and its next-token bitmask.

The model thread owns every Matcher once the request is submitted: after each step it
feeds the sampled tokens (:meth:`Matcher.advance`) and refills the masks of the rows that
sample next (:func:`fill_masks`, which computes a batch of rows on llguidance's own
threads with the GIL released). The sampling program reads ``mask`` from the slot's
device row: bit ``t % 32`` of word ``t // 32`` set means token ``t`` is allowed.
"""

from __future__ import annotations

import threading
from typing import Sequence

import numpy as np

from ...errors import GrammarError

_executor = None
_executor_lock = threading.Lock()


def _parallel():
    global _executor
    with _executor_lock:
        if _executor is None:
            import llguidance

            _executor = llguidance.LLExecutor()
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

    @property
    def is_accepting(self) -> bool:
        return self._matcher.is_accepting()

    def advance(self, token_ids: Sequence[int]) -> GrammarError | None:
        """Consume tokens the model sampled under this grammar's masks; the error when the
        engine refuses one (a token the mask did not allow reached it: an execution fault)."""
        self._matcher.consume_tokens(list(token_ids))
        return self.failure

    @property
    def failure(self) -> GrammarError | None:
        """Why the matcher stopped working (it stays failed), or None."""
        if not self._matcher.is_error():
            return None
        return GrammarError(f"structured output failed: {self._matcher.get_error()}", status=500,
                            code="grammar_failed")

    def _fill_one(self) -> None:
        self._matcher.unsafe_compute_mask_ptr(self.mask.ctypes.data, self.mask.nbytes)


def advance_all(steps: Sequence[tuple[Matcher, Sequence[int]]]) -> None:
    """Feed each matcher its tokens (a decode step's single tokens in parallel); a matcher
    that refuses one reports it through :attr:`Matcher.failure`."""
    singles = [(m._matcher, tokens[0]) for m, tokens in steps if len(tokens) == 1]
    if len(singles) > 1:
        _parallel().consume_token_par(singles)
    else:
        singles = ()
    for m, tokens in steps:
        if not singles or len(tokens) != 1:
            m._matcher.consume_tokens(list(tokens))


def fill_masks(matchers: Sequence[Matcher]) -> None:
    """Recompute each matcher's ``mask`` for its current state (a batch in parallel). A matcher
    that fails here reports it through :attr:`Matcher.failure`."""
    if len(matchers) == 1:
        matchers[0]._fill_one()
        return
    if not matchers:
        return
    words = matchers[0].mask.shape[0]
    rows = np.empty((len(matchers), words), dtype=np.int32)
    _parallel().unsafe_compute_mask_ptr([(m._matcher, i) for i, m in enumerate(matchers)], rows.ctypes.data,
                                        words * 4, len(matchers))
    for i, m in enumerate(matchers):
        m.mask[:] = rows[i]
