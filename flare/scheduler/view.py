"""SchedulerView: the scheduler state that selection reads.

:class:`flare.scheduler.policy.Selection` scores candidates from this view instead
of holding the RequestScheduler itself, so policy.py does not import scheduler.py
and declares, by its types, what it may touch. RequestScheduler satisfies the
protocol structurally (no adapter object: selection runs on every step, and an
extra attribute hop per read would cost host time). Nothing here mutates
request or resource state; the one write selection makes is the fairness debts
in ``table`` after each completion (Selection.update_prices).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Mapping, Protocol, Sequence

if TYPE_CHECKING:
    from ..config import PolicyConfig
    from ..contract import GraphKind, GraphSpec, PreparedContract
    from .live import LiveRequest, SlotTable
    from .timing import TimingEstimates


class SchedulerView(Protocol):
    @property
    def id(self) -> int:
        """The scheduler's identity, carried by every plan it makes."""

    @property
    def contract(self) -> "PreparedContract": ...

    @property
    def policy(self) -> "PolicyConfig": ...

    @property
    def clock(self) -> Callable[[], float]: ...

    @property
    def table(self) -> "SlotTable":
        """Hot per-slot counters (selection writes only the fairness debts)."""

    @property
    def live(self) -> "Mapping[int, LiveRequest]":
        """Admitted requests by request ID."""

    @property
    def timing(self) -> "TimingEstimates": ...

    @property
    def page_tokens(self) -> int: ...

    @property
    def num_free_pages(self) -> int:
        """KV pages that a plan can assign now."""

    @property
    def cohort_prefill_graphs(self) -> "Sequence[GraphSpec]":
        """PREFILL graphs with more than one row, by (batch, tokens)."""

    @property
    def decode_graphs(self) -> "Sequence[GraphSpec]":
        """DECODE graphs, general and greedy, smallest batch first."""

    def graphs_of(self, kind: "GraphKind") -> "Sequence[GraphSpec]":
        """General graphs of one kind by (batch, tokens); PREFILL: the one-row graphs."""

    def graph_for(self, kind: "GraphKind", rows: int, tokens: int = 1) -> "GraphSpec":
        """The smallest general graph of ``kind`` holding ``rows`` rows of ``tokens`` tokens."""

    def new_pages_needed(self, r: "LiveRequest", positions: int) -> int:
        """Pages still to assign so that positions [0, positions) are mapped."""
