"""TemplateLimits: the execution budget of a chat template (it comes from a model
repository, so it is hostile input).

Each limit is checked before the work it bounds is done: an int, str or collection
is refused before it is built, and the deadline is checked every few thousand
instructions (with the GIL released for a moment, so a render never holds up the
server's other threads). Exceeding any of them raises ``TemplateLimitError`` (a
``FrontendError``: the request fails with 400); running out of fuel or time raises
its subclass ``TemplateBudgetError``, which also fails a request's extra renders.
"""

from __future__ import annotations

from dataclasses import dataclass

from flare._fast.jinja_vm import (
    DEFAULT_FUEL,
    DEFAULT_MAX_COLLECTION_BYTES,
    DEFAULT_MAX_DEPTH,
    DEFAULT_MAX_INT_BITS,
    DEFAULT_MAX_OUTPUT_BYTES,
    DEFAULT_MAX_STRING_BYTES,
    DEFAULT_TIME_LIMIT_S,
)


@dataclass(frozen=True)
class TemplateLimits:
    """Per-template limits; the defaults leave real chat templates far below them."""

    fuel: int = DEFAULT_FUEL  # instructions per render (big values cost extra fuel)
    max_depth: int = DEFAULT_MAX_DEPTH  # nested macro calls
    max_int_bits: int = DEFAULT_MAX_INT_BITS  # bits of an int `*` or `**` may build
    max_string_bytes: int = DEFAULT_MAX_STRING_BYTES  # one str an operation builds (chars x char width)
    max_collection_bytes: int = DEFAULT_MAX_COLLECTION_BYTES  # one list/tuple/dict, estimated
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES  # text one render emits
    time_limit_s: float = DEFAULT_TIME_LIMIT_S  # wall clock for all renders of one request

    def __post_init__(self):
        for name in ("fuel", "max_depth", "max_int_bits", "max_string_bytes", "max_collection_bytes",
                     "max_output_bytes", "time_limit_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"TemplateLimits.{name} must be positive, got {getattr(self, name)!r}")
