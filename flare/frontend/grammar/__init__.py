"""Structured output over llguidance: compile a request's constraint, then mask each step.

The engine choice (llguidance over xgrammar) and its measurements are in docs/benchmarks.md
("Grammar engines"). Everything the rest of Flare touches is here:

- :class:`GrammarCompiler` (compiler.py) turns a :class:`flare.request.GrammarRequest` into a
  :class:`Grammar` on a frontend worker, behind a bounded LRU keyed by the constraint's hash
  and the tokenizer's fingerprint, with compile and cache-hit counters.
- :class:`Matcher` (matcher.py) is one request's position in its grammar: it consumes the
  tokens the model sampled and fills the next-token bitmask row the sampling step applies;
  :func:`advance_all` and :func:`fill_masks` do that for a batch on the engine's threads
  with the GIL released.

Swapping the engine means reimplementing these two modules; nothing else imports llguidance.
"""

from .compiler import Grammar, GrammarCompiler, GrammarStats
from .matcher import Matcher, advance_all, fill_masks

__all__ = ["Grammar", "GrammarCompiler", "GrammarStats", "Matcher", "advance_all", "fill_masks"]
