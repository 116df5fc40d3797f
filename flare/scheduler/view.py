"""SchedulerView: the scheduler state that selection reads; CommitView: what commit rules change.

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
    from ..cache import PrefixCheckpointCache
    from ..config import PolicyConfig
    from ..contract import GraphKind, GraphSpec, PreparedContract
    from .live import LiveRequest, SlotTable
    from .plan import PageUpload
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
    def mixed_graphs(self) -> "Mapping[int, Sequence[GraphSpec]]":
        """MIXED graphs by decode width (0: packed prefill alone), each by prompt capacity."""

    @property
    def mixed_greedy(self) -> "Mapping[tuple[int, int], GraphSpec]":
        """The greedy variant of each MIXED graph, by (decode width, prompt capacity)."""

    @property
    def mixed_widths(self) -> "Sequence[int]":
        """The MIXED decode widths above 0, ascending."""

    @property
    def decode_graphs(self) -> "Sequence[GraphSpec]":
        """DECODE graphs, general and greedy, smallest batch first."""

    @property
    def decode_graph_for(self) -> "Sequence[tuple[GraphSpec, GraphSpec | None] | None]":
        """By cohort size n (index 0 unused): the general and the greedy DECODE graph for n rows."""

    def graphs_of(self, kind: "GraphKind") -> "Sequence[GraphSpec]":
        """General graphs of one kind by (batch, tokens); PREFILL: the one-row graphs."""

    def graph_for(self, kind: "GraphKind", rows: int, tokens: int = 1) -> "GraphSpec":
        """The smallest general graph of ``kind`` holding ``rows`` rows of ``tokens`` tokens."""

    def new_pages_needed(self, r: "LiveRequest", positions: int) -> int:
        """Pages still to assign so that positions [0, positions) are mapped."""

    @property
    def by_slot(self) -> "Mapping[int, LiveRequest]": ...

    @property
    def unreserved_pages(self) -> int:
        """Free pages no live request's reservation counts on (what growth past one may take)."""


class CommitView(Protocol):
    """What a step kind's commit rule (flare/scheduler/steps/) may use besides the request
    it advances: the resources a committed row claims and the checkpoints it publishes."""

    @property
    def page_tokens(self) -> int: ...

    @property
    def table(self) -> "SlotTable": ...

    @property
    def num_free_pages(self) -> int: ...

    @property
    def by_slot(self) -> "Mapping[int, LiveRequest]": ...

    @property
    def cache(self) -> "PrefixCheckpointCache":
        """The prefix cache: commit marks a cached prefix used at the step's fence."""

    def assign_pages(self, req: "LiveRequest", positions: int) -> "PageUpload":
        """Assign pages from the request's reservation so that [0, positions) is mapped."""

    def publish_snapshot(self, req: "LiveRequest", row: int, fence: int, *, terminal: bool) -> None:
        """Publish the checkpoint the SNAPSHOT step at ``fence`` captures into ``row``."""
