"""RequestScheduler: admission, planning, commit and completion of live requests.

The scheduler works on logical IDs and completion records only (no torch, no
CUDA). Its cycle, driven by the runtime on the model thread::

    rid = submit(prompt, params, seed)        # queued
    plan = plan()                             # immutable ScheduledPlan or None
    step = commit(plan, executor.next_fence)  # reserve pages, record use
    ... runtime packs step, executor runs it ...
    result = complete(completion)             # validate records, emit tokens

Resources: physical slots 1..S, KV pages and snapshot rows (zero-based logical
IDs within the contract's capacities). Pages are reserved at admission for the
whole prompt + max_tokens (so an admitted request always finishes without
preemption) and assigned to page-table entries as steps need them. Every ID a
request gives back retires behind the fence of its last step; the prefix cache
grants its own IDs back through ``advance_completed(...).reusable``.

Checkpoints: admission looks up the longest ready cached prefix, pins it and
reserves snapshot rows for the selected message boundaries and the prompt end
(and one for a terminal capture). Prefill stops at each selected endpoint; a
SNAPSHOT step copies the live tail page and hidden state into the reserved row
and publishes the checkpoint, transferring the request's complete pages to the
cache (the live page sequence is unchanged). Full prompt hits RESTORE the
snapshot and RESUME sampling without replaying the prompt.

Selection (see docs/scheduler.md): each candidate graph and cohort is scored by
expected useful value per estimated duration, less a waiting cost for
decoding and terminal requests it does not serve; unmeasured graphs are
explored first with an empty queue; stale estimates are refreshed from funded
credit; fairness enters through per-request token and delivery prices.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from typing import Callable, Sequence

import numpy as np

from .._fast import sched as fast
from ..cache import Created, PrefixCheckpointCache, PrefixHistory
from ..config import PolicyConfig
from ..model.contract import (
    REC_CONSUMED, REC_GENERATED, REC_GENERATION, REC_NEW_TOKENS, REC_SLOT, REC_TOKEN0, GraphKind, GraphSpec,
    PreparedContract,
)
from ..request import PreparedPrompt, SamplingParams
from .errors import CapacityError, CompletionError, StalePlanError, UnknownRequestError
from .live import LiveRequest
from .plan import (
    Admission, CommittedRow, CommittedStep, Ended, Handle, Phase, PlanRow, ScheduledPlan, StepResult,
    TokenOutput,
)
from .resources import IdPool
from .timing import TimingEstimates

_scheduler_ids = itertools.count(1)
MAX_GENERATION = (1 << 62)


class RequestScheduler:
    def __init__(self, contract: PreparedContract, identity: bytes, policy: PolicyConfig = PolicyConfig(), *,
                 eos_token_ids: Sequence[int] = (), clock: Callable[[], float] = time.monotonic):
        self.id = next(_scheduler_ids)
        self.contract = contract
        self.policy = policy
        self.clock = clock
        self.eos_token_ids = frozenset(int(t) for t in eos_token_ids)
        self.page_tokens = contract.page_tokens
        self.slots = IdPool("slots", range(1, contract.max_active + 1))
        self.pages = IdPool("pages", range(contract.num_pages))
        self.rows = IdPool("snapshot rows", range(contract.num_snapshot_rows))
        self.cache = PrefixCheckpointCache(identity, contract.num_pages, contract.num_snapshot_rows)
        self.identity = identity
        self.timing = TimingEstimates(len(contract.graphs), window=policy.timing_window,
                                      freshness_s=policy.timing_freshness_s,
                                      credit_fraction=policy.refresh_credit_fraction,
                                      credit_cap_s=policy.refresh_credit_cap_s)
        self.queue: deque[LiveRequest] = deque()
        self.live: dict[int, LiveRequest] = {}  # rid -> admitted request (until retired)
        self.by_slot: dict[int, LiveRequest] = {}
        self.inflight: deque[CommittedStep] = deque()
        self.completed_fence = 0
        self.reserved_pages = 0  # sum of page_budget over live requests
        self._rids = itertools.count(1)
        self._next_generation = 1
        self._admission_blocked = False  # the queue head did not fit; retry after resources change
        self._caps_by_kind: dict[GraphKind, list[GraphSpec]] = {}
        for g in contract.graphs:
            self._caps_by_kind.setdefault(g.kind, []).append(g)
        for graphs in self._caps_by_kind.values():
            graphs.sort(key=lambda g: (g.batch, g.tokens))
        # counters
        self.num_admitted = self.num_completed = self.num_cancelled = 0
        self.launches = {kind: 0 for kind in GraphKind}

    # -- requests -----------------------------------------------------------

    def submit(self, prompt: PreparedPrompt, params: SamplingParams, seed: int) -> int:
        """Queue a request; returns its request ID. Raises CapacityError if it can never fit."""
        length = len(prompt)
        if length == 0:
            raise CapacityError("the prompt is empty")
        if params.max_tokens < 1:
            raise CapacityError("max_tokens must be at least 1")
        if length + params.max_tokens > self.contract.context:
            raise CapacityError(
                f"prompt ({length} tokens) plus max_tokens ({params.max_tokens}) exceeds the context "
                f"of {self.contract.context} tokens")
        if self._pages_for(length + params.max_tokens - 1) > self.contract.num_pages:
            raise CapacityError(f"a {length + params.max_tokens}-token request needs more KV pages "
                                f"than the cache holds ({self.contract.num_pages})")
        stop_ids = set(params.stop_token_ids)
        if not params.ignore_eos:
            stop_ids |= self.eos_token_ids
        now = self.clock()
        endpoints = tuple(e for e in prompt.message_endpoints if 0 < e < length)
        req = LiveRequest(rid=next(self._rids), prompt=prompt.token_ids, endpoints=endpoints,
                          params=params, seed=int(seed) & ((1 << 63) - 1), arrival=now,
                          stop_ids=frozenset(stop_ids), last_progress=now)
        self.queue.append(req)
        self._admission_blocked = False
        return req.rid

    def request(self, rid: int) -> LiveRequest:
        for req in itertools.chain(self.live.values(), self.queue):
            if req.rid == rid:
                return req
        raise UnknownRequestError(f"no live request {rid}")

    def finish(self, rid: int, reason: str = "stop") -> None:
        """End a request (e.g. a stop string matched); its last tokens are not emitted."""
        req = self.live.get(rid)
        if req is None:
            self.cancel(rid)
            return
        if req.ended is None:
            req.ended = Ended(rid, reason, None)
            self._enter_terminal(req)

    def cancel(self, rid: int) -> bool:
        """Stop scheduling now; resources stay owned until the request's last fence completes."""
        for i, req in enumerate(self.queue):
            if req.rid == rid:
                del self.queue[i]
                req.phase = Phase.RETIRED
                self.num_cancelled += 1
                return True
        req = self.live.get(rid)
        if req is None or req.cancelled:
            return False
        req.cancelled = True
        if req.ended is None:
            req.ended = Ended(rid, "cancelled", None)
        self.num_cancelled += 1
        req.terminal_row = self._release_row(req.terminal_row, req)
        req.phase = Phase.RETIRING
        req.bump()
        self._try_retire(req)
        return True

    # -- admission ----------------------------------------------------------

    def _pages_for(self, positions: int) -> int:
        return -(-max(positions, 1) // self.page_tokens)

    def _available_pages(self) -> int:
        counters = self.cache.counters()
        return (self.pages.num_free + self.pages.num_retiring + counters.retiring_pages
                - self.reserved_pages)

    def _admit_queued(self, now: float) -> None:
        while self.queue and self.slots.num_free and not self._admission_blocked:
            req = self.queue[0]
            if not self._admit(req, now):
                self._admission_blocked = True
                return
            self.queue.popleft()

    def _admit(self, req: LiveRequest, now: float) -> bool:
        length = req.prompt_len
        history = PrefixHistory(self.identity, req.prompt)
        hit = self.cache.lookup(history, length)
        reused = hit.endpoint if hit else 0
        if hit:
            self.cache.pin(hit.checkpoint)
        need = self._pages_for(length + req.max_tokens - 1) - reused // self.page_tokens
        deficit = need - self._available_pages()
        if deficit > 0:
            self.cache.evict(page_target=deficit)
            self._collect_cache(self.completed_fence)
        if need > self._available_pages():
            if hit:
                self.cache.unpin(hit.checkpoint)
            return False
        # commit the admission
        slot = self.slots.take_one()
        generation = self._next_generation
        self._next_generation = self._next_generation + 1 if self._next_generation < MAX_GENERATION else 1
        req.handle = Handle(slot, generation)
        req.history = history
        req.reused = reused
        req.consumed = req.planned = 0
        if hit:
            req.tip, req.tip_endpoint = hit.checkpoint, hit.endpoint
            req.pages = list(self.cache.page_table(hit.checkpoint))
            req.private_from = len(req.pages)
        req.page_budget = need
        self.reserved_pages += need
        self._select_targets(req)
        req.phase = Phase.INITIALIZING
        req.last_progress = now
        req.bump()
        self.live[req.rid] = req
        self.by_slot[slot] = req
        self.num_admitted += 1
        return True

    def _take_row(self, *, evict: bool) -> int:
        if not self.rows.num_free and evict:
            self.cache.evict(snapshot_target=1)
            self._collect_cache(self.completed_fence)
        return self.rows.take_one() if self.rows.num_free else -1

    def _select_targets(self, req: LiveRequest) -> None:
        """Reserve snapshot rows for checkpoint endpoints beyond the reused prefix.

        The anchor is the last message boundary past the reuse (or the prompt end when
        there is none). Earlier boundaries and a distinct prompt end are extras: each
        costs a snapshot copy plus whatever prefill its cut adds, and together they
        must fit in checkpoint_extra_work_fraction of the estimated uncached prefill
        work. Unknown costs admit no extras.
        """
        length, reused = req.prompt_len, req.reused
        boundaries = [e for e in req.endpoints if e > reused]
        chosen: list[int] = []
        if reused < length:
            anchor = boundaries[-1] if boundaries else length
            chosen.append(anchor)
            base = self._prefill_cost_ns(reused, length, chosen)
            snapshot = self.timing.estimate_ns(self._caps_by_kind[GraphKind.SNAPSHOT][0].index)
            if base and snapshot:
                budget = self.policy.checkpoint_extra_work_fraction * base
                extras = boundaries[:-1] + ([length] if boundaries else [])
                for endpoint in sorted(extras, reverse=True):  # later boundaries first
                    cost = self._prefill_cost_ns(reused, length, chosen + [endpoint])
                    extra = cost - base + snapshot
                    if extra <= budget:
                        chosen.append(endpoint)
                        budget -= extra
                        base = cost
        rows: list[tuple[int, int]] = []
        for i, endpoint in enumerate(chosen):  # anchor first: it may evict for its row
            row = self._take_row(evict=i == 0)
            if row < 0:
                break
            rows.append((endpoint, row))
        rows.sort()
        req.targets = [e for e, _ in rows]
        req.target_rows = [r for _, r in rows]
        req.terminal_row = self._take_row(evict=False)

    def _prefill_cost_ns(self, start: int, end: int, cuts: list[int]) -> int:
        """Estimated prefill time from start to end with chunks stopping at cuts (0: unknown)."""
        graphs = self._caps_by_kind[GraphKind.PREFILL]
        largest = graphs[-1].tokens
        total, pos = 0, start
        for stop in sorted({c for c in cuts if start < c < end} | {end}):
            while pos < stop:
                k = min(largest, stop - pos)
                est = self.timing.estimate_ns(next(g for g in graphs if g.tokens >= k).index)
                if est == 0:
                    return 0
                total += est
                pos += k
        return total

    # -- planning -----------------------------------------------------------

    def plan(self) -> ScheduledPlan | None:
        """Choose the next graph to submit, or None when nothing may run now."""
        now = self.clock()
        self._admit_queued(now)
        window = self.inflight
        if window:
            if len(window) >= 2 or any(s.plan.kind != GraphKind.DECODE or s.plan.is_refresh
                                       or s.plan.estimate_ns == 0 for s in window):
                return None
            # NOTE: the oldest queued graph running past its expected finish stops queueing.
            if now - self._oldest_submit > 1.5 * window[0].plan.estimate_ns * 1e-9 + 0.002:
                return None
        candidates = self._candidates()
        if not candidates:
            if not window:
                self.timing.idle()
            return None
        plan = self._select(candidates, now)
        if window and (plan.kind != GraphKind.DECODE or plan.is_refresh):
            return None  # the winner needs an empty window: let the queued decode drain
        return plan

    def _graph_for(self, kind: GraphKind, rows: int, tokens: int = 1) -> GraphSpec:
        for g in self._caps_by_kind[kind]:
            if g.batch >= rows and g.tokens >= tokens:
                return g
        raise KeyError(kind)

    def _candidates(self) -> list[tuple[GraphKind, GraphSpec, list[PlanRow], float]]:
        """(kind, graph, rows, value) for every runnable cohort and shape."""
        out: list[tuple[GraphKind, GraphSpec, list[PlanRow], float]] = []
        pol = self.policy
        tau = pol.service_price_adaptation_s
        unit = pol.output_token_value
        free_pages = self.pages.num_free
        decoders = [r for r in self.live.values() if r.is_decodable]
        if decoders:
            decoders = decoders[:self.contract.max_batch]
            need = sum(self._new_pages_needed(r, r.planned + 1) for r in decoders)
            if need <= free_pages:
                rows = [PlanRow(r.rid, r.handle, r.epoch, r.planned, 1, True, -1) for r in decoders]
                value = sum(unit + self._price(r) + unit * pol.delivery_fairness * r.delivery_debt / tau
                            for r in decoders)
                out.append((GraphKind.DECODE, self._graph_for(GraphKind.DECODE, len(rows)), rows, value))
        by_phase: dict[Phase, list[LiveRequest]] = {}
        for r in self.live.values():
            if r.inflight == 0:
                by_phase.setdefault(r.phase, []).append(r)
        for r in by_phase.get(Phase.INITIALIZING, ())[:1]:
            if self._new_pages_needed(r, len(r.pages) * self.page_tokens) <= free_pages:
                rows = [PlanRow(r.rid, r.handle, r.epoch, 0, 0, False, -1)]
                out.append((GraphKind.INITIALIZE, self._graph_for(GraphKind.INITIALIZE, 1), rows,
                            unit + self._price(r)))
        for phase, kind in ((Phase.RESTORING, GraphKind.RESTORE), (Phase.RESUMING, GraphKind.RESUME),
                            (Phase.SNAPSHOTTING, GraphKind.SNAPSHOT)):
            group = by_phase.get(phase, [])[:self.contract.max_batch]
            if phase == Phase.RESTORING:
                group = [r for r in group if self._new_pages_needed(r, r.reused + 1) <= free_pages]
                free_pages -= sum(self._new_pages_needed(r, r.reused + 1) for r in group)
            if not group:
                continue
            rows = []
            for r in group:
                row = self._restore_row(r) if kind == GraphKind.RESTORE else (
                    self._due_row(r) if kind == GraphKind.SNAPSHOT else -1)
                start = r.reused if kind == GraphKind.RESTORE else r.planned
                rows.append(PlanRow(r.rid, r.handle, r.epoch, start, 0, kind == GraphKind.RESUME, row))
            value = sum(unit + self._price(r) for r in group)
            out.append((kind, self._graph_for(kind, len(rows)), rows, value))
        now = self.clock()
        finishing = [r for r in by_phase.get(Phase.FINISHING, ()) if r.terminal_row >= 0]
        if finishing:
            group = finishing[:self.contract.max_batch]
            rows = [PlanRow(r.rid, r.handle, r.epoch, r.planned, 0, False, r.terminal_row) for r in group]
            value = sum(pol.terminal_value + pol.terminal_age_price * (now - r.finished_at) * 1e3 for r in group)
            out.append((GraphKind.SNAPSHOT, self._graph_for(GraphKind.SNAPSHOT, len(rows)), rows, value))
        for r in by_phase.get(Phase.PREFILLING, ()):
            remaining = r.next_stop - r.planned
            last_tokens = -1
            for g in self._caps_by_kind[GraphKind.PREFILL]:
                k = min(g.tokens, remaining)
                if k == last_tokens:
                    break  # larger capacities consume the same tokens: dominated
                last_tokens = k
                if self._new_pages_needed(r, r.planned + k) > free_pages:
                    break
                sample = r.planned + k == r.prompt_len
                value = k + self._price(r) + (unit if sample else 0.0)
                rows = [PlanRow(r.rid, r.handle, r.epoch, r.planned, k, sample, -1)]
                out.append((GraphKind.PREFILL, g, rows, value))
        return out

    def _price(self, r: LiveRequest) -> float:
        """Token-service price: output-token units per adaptation time of unserved execution."""
        pol = self.policy
        return pol.output_token_value * pol.token_fairness * r.token_debt / pol.service_price_adaptation_s

    def _restore_row(self, r: LiveRequest) -> int:
        return self.cache.checkpoint(r.tip).snapshot

    def _due_row(self, r: LiveRequest) -> int:
        return r.target_rows[r.targets.index(r.snapshot_due)]

    def _new_pages_needed(self, r: LiveRequest, positions: int) -> int:
        """Pages still to assign so that positions [0, positions) are mapped."""
        return max(0, self._pages_for(positions) - len(r.pages))

    def _select(self, candidates, now: float) -> ScheduledPlan:
        pol = self.policy
        waiting_decode = [r.rid for r in self.live.values() if r.phase == Phase.DECODING and r.ended is None]
        waiting_terminal = [r.rid for r in self.live.values() if r.phase == Phase.FINISHING]
        n = len(candidates)
        est = np.empty(n, dtype=np.float64)
        value = np.empty(n, dtype=np.float64)
        wait = np.empty(n, dtype=np.float64)
        stale = np.zeros(n, dtype=np.uint8)
        for i, (kind, graph, rows, v) in enumerate(candidates):
            served = {row.rid for row in rows}
            est[i] = self.timing.estimate_ns(graph.index) * 1e-6  # ms
            value[i] = v
            wait[i] = (pol.decode_age_price * sum(1 for rid in waiting_decode if rid not in served)
                       + pol.terminal_age_price * sum(1 for rid in waiting_terminal if rid not in served))
            stale[i] = self.timing.is_stale(graph.index, now)
        best = fast.select_candidate(value, est, wait)
        refresh = False
        if self.timing.has_full_credit and est[best] > 0:
            stale_ids = [i for i in range(n) if stale[i] and i != best]
            if stale_ids:
                best = min(stale_ids, key=lambda i: self.timing.refresh_order(candidates[i][1].index))
                refresh = True
        kind, graph, rows, _ = candidates[best]
        return ScheduledPlan(self.id, kind, graph.index, graph.batch, graph.tokens, tuple(rows),
                             self.timing.estimate_ns(graph.index), refresh or bool(stale[best]), refresh)

    # -- commit -------------------------------------------------------------

    def commit(self, plan: ScheduledPlan, fence: int) -> CommittedStep:
        """Reserve pages and record cache use for ``plan`` submitted at ``fence``."""
        if plan.scheduler_id != self.id:
            raise StalePlanError("the plan belongs to another scheduler")
        if fence <= (self.inflight[-1].fence if self.inflight else self.completed_fence):
            raise StalePlanError(f"fence {fence} does not follow the last submitted fence")
        reqs = []
        for row in plan.rows:
            req = self.live.get(row.rid)
            if req is None or req.handle != row.handle or req.epoch != row.epoch:
                raise StalePlanError(f"request {row.rid} changed since the plan was made")
            reqs.append(req)
        pages_needed = sum(self._new_pages_needed(req, self._mapped_positions(plan.kind, row, req))
                           for row, req in zip(plan.rows, reqs))
        if pages_needed > self.pages.num_free:
            raise StalePlanError("the plan needs more free pages than are available")
        now = self.clock()
        committed = []
        for row, req in zip(plan.rows, reqs):
            committed.append(self._commit_row(plan, row, req, fence, now))
        step = CommittedStep(fence, plan, tuple(committed))
        if not self.inflight:
            self._oldest_submit = now
        self.inflight.append(step)
        self.timing.attempted(plan.graph_index, now)
        if plan.is_funded_refresh:
            self.timing.pay_refresh(plan.graph_index)
        return step

    def _mapped_positions(self, kind: GraphKind, row: PlanRow, req: LiveRequest) -> int:
        if kind == GraphKind.PREFILL:
            return row.start + row.num_tokens
        if kind == GraphKind.DECODE:
            return row.start + 1
        if kind == GraphKind.RESTORE:
            return req.reused + 1
        if kind == GraphKind.INITIALIZE:
            return len(req.pages) * self.page_tokens
        return 0

    def _assign_pages(self, req: LiveRequest, positions: int) -> tuple[int, tuple[int, ...]]:
        need = self._new_pages_needed(req, positions)
        if need:
            if need > req.page_budget:
                raise CapacityError(f"request {req.rid} outgrew its page reservation")
            req.pages.extend(self.pages.take(need))
            req.page_budget -= need
            self.reserved_pages -= need
        first = req.uploaded_pages
        new = tuple(req.pages[first:])
        req.uploaded_pages = len(req.pages)
        return first, new

    def _commit_row(self, plan: ScheduledPlan, row: PlanRow, req: LiveRequest, fence: int,
                    now: float) -> CommittedRow:
        kind = plan.kind
        req.inflight += 1
        req.last_fence = fence
        first, new_pages = self._assign_pages(req, self._mapped_positions(kind, row, req))
        tokens = None
        admission = None
        if req.tip is not None:
            self.cache.mark_used(req.tip, fence)
        if kind == GraphKind.INITIALIZE:
            penalty = req.prompt if req.params.repetition_penalty != 1.0 else None
            admission = Admission(req.reused, req.seed, req.params, penalty)
            req.planned = req.reused
            # A cached tail page (or the hidden state of a full hit) comes from the snapshot row.
            restore = req.reused and (req.reused % self.page_tokens or req.reused == req.prompt_len)
            req.phase = Phase.RESTORING if restore else Phase.PREFILLING
        elif kind == GraphKind.RESTORE:
            req.planned = req.reused
            req.phase = Phase.RESUMING if req.reused == req.prompt_len else Phase.PREFILLING
        elif kind == GraphKind.RESUME:
            req.planned_generated += 1
            req.phase = Phase.DECODING
            req.last_progress = now
        elif kind == GraphKind.PREFILL:
            tokens = req.prompt[row.start:row.start + row.num_tokens]
            req.planned += row.num_tokens
            req.last_progress = now
            if row.sample:
                req.planned_generated += 1
            if req.planned in req.targets:
                req.snapshot_due = req.planned
                req.phase = Phase.SNAPSHOTTING
            elif req.planned == req.prompt_len:
                req.phase = Phase.DECODING
        elif kind == GraphKind.DECODE:
            req.planned += 1
            req.planned_generated += 1
            req.last_progress = now
        elif kind == GraphKind.SNAPSHOT:
            self._publish(req, row.snapshot, fence, terminal=req.phase == Phase.FINISHING)
        req.bump()
        return CommittedRow(req.rid, req.handle, row.start, row.num_tokens, row.sample, row.snapshot,
                            first, new_pages, tokens, admission)

    def _publish(self, req: LiveRequest, row: int, fence: int, *, terminal: bool) -> None:
        """Publish the checkpoint the SNAPSHOT step at ``fence`` captures."""
        if terminal:
            endpoint = req.planned
            consumed_outputs = endpoint - req.prompt_len
            req.history.append(np.asarray(req.sampled[:consumed_outputs], dtype=np.int32))
            req.terminal_row = -1
        else:
            endpoint = req.snapshot_due
            i = req.targets.index(endpoint)
            req.targets.pop(i)
            req.target_rows.pop(i)
            req.snapshot_due = -1
            if req.ended is not None:
                req.phase = Phase.RETIRING  # decided below, once the tip has moved
            elif endpoint == req.prompt_len or req.planned == req.prompt_len:
                req.phase = Phase.DECODING
            else:
                req.phase = Phase.PREFILLING
        start = req.tip_endpoint // self.page_tokens
        end = endpoint // self.page_tokens
        own = req.pages[start:end]
        result = None
        if endpoint > req.tip_endpoint and start >= req.private_from:
            result = self.cache.publish(req.history, endpoint, parent=req.tip, pages=own, snapshot=row,
                                        consumed=endpoint, ready_fence=fence)
        if isinstance(result, Created):
            req.private_from = end
            self._move_tip(req, result.checkpoint, endpoint)
        else:
            if result is not None:  # Existing: keep our pages, chain onto the cached checkpoint
                self._move_tip(req, result.checkpoint, endpoint)
            self.rows.retire([row], fence, self.completed_fence)
        if terminal:
            req.phase = Phase.RETIRING
        elif req.ended is not None:
            self._after_end(req)

    def _move_tip(self, req: LiveRequest, checkpoint: int, endpoint: int) -> None:
        self.cache.pin(checkpoint)
        if req.tip is not None:
            self.cache.unpin(req.tip)
        req.tip, req.tip_endpoint = checkpoint, endpoint

    # -- completion ---------------------------------------------------------

    def complete(self, fence: int, graph_index: int, records: np.ndarray, duration_ns: int) -> StepResult:
        """Apply the completion of the oldest committed step; validates everything first."""
        if not self.inflight:
            raise CompletionError(f"completion for fence {fence} with nothing in flight")
        step = self.inflight[0]
        if step.fence != fence or step.plan.graph_index != graph_index:
            raise CompletionError(f"completion (fence {fence}, graph {graph_index}) does not match the oldest "
                                  f"submission (fence {step.fence}, graph {step.plan.graph_index})")
        kind = step.plan.kind
        expected = self._expected_counts(step)
        n = len(step.rows)
        slots = np.fromiter((r.handle.slot for r in step.rows), dtype=np.int64, count=n)
        gens = np.fromiter((r.handle.generation for r in step.rows), dtype=np.int64, count=n)
        bad = fast.validate_records(records, slots, gens, expected[0], expected[1], 1)
        if bad >= 0:
            row = step.rows[bad]
            rec = records[row.handle.slot]
            raise CompletionError(
                f"{kind.name} completion at fence {fence} for slot {row.handle.slot}: record has slot "
                f"{rec[REC_SLOT]}, generation {rec[REC_GENERATION]}, consumed {rec[REC_CONSUMED]}, generated "
                f"{rec[REC_GENERATED]}, new {rec[REC_NEW_TOKENS]}; expected generation {gens[bad]}, consumed "
                f"{expected[0][bad]}, generated {expected[1][bad]}")
        # -- commit the completion
        self.inflight.popleft()
        self.completed_fence = fence
        now = self.clock()
        self._oldest_submit = now
        self.launches[kind] += 1
        self.timing.observe(graph_index, duration_ns, now)
        outputs: list[TokenOutput] = []
        ended: list[Ended] = []
        for i, row in enumerate(step.rows):
            req = self.live[row.rid]
            req.inflight -= 1
            req.consumed = int(expected[0][i])
            rec = records[row.handle.slot]
            if rec[REC_NEW_TOKENS]:
                req.generated += 1
                token = int(rec[REC_TOKEN0])
                if req.ended is None:
                    req.sampled.append(token)
                    outputs.append(TokenOutput(req.rid, token, row.handle.slot, len(req.sampled) - 1))
                    end = self._stop_condition(req, token)
                    if end is not None:
                        req.ended = end
                        ended.append(end)
                        self._enter_terminal(req)
            req.bump()
        self._update_prices(step, duration_ns * 1e-9, outputs)
        published = self._advance(fence)
        for req in [r for r in self.live.values() if r.phase == Phase.RETIRING]:
            self._try_retire(req)
        return StepResult(fence, tuple(outputs), tuple(ended), published)

    def _expected_counts(self, step: CommittedStep) -> tuple[np.ndarray, np.ndarray]:
        """Consumed and generated totals each row's record must report."""
        n = len(step.rows)
        consumed = np.empty(n, dtype=np.int64)
        generated = np.empty(n, dtype=np.int64)
        kind = step.plan.kind
        for i, row in enumerate(step.rows):
            req = self.live.get(row.rid)
            if req is None:
                raise CompletionError(f"completion names retired request {row.rid}")
            base_gen = req.generated
            if kind in (GraphKind.PREFILL, GraphKind.DECODE):
                consumed[i] = row.start + row.num_tokens
            elif kind == GraphKind.RESTORE:
                consumed[i] = req.reused
            elif kind == GraphKind.INITIALIZE:
                consumed[i] = req.reused
            else:
                consumed[i] = row.start
            generated[i] = base_gen + (1 if row.sample else 0)
        return consumed, generated

    def _stop_condition(self, req: LiveRequest, token: int) -> Ended | None:
        if token in req.stop_ids:
            return Ended(req.rid, "stop", token)
        if len(req.sampled) >= req.max_tokens:
            return Ended(req.rid, "length", None)
        if req.prompt_len + len(req.sampled) >= self.contract.context:
            return Ended(req.rid, "length", None)
        return None

    def _enter_terminal(self, req: LiveRequest) -> None:
        """A request just ended: count it and move it toward retirement."""
        req.finished_at = self.clock()
        self.num_completed += 1
        if req.phase != Phase.SNAPSHOTTING:  # a pending boundary snapshot runs first
            self._after_end(req)

    def _after_end(self, req: LiveRequest) -> None:
        """FINISHING when a terminal capture beyond the last checkpoint is possible, else RETIRING."""
        if req.terminal_row >= 0 and not req.cancelled and req.planned > req.tip_endpoint \
                and req.planned >= req.prompt_len:
            req.phase = Phase.FINISHING
        else:
            req.terminal_row = self._release_row(req.terminal_row, req)
            req.phase = Phase.RETIRING
        req.bump()
        self._try_retire(req)

    def _release_row(self, row: int, req: LiveRequest) -> int:
        if row >= 0:
            self.rows.retire([row], req.last_fence, self.completed_fence)
        return -1

    def _advance(self, fence: int) -> tuple[int, ...]:
        self.slots.advance(fence)
        self.pages.advance(fence)
        self.rows.advance(fence)
        return self._collect_cache(fence)

    def _collect_cache(self, fence: int) -> tuple[int, ...]:
        done = self.cache.advance_completed(fence)
        if done.reusable.pages:
            self.pages.give(done.reusable.pages)
            self._admission_blocked = False
        if done.reusable.snapshots:
            self.rows.give(done.reusable.snapshots)
        return done.ready

    def _try_retire(self, req: LiveRequest) -> None:
        """Release a terminal request's resources once its last step was submitted."""
        if req.phase != Phase.RETIRING or req.inflight:
            return
        fence, done = req.last_fence, self.completed_fence
        if req.tip is not None:
            self.cache.unpin(req.tip)
            req.tip = None
        self.pages.retire(req.pages[req.private_from:], fence, done)
        self.rows.retire(req.target_rows, fence, done)
        req.target_rows, req.targets = [], []
        req.terminal_row = self._release_row(req.terminal_row, req)
        self.reserved_pages -= req.page_budget
        req.page_budget = 0
        self.slots.retire([req.handle.slot], fence, done)
        del self.live[req.rid]
        del self.by_slot[req.handle.slot]
        req.phase = Phase.RETIRED
        req.bump()
        self._admission_blocked = False

    # -- fairness -------------------------------------------------------------

    def _update_prices(self, step: CommittedStep, elapsed: float, outputs: list[TokenOutput]) -> None:
        """Grow unserved requests' prices by the frame's duration; served ones pay it down."""
        served = {row.rid: row.num_tokens + row.sample for row in step.rows}
        delivered = {o.rid for o in outputs}
        solo_decode = self.timing.estimate_ns(self._caps_by_kind[GraphKind.DECODE][0].index) * 1e-9
        chunk = self._caps_by_kind[GraphKind.PREFILL][-1]
        per_prompt_token = self.timing.estimate_ns(chunk.index) * 1e-9 / chunk.tokens
        runnable = [r for r in self.live.values() if r.ended is None and r.phase != Phase.QUEUED]
        if not runnable:
            return
        for r in runnable:
            tokens = served.get(r.rid, 0)
            rate_cost = solo_decode if r.phase == Phase.DECODING else per_prompt_token
            r.token_debt += elapsed - (tokens * rate_cost if rate_cost > 0 else (elapsed if tokens else 0.0))
            if r.phase == Phase.DECODING:
                r.delivery_debt += elapsed - (solo_decode if r.rid in delivered and solo_decode > 0
                                              else (elapsed if r.rid in delivered else 0.0))
        floor_tok = min(r.token_debt for r in runnable)
        floor_del = min(r.delivery_debt for r in runnable)
        for r in runnable:  # only relative debt matters; keep values bounded
            r.token_debt = max(0.0, r.token_debt - floor_tok)
            r.delivery_debt = max(0.0, r.delivery_debt - floor_del)

    # -- shutdown and introspection -----------------------------------------

    def release_after_shutdown(self) -> None:
        """After a confirmed drain: drop in-flight steps and release every request."""
        self.inflight.clear()
        for req in list(self.live.values()):
            req.inflight = 0
            if req.ended is None:
                req.ended = Ended(req.rid, "cancelled", None)
            req.phase = Phase.RETIRING
            self._try_retire(req)
        for req in self.queue:
            req.phase = Phase.RETIRED
        self.queue.clear()

    def estimated_duration_ns(self, graph_index: int) -> int:
        return self.timing.estimate_ns(graph_index)

    @property
    def num_live(self) -> int:
        return len(self.live)

    @property
    def num_queued(self) -> int:
        return len(self.queue)

    _oldest_submit: float = 0.0
