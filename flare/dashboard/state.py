"""What the dashboard keeps and derives from telemetry, apart from any terminal.

:class:`DashboardState` takes engine statistics (:class:`~flare.engine.telemetry.EngineStats`),
drained graph completions and request-state samples (flare/engine/trace.py), and answers
what the panes show: :meth:`overview`, :meth:`graph_rows` and :meth:`request_rows`. It
holds at most :data:`MAX_COMPLETIONS` completions and :data:`MAX_REQUEST_ROWS` request rows;
what the first limit pushes out of the history window is marked truncated.

Times are monotonic nanoseconds, given by the caller (``now_ns``), so a recorded sample
renders the same on every run (the snapshot tests).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Iterable, Sequence

from ..engine.telemetry import EngineStats
from ..engine.trace import Completion, RequestSample, RequestState

MAX_COMPLETIONS = 16_384
MAX_REQUEST_ROWS = 128
GRAPH_WINDOW_S = 2.0  # the scheduler pane totals completions over this long
HISTORY_S = 10.0  # a request row's history
BUCKET_NS = 500_000_000  # history is kept in half-second cells; narrow panes merge pairs
HISTORY_BUCKETS = int(HISTORY_S * 1e9) // BUCKET_NS
RATE_WINDOW_S = 2.0  # throughput is averaged over this long

# History marks: the four kinds a cell prefers, then the others (shown only in a cell with none
# of the four). Capital letters for the preferred kinds.
PRIMARY_MARKS = {"prefill": "P", "scored_prefill": "P", "decode": "D", "speculative": "S", "vision": "V"}
OTHER_MARKS = {"mixed": "m", "initialize": "i", "restore": "r", "snapshot": "s", "resume": "u"}


@dataclass(frozen=True)
class Overview:
    prefill_tps: float | None  # None until two statistics samples span some time
    generation_tps: float | None
    speculative: bool  # speculation is configured or has run: show its figures
    drafter_steps: int
    verification_steps: int
    acceptance_length: float
    depth: float
    active: int
    queued: int
    completed: int
    failed: int
    reused_tokens: int
    pages_cached: int
    pages_free: int
    dropped: int  # completions the model thread could not write (ring full or lock held)
    sample_age_s: float | None  # age of the request-state sample; None before the first
    last_graph: str | None  # label of the last submitted graph
    last_estimate_ms: float | None  # its frozen estimate; None: indeterminate (shown as ?)
    truncated: bool  # the completion limit pushed history out of the window


@dataclass(frozen=True)
class GraphRow:
    kind: str
    label: str
    calls: int
    mean_ms: float | None  # over timed calls; None when every call was untimed
    share: float  # of the window's observed (timed) graph time
    max_ms: float | None
    requests_per_call: float
    untimed: int


@dataclass(frozen=True)
class RequestView:
    label: str  # slot.generation
    phase: str
    gap_ms: float | None  # since it last committed prompt or output tokens (or its arrival); None: retired
    prompt: str  # consumed / prompt length ("-" when never sampled)
    output: str
    out_ms: float | None  # since output was last published; None before the first publication
    bursts: str
    cells: str  # oldest first: one mark per cell, "." for none, "~" for truncated history


class _Row:
    """What the dashboard keeps of one request (slot.generation)."""

    __slots__ = ("state", "primary", "other", "last_ns")

    def __init__(self) -> None:
        self.state: RequestState | None = None  # the last sampled state
        self.primary: dict[int, str] = {}  # bucket -> the latest preferred-kind mark in it
        self.other: dict[int, str] = {}  # bucket -> the latest other mark
        self.last_ns = 0  # the latest completion or sample that mentioned it


class DashboardState:
    def __init__(self, graphs: Sequence[tuple[str, str]], *, speculative: bool = False,
                 max_completions: int = MAX_COMPLETIONS, max_rows: int = MAX_REQUEST_ROWS):
        self.graphs = tuple(graphs)  # (kind, label) by graph index
        self.speculative = speculative
        self.max_rows = max_rows
        self.completions: deque[Completion] = deque(maxlen=max_completions)
        self.evicted = 0  # completions pushed out by the retention limit
        self.rows: OrderedDict[tuple[int, int], _Row] = OrderedDict()  # least recently active first
        self.rows_dropped = 0  # request rows pushed out by the row limit
        self.stats: deque[tuple[int, EngineStats]] = deque()
        self.sample: RequestSample | None = None
        self.dropped = 0
        self.last_submitted: tuple[int, int] | None = None

    # -- input ------------------------------------------------------------------

    def add_stats(self, now_ns: int, stats: EngineStats) -> None:
        self.stats.append((now_ns, stats))
        while len(self.stats) > 2 and now_ns - self.stats[1][0] >= RATE_WINDOW_S * 1e9:
            self.stats.popleft()

    def add_completions(self, completions: Iterable[Completion]) -> None:
        graphs = self.graphs
        for c in completions:
            if len(self.completions) == self.completions.maxlen:
                self.evicted += 1
            self.completions.append(c)
            kind = graphs[c.graph_index][0] if 0 <= c.graph_index < len(graphs) else "unknown"
            mark = PRIMARY_MARKS.get(kind)
            bucket = c.at_ns // BUCKET_NS
            for key in zip(c.slots.tolist(), c.generations.tolist()):
                row = self._row(key)
                if mark is not None:
                    row.primary[bucket] = mark
                else:
                    row.other[bucket] = OTHER_MARKS.get(kind, "?")
                row.last_ns = c.at_ns

    def set_sample(self, sample: RequestSample) -> None:
        self.sample = sample
        for state in sample.requests:
            row = self._row((state.slot, state.generation))
            row.state = state
            row.last_ns = max(row.last_ns, sample.at_ns)

    def _row(self, key: tuple[int, int]) -> _Row:
        row = self.rows.get(key)
        if row is None:
            row = self.rows[key] = _Row()
            if len(self.rows) > self.max_rows:
                self._drop_row()
        else:
            self.rows.move_to_end(key)
        return row

    def _drop_row(self) -> None:
        """Over the row limit: drop the least recently active retired row (else the oldest)."""
        live = self._live_keys()
        for key in self.rows:
            if key not in live:
                break
        else:
            key = next(iter(self.rows))
        del self.rows[key]
        self.rows_dropped += 1

    def _live_keys(self) -> set[tuple[int, int]]:
        return set() if self.sample is None else {(s.slot, s.generation) for s in self.sample.requests}

    def prune(self, now_ns: int) -> None:
        """Forget history older than the window (or than the retained completions) and retired
        rows with none left."""
        first = max((now_ns - int(HISTORY_S * 1e9)) // BUCKET_NS, self.truncated_before_ns(now_ns) // BUCKET_NS)
        live = self._live_keys()
        for key in list(self.rows):
            row = self.rows[key]
            for cells in (row.primary, row.other):
                for bucket in [b for b in cells if b < first]:
                    del cells[bucket]
            if key not in live and not row.primary and not row.other:
                del self.rows[key]

    # -- panes ------------------------------------------------------------------

    def truncated_before_ns(self, now_ns: int) -> int:
        """Completions before this time were dropped by the retention limit within the history
        window (0: nothing is missing)."""
        if not self.evicted or not self.completions:
            return 0
        oldest = self.completions[0].at_ns
        return oldest if oldest > now_ns - HISTORY_S * 1e9 else 0

    def overview(self, now_ns: int) -> Overview:
        stats = self.stats[-1][1] if self.stats else EngineStats()
        prefill = generation = None
        if len(self.stats) >= 2:
            (t0, s0), (t1, s1) = self.stats[0], self.stats[-1]
            if t1 > t0:
                dt = (t1 - t0) * 1e-9
                prefill = (s1.prompt_tokens - s0.prompt_tokens) / dt
                generation = (s1.generated_tokens - s0.generated_tokens) / dt
        label = estimate = None
        if self.last_submitted is not None:
            index, estimate_ns = self.last_submitted
            label = self.graphs[index][1] if 0 <= index < len(self.graphs) else f"graph {index}"
            estimate = estimate_ns * 1e-6 if estimate_ns > 0 else None
        return Overview(
            prefill_tps=prefill, generation_tps=generation,
            speculative=self.speculative or stats.speculative_verification_steps > 0,
            drafter_steps=stats.speculative_drafter_steps, verification_steps=stats.speculative_verification_steps,
            acceptance_length=stats.speculative_mean_acceptance_length, depth=stats.speculative_depth,
            active=stats.slots_live, queued=stats.requests_pending, completed=stats.requests_completed,
            failed=stats.requests_failed, reused_tokens=stats.prefix_reused_tokens, pages_cached=stats.pages_cached,
            pages_free=stats.pages_reusable, dropped=self.dropped,
            sample_age_s=None if self.sample is None else (now_ns - self.sample.at_ns) * 1e-9,
            last_graph=label, last_estimate_ms=estimate, truncated=bool(self.truncated_before_ns(now_ns)))

    def graph_rows(self, now_ns: int) -> list[GraphRow]:
        """Each graph completed in the last GRAPH_WINDOW_S, by share of timed graph time."""
        since = now_ns - int(GRAPH_WINDOW_S * 1e9)
        totals: dict[int, list] = {}  # index -> [calls, timed calls, summed ns, max ns, requests, untimed]
        for c in reversed(self.completions):
            if c.at_ns < since:
                break
            if c.at_ns > now_ns:
                continue
            t = totals.setdefault(c.graph_index, [0, 0, 0, 0, 0, 0])
            t[0] += 1
            t[4] += len(c.slots)
            if c.duration_ns > 0:
                t[1] += 1
                t[2] += c.duration_ns
                t[3] = max(t[3], c.duration_ns)
            else:
                t[5] += 1
        observed = sum(t[2] for t in totals.values())
        rows = []
        for index, (calls, timed, total_ns, max_ns, requests, untimed) in totals.items():
            kind, label = self.graphs[index] if 0 <= index < len(self.graphs) else ("unknown", f"graph {index}")
            rows.append(GraphRow(kind, label, calls, total_ns / timed * 1e-6 if timed else None,
                                 total_ns / observed if observed else 0.0, max_ns * 1e-6 if timed else None,
                                 requests / calls, untimed))
        rows.sort(key=lambda r: (-r.share, -r.calls, r.label))
        return rows

    def request_rows(self, now_ns: int, cells: int) -> list[RequestView]:
        """Live requests (slot order), then retired ones with history (most recent first);
        ``cells`` history cells each, covering HISTORY_S (1 or 2 buckets per cell)."""
        self.prune(now_ns)
        live = self._live_keys()
        per_cell = max(1, HISTORY_BUCKETS // max(1, cells))
        last = now_ns // BUCKET_NS
        truncated = self.truncated_before_ns(now_ns) // BUCKET_NS
        views = []
        ordered = sorted((k for k in self.rows if k in live)) + [
            k for k in reversed(self.rows) if k not in live]
        sample_ns = self.sample.at_ns if self.sample is not None else now_ns
        for key in ordered:
            row = self.rows[key]
            marks = []
            for i in range(cells - 1, -1, -1):
                hi = last - i * per_cell
                buckets = range(hi - per_cell + 1, hi + 1)
                mark = next((row.primary[b] for b in reversed(buckets) if b in row.primary), None)
                if mark is None:
                    mark = next((row.other[b] for b in reversed(buckets) if b in row.other), None)
                if mark is None:
                    mark = "~" if truncated and hi < truncated else "."
                marks.append(mark)
            s = row.state
            is_live = key in live
            gap = out = None
            if s is not None and is_live:
                gap = max(0, sample_ns - max(s.last_commit_ns, s.arrival_ns)) * 1e-6
                out = (sample_ns - s.last_output_ns) * 1e-6 if s.last_output_ns else None
            views.append(RequestView(
                f"{key[0]}.{key[1]}", s.phase if is_live and s is not None else "retired", gap,
                f"{s.prompt_consumed}/{s.prompt_tokens}" if s is not None else "-",
                str(s.output_tokens) if s is not None else "-", out,
                str(s.bursts) if s is not None else "-", "".join(marks)))
        return views
