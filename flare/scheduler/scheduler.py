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

import dataclasses
import itertools
import time
from collections import deque
from typing import Callable, Sequence

import numpy as np

from .._fast import sched as fast
from ..cache import Created, PrefixCheckpointCache, PrefixHistory
from ..config import PolicyConfig
from ..contract import (
    FRAMES,
    PIPELINED_STEPS,
    REC_CONSUMED,
    REC_GENERATED,
    REC_GENERATION,
    REC_NEW_TOKENS,
    REC_SLOT,
    REC_TOKEN0,
    GraphKind,
    GraphSpec,
    PreparedContract,
)
from ..request import PreparedPrompt, SamplingParams
from .errors import CapacityError, CompletionError, StalePlanError, UnknownRequestError
from .live import LiveRequest, SlotTable
from .plan import (
    CommittedStep,
    Ended,
    PageUpload,
    Phase,
    ScheduledPlan,
    StepResult,
)
from .policy import Selection
from .resources import IdPool
from .speculation import Proposer, Speculation
from .steps import DECODE, SMALL_KINDS, STEPS, StepKind
from .targets import CheckpointTargets
from .timing import TimingEstimates

_scheduler_ids = itertools.count(1)
MAX_GENERATION = (1 << 62)
_EMPTY = np.zeros(0, np.int64)


class RequestScheduler:
    def __init__(self, contract: PreparedContract, identity: bytes, policy: PolicyConfig = PolicyConfig(), *,
                 eos_token_ids: Sequence[int] = (), clock: Callable[[], float] = time.monotonic,
                 proposer: Proposer | None = None):
        self.id = next(_scheduler_ids)
        self.contract = contract
        self.policy = policy
        self.clock = clock
        self.eos_token_ids = frozenset(int(t) for t in eos_token_ids)
        self._eos = np.array(sorted(self.eos_token_ids), np.int64)
        self.page_tokens = contract.page_tokens
        self.slots = IdPool("slots", range(1, contract.max_active + 1))
        self.pages = IdPool("pages", range(contract.num_pages))
        self.rows = IdPool("snapshot rows", range(contract.num_snapshot_rows))
        self.cache = PrefixCheckpointCache(identity, contract.num_pages, contract.num_snapshot_rows)
        self.identity = identity
        self.table = SlotTable(contract.max_active, contract.context)
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
        self._oldest_submit = 0.0
        self._graphs: dict[GraphKind, list[GraphSpec]] = {}  # general graphs by kind
        greedy_decode: list[GraphSpec] = []
        for g in contract.graphs:
            if g.kind == GraphKind.DECODE and g.greedy:
                greedy_decode.append(g)
            elif not g.greedy:
                self._graphs.setdefault(g.kind, []).append(g)
        for graphs in (*self._graphs.values(), greedy_decode):
            graphs.sort(key=lambda g: (g.batch, g.tokens))
        # PREFILL graphs of one request (by token capacity) and cohort prefill graphs (b > 1)
        self.cohort_prefill_graphs = [g for g in self._graphs[GraphKind.PREFILL] if g.batch > 1]
        self._graphs[GraphKind.PREFILL] = [g for g in self._graphs[GraphKind.PREFILL] if g.batch == 1]
        # MIXED graphs by decode width, each list by prompt capacity
        self.mixed_graphs: dict[int, list[GraphSpec]] = {}
        self.mixed_greedy: dict[tuple[int, int], GraphSpec] = {}  # (w, p) -> its greedy variant
        for g in contract.graphs:
            if g.kind == GraphKind.MIXED:
                if g.greedy:
                    self.mixed_greedy[(g.width, g.tokens)] = g
                else:
                    self.mixed_graphs.setdefault(g.width, []).append(g)
        for graphs in self.mixed_graphs.values():
            graphs.sort(key=lambda g: g.tokens)
        self.mixed_widths = sorted(w for w in self.mixed_graphs if w)
        self.decode_graphs = sorted(self._graphs[GraphKind.DECODE] + greedy_decode, key=lambda g: g.batch)
        # decode graph per cohort size: [general, greedy] (greedy: all rows argmax, no logprobs)
        self.decode_graph_for = [None] + [
            (self.graph_for(GraphKind.DECODE, n), next((g for g in greedy_decode if g.batch >= n), None))
            for n in range(1, contract.max_batch + 1)]
        self.targets = CheckpointTargets(self.cache, self.rows, self.timing, policy,
                                         self._graphs[GraphKind.PREFILL], self._graphs[GraphKind.SNAPSHOT],
                                         lambda: self._collect_cache(self.completed_fence),
                                         [*self.mixed_graphs.get(0, ()),
                                          *(g for (w, _), g in self.mixed_greedy.items() if w == 0)])
        self.selection = Selection(self, self.targets)
        # speculative decoding: with a proposer and the contract's SPECULATIVE graphs
        self.speculation = (Speculation(self, proposer) if proposer is not None and contract.speculative_widths
                            else None)
        # Preemption: a preempted request continues as a new request (its own ID); clients keep
        # the first ID. _origin: scheduler ID -> client ID (continuations only); _current: the
        # reverse, for the IDs clients name in finish / cancel / request.
        self._origin: dict[int, int] = {}
        self._current: dict[int, int] = {}
        # counters
        self.num_admitted = self.num_completed = self.num_cancelled = 0
        self.num_preemptions = self.num_preempt_restored = self.num_preempt_recomputed = 0
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
        if self.pages_for(length + params.max_tokens - 1) > self.contract.num_pages:
            raise CapacityError(f"a {length + params.max_tokens}-token request needs more KV pages "
                                f"than the cache holds ({self.contract.num_pages})")
        stop_ids = set(params.stop_token_ids)
        if not params.ignore_eos:
            stop_ids |= self.eos_token_ids
        endpoints = tuple(e for e in prompt.message_endpoints if 0 < e < length)
        req = LiveRequest(next(self._rids), prompt.token_ids, endpoints, params, int(seed) & ((1 << 63) - 1),
                          self.clock(), frozenset(stop_ids), self.table)
        self.queue.append(req)
        self._admission_blocked = False
        return req.rid

    def client_rid(self, rid: int) -> int:
        """The ID the client knows a scheduler request by (a continuation's first ID)."""
        return self._origin.get(rid, rid)

    def request(self, rid: int) -> LiveRequest:
        rid = self._current.get(rid, rid)
        for req in itertools.chain(self.live.values(), self.queue):
            if req.rid == rid:
                return req
        raise UnknownRequestError(f"no live request {rid}")

    def finish(self, rid: int, reason: str = "stop") -> None:
        """End a request (e.g. a stop string matched); its later tokens are not emitted."""
        rid = self._current.get(rid, rid)
        req = self.live.get(rid)
        if req is None:
            self.cancel(rid)
            return
        if req.ended is None:
            # Steps already committed consumed tokens the host has not seen yet; their
            # completions still record what they sampled, so the terminal checkpoint
            # covers exactly the consumed tokens (spec: finish publishes the exact
            # terminal consumed state).
            self.table.records_after_end[req.slot] = True
            self._end(req, Ended(rid, reason, None))

    def cancel(self, rid: int) -> bool:
        """Stop scheduling now; resources stay owned until the request's last fence completes."""
        rid = self._current.get(rid, rid)
        for i, req in enumerate(self.queue):
            if req.rid == rid:
                del self.queue[i]
                req.phase = Phase.RETIRED
                self._forget_alias(req)
                self.num_cancelled += 1
                return True
        req = self.live.get(rid)
        if req is None or req.cancelled:
            return False
        req.cancelled = True
        if req.ended is None:
            req.ended = Ended(rid, "cancelled", None)
            self.table.ended[req.slot] = True
        self.num_cancelled += 1
        req.terminal_row = self._release_row(req.terminal_row, req)
        req.phase = Phase.RETIRING
        req.bump()
        self._try_retire(req)
        return True

    # -- resources ----------------------------------------------------------

    def pages_for(self, positions: int) -> int:
        return -(-max(positions, 1) // self.page_tokens)

    def new_pages_needed(self, r: LiveRequest, positions: int) -> int:
        """Pages still to assign so that positions [0, positions) are mapped."""
        return max(0, self.pages_for(positions) - len(r.pages))

    def seed_estimates(self, durations_ns) -> None:
        """Start from the executor's timings of the graphs (ns by graph index, 0 where unknown)
        instead of unmeasured estimates: an unmeasured graph outranks every measured one and
        runs alone, so without seeds the first requests served pay for running each graph once
        (docs/scheduler.md, "Timing estimates")."""
        now = self.clock()
        for index, ns in enumerate(durations_ns):
            self.timing.seed(index, int(ns), now)

    def graphs_of(self, kind: GraphKind) -> list[GraphSpec]:
        return self._graphs[kind]

    def graph_for(self, kind: GraphKind, rows: int, tokens: int = 1) -> GraphSpec:
        for g in self._graphs[kind]:
            if g.batch >= rows and g.tokens >= tokens:
                return g
        raise KeyError(kind)

    @property
    def num_free_pages(self) -> int:
        return self.pages.num_free

    @property
    def unreserved_pages(self) -> int:
        """Free pages that no live request's reservation counts on."""
        return max(0, min(self.pages.num_free, self._available_pages()))

    def _available_pages(self) -> int:
        counters = self.cache.counters()
        return (self.pages.num_free + self.pages.num_retiring + counters.retiring_pages
                - self.reserved_pages)

    # -- admission ----------------------------------------------------------

    def _admit_queued(self, now: float) -> None:
        while self.queue and self.slots.num_free and not self._admission_blocked:
            req = self.queue[0]
            if self._awaits_terminal(req):
                return  # the turn it continues is publishing its terminal checkpoint: admit after it
            if not self._admit(req, now):
                self._admission_blocked = True
                return
            self.queue.popleft()

    def _awaits_terminal(self, req: LiveRequest) -> bool:
        """Whether an ended request's pending terminal capture would prefix ``req``'s prompt.

        A client sends the next turn as soon as the last one's final token arrives, which
        is before that request's terminal snapshot is taken (and the checkpoint stays
        invisible until the snapshot's fence completes); admitting the next turn then
        would miss the whole previous turn. Waiting for the capture (one snapshot step)
        lets the lookup find it.
        """
        for other in self.live.values():
            if other.ended is None or other.cancelled:
                continue
            if other.terminal_row < 0 and other.terminal_fence <= self.completed_fence:
                continue  # no capture pending, or its checkpoint is already visible
            endpoint = other.planned
            if endpoint > req.prompt_len or endpoint <= other.prompt_len:
                continue
            if not np.array_equal(req.prompt[:other.prompt_len], other.prompt):
                continue
            sampled = other.sampled[:endpoint - other.prompt_len]
            if np.array_equal(req.prompt[other.prompt_len:other.prompt_len + len(sampled)], sampled):
                return True
        return False

    def _admit(self, req: LiveRequest, now: float) -> bool:
        length = req.prompt_len
        history = PrefixHistory(self.identity, req.prompt)
        hit = self.cache.lookup(history, length)
        reused = hit.endpoint if hit else 0
        if hit:
            self.cache.pin(hit.checkpoint)
        # Positions the steps map: the prompt and every output but the last, and at least the
        # page holding a full hit's restored tail (RESTORE maps position `reused`), which a
        # page-aligned full hit with max_tokens 1 would otherwise lack.
        # KV pages on demand: the prompt and a bounded output lookahead are reserved; pages
        # beyond grow from unreserved ones (assign_pages), and preemption frees them when
        # none are left (_relieve_page_pressure).
        outputs = min(req.max_tokens, self.policy.output_page_lookahead)
        need = self.pages_for(max(length + outputs - 1, reused + 1)) - reused // self.page_tokens
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
        req.phase = Phase.INITIALIZING
        req.attach(slot, generation, self.contract.context, now)
        req.history = history
        req.reused = reused
        if hit:
            req.tip, req.tip_endpoint = hit.checkpoint, hit.endpoint
            req.pages = list(self.cache.page_table(hit.checkpoint))
            req.private_from = len(req.pages)
            self.table.num_pages[slot] = len(req.pages)
        req.page_budget = need
        self.reserved_pages += need
        if req.base_outputs is not None:  # a preempted request's continuation
            if reused >= length - 1:
                self.num_preempt_restored += 1
            else:
                self.num_preempt_recomputed += 1
        self.targets.select(req)
        req.bump()
        self.live[req.rid] = req
        self.by_slot[slot] = req
        self.num_admitted += 1
        return True

    # -- planning -----------------------------------------------------------

    def plan(self) -> ScheduledPlan | None:
        """Choose the next graph to submit, or None when nothing may run now."""
        now = self.clock()
        self._admit_queued(now)
        if self.starved_decoders() > 0:
            self._relieve_page_pressure(now)
        window = self.inflight
        pipelined = 0
        if window:
            # Any measured step may queue behind another: a candidate's requests have
            # nothing in flight, so they never touch the same request state, and the
            # device runs them in order. Unmeasured and refresh dispatches run alone.
            if any(s.plan.is_refresh or s.plan.estimate_ns == 0 for s in window):
                return None
            # NOTE: the oldest queued graph running past its expected finish stops queueing.
            if now - self._oldest_submit > 1.5 * window[0].plan.estimate_ns * 1e-9 + 0.002:
                return None
            pipelined = sum(1 for s in window if s.plan.kind not in SMALL_KINDS)
        # At most _pipeline_depth() steps that decode or prefill are in flight; a small step
        # takes a frame only while the frames those steps may still want stay free.
        depth = self._pipeline_depth()
        small_fits = len(window) + 1 + max(0, PIPELINED_STEPS - pipelined) <= FRAMES
        if pipelined >= depth:
            return self._plan_small(now) if small_fits else None
        sel = self.selection
        decode = DECODE.cohort(self)
        spec = self.speculation
        speculative = spec.candidates(sel, decode[1], decode[0]) if spec is not None and decode is not None else []
        other_work = sel.has_other_work()
        if not other_work and not speculative:
            if decode is None:
                if not window:
                    self.timing.idle()
                return None
            # Only the decode cohort can run: no scoring needed.
            graph, slots = decode
            if window and spec is not None and spec.prefers(slots, graph):
                return None  # let the window drain: the decoders speculate once nothing of theirs is in flight
            stale = self.timing.is_stale(graph.index, now)
            if window and stale:
                return None
            return ScheduledPlan(self.id, GraphKind.DECODE, graph.index, graph.batch, graph.tokens,
                                 DECODE.plan_rows(self, slots), self.timing.estimate_ns(graph.index), stale)
        # row-wise candidates serve requests in the phases has_other_work looks for, nothing else
        candidates = sel.candidates(small=small_fits) if other_work else []
        if decode is not None and any(k == GraphKind.MIXED and g.width for k, g, _, _ in candidates):
            # Decoders ride in a mixed step while prompts wait (steps/mixed.py): a MIXED
            # candidate carries the whole decode cohort, so a pure decode step only delays the
            # prompts, and a prompt's prefill done later shrinks every later decode cohort.
            # Scored against each other, decode's value rate always won: simulated H200 (1,024
            # in / 256 out at concurrency 64), 3,035 output tok/s and TTFT p50 3.6 s with pure
            # decode competing, 4,959 and 0.35 s with the decoders riding (docs/scheduler.md).
            decode = None
            speculative = []  # speculation serves decode-only phases
        if speculative and spec.always:  # a benchmark's verification-only mode
            if window:
                return None  # rounds run alone, so the decoders verify together instead of in fragments
            widest = max(speculative, key=lambda c: c[1].tokens)
            return spec.plan(widest, self.timing.estimate_ns(widest[1].index), probe=False)
        if speculative:
            probe = spec.probe(speculative)
            if probe >= 0:  # speculation stopped paying: a round funded by decode time tests it again
                g = speculative[probe][1]
                return spec.plan(speculative[probe], self.timing.estimate_ns(g.index), probe=True)
            candidates += speculative
        elif decode is not None and window and spec is not None and spec.prefers(decode[1], decode[0]):
            return None  # as above: drain so that the decoders can speculate
        if decode is not None:
            decode = (decode[0], decode[1], DECODE.value(sel, decode[1]))
        if not candidates and decode is None:
            if not window:
                self.timing.idle()
            return None
        plan = sel.select(candidates, decode, now)
        if window and (plan.is_refresh or plan.estimate_ns == 0):
            return None  # the winner must run alone to be measured: let the window drain
        return plan

    def _pipeline_depth(self) -> int:
        """Steps that decode or prefill may be in flight: PIPELINED_STEPS, so the device never
        waits for the host's turn between two of them, but one while a request waits to start
        (queued, or admitted and not through its small first steps) or holds a slot it has
        finished with (its terminal capture or retirement pending). Those requests' next
        steps (the capture, the INITIALIZE of the request taking the slot, its first prefill)
        would queue behind a second pipelined step, one step each: simulated H200 (1,024 in,
        256 out, concurrency 64), TTFT p50 550 ms with two always, 222 with this rule, 170 with
        small steps taking a pipelined frame (docs/scheduler.md, "Frames")."""
        phase = self.table.phase
        waiting = ((phase >= int(Phase.INITIALIZING)) & (phase <= int(Phase.RESUMING))) | (
            (phase >= int(Phase.FINISHING)) & (phase <= int(Phase.RETIRING)))
        return 1 if self.queue or bool(np.any(waiting)) else PIPELINED_STEPS

    def _plan_small(self, now: float) -> ScheduledPlan | None:
        """A small step behind the pipelined steps in flight (their frames are taken), or None."""
        sel = self.selection
        candidates = sel.candidates(large=False) if sel.has_other_work() else []
        if not candidates:
            return None
        plan = sel.select(candidates, None, now)
        return None if plan.is_refresh or plan.estimate_ns == 0 else plan  # those run alone

    # -- page pressure ------------------------------------------------------

    def starved_decoders(self) -> int:
        """Decoders whose next position needs a page past their reservation, beyond the
        unreserved pages there are."""
        over = len(DECODE.over_reservation(self, DECODE.decodable(self)))
        return over - self.unreserved_pages if over else 0  # (the cache's counters only when needed)

    def _relieve_page_pressure(self, now: float) -> None:
        """Unreserved pages for starved decoders: evict unpinned cache leaves first; when pages
        are still short and none are on their way back, preempt the live request of lowest
        value: the latest arrival with nothing in flight (vLLM's order) that holds pages."""
        deficit = self.starved_decoders()
        self.cache.evict(page_target=deficit)
        self._collect_cache(self.completed_fence)
        if self.starved_decoders() <= 0 or self.pages.num_retiring or self.cache.counters().retiring_pages:
            return
        victims = [r for r in self.live.values()
                   if r.ended is None and not r.cancelled and r.inflight == 0
                   and r.phase in (Phase.DECODING, Phase.PREFILLING)
                   and (len(r.pages) > r.private_from or r.kept_pages)]
        if victims:
            self._preempt(max(victims, key=lambda r: (r.arrival, r.rid)), now)

    def _preempt(self, req: LiveRequest, now: float) -> None:
        """End ``req`` for its pages and queue its continuation first: the prompt and every
        token it sampled, the outputs still allowed, its seed and the device counters it had.
        Its terminal capture (when it holds a row) publishes what it consumed, so the
        continuation restores it from the cache without replaying; if the checkpoint is
        evicted first, the continuation recomputes from the longest cached prefix."""
        t, slot = self.table, req.slot
        sampled = t.out[slot, :t.num_out[slot]].astype(np.int32)
        params = dataclasses.replace(req.params, max_tokens=int(t.limit[slot]) - len(sampled))
        cont = LiveRequest(next(self._rids), np.concatenate([req.prompt, sampled]), req.endpoints, params,
                           req.seed, req.arrival, req.stop_ids, t)
        cont.gen_base = req.gen_base + len(sampled)
        cont.base_outputs = sampled if req.base_outputs is None else np.concatenate([req.base_outputs, sampled])
        client = self._origin.pop(req.rid, req.rid)
        self._origin[cont.rid] = client
        self._current[client] = cont.rid
        req.preempted = True
        req.ended = Ended(req.rid, "preempted", None)
        t.ended[slot] = True
        req.finished_at = now
        self.num_preemptions += 1
        self._after_end(req)
        self.queue.appendleft(cont)
        self._admission_blocked = False

    def _forget_alias(self, req: LiveRequest) -> None:
        client = self._origin.pop(req.rid, None)
        if client is not None and self._current.get(client) == req.rid:
            del self._current[client]

    # -- commit -------------------------------------------------------------

    def commit(self, plan: ScheduledPlan, fence: int) -> CommittedStep:
        """Reserve pages and record cache use for ``plan`` submitted at ``fence``."""
        if plan.scheduler_id != self.id:
            raise StalePlanError("the plan belongs to another scheduler")
        if fence <= (self.inflight[-1].fence if self.inflight else self.completed_fence):
            raise StalePlanError(f"fence {fence} does not follow the last submitted fence")
        t, cols = self.table, plan.cols
        slots = cols.slots
        if (np.any(t.rid[slots] != cols.rids) or np.any(t.generation[slots] != cols.generations)
                or np.any(t.epoch[slots] != cols.epochs)):
            raise StalePlanError("a request in the plan changed since the plan was made")
        now = self.clock()
        if plan.kind == GraphKind.DECODE:
            step = DECODE.commit(self, plan, fence, now)
        elif plan.kind == GraphKind.MIXED:
            step = self._commit_mixed(plan, fence, now)
        elif plan.kind == GraphKind.SPECULATIVE:
            step = self.speculation.commit(plan, fence, now)
        else:
            step = self._commit_rows(plan, fence, now)
        if not self.inflight:
            self._oldest_submit = now
        self.inflight.append(step)
        self.timing.attempted(plan.graph_index, now)
        if plan.is_funded_refresh:
            self.timing.pay_refresh(plan.graph_index)
        return step

    def _commit_rows(self, plan: ScheduledPlan, fence: int, now: float) -> CommittedStep:
        reqs = [self.by_slot[int(s)] for s in plan.cols.slots]
        kind = STEPS[plan.kind]
        need = sum(self.new_pages_needed(req, kind.mapped_positions(self, row, req))
                   for row, req in zip(plan.rows, reqs))
        if need > self.pages.num_free:
            raise StalePlanError("the plan needs more free pages than are available")
        uploads, extras = [], []
        for row, req in zip(plan.rows, reqs):
            upload, extra = self._commit_row(kind, row, req, fence, now)
            if upload.pages:
                uploads.append(upload)
            extras.append(extra)
        slots = plan.cols.slots
        return CommittedStep(fence, plan, self.table.planned[slots].copy(), self.table.reported_generated(slots),
                             tuple(uploads), tuple(extras), now)

    def _commit_mixed(self, plan: ScheduledPlan, fence: int, now: float) -> CommittedStep:
        """The decode rows column-wise, as DECODE commits them; the prefill rows row-wise."""
        t, d = self.table, plan.decode_rows
        slots = plan.cols.slots
        dslots = slots[:d]
        kind = STEPS[GraphKind.MIXED]
        rows = plan.cols.rows(d)
        reqs = [self.by_slot[int(s)] for s in slots[d:]]
        need = int(np.count_nonzero(DECODE.pages_needed(self, dslots))) + sum(
            self.new_pages_needed(req, kind.mapped_positions(self, row, req)) for row, req in zip(rows, reqs))
        if need > self.pages.num_free:
            raise StalePlanError("the plan needs more free pages than are available")
        uploads = list(DECODE.advance(self, dslots, fence, now))
        extras = [(None, None)] * d
        for row, req in zip(rows, reqs):
            upload, extra = self._commit_row(kind, row, req, fence, now)
            uploads.append(upload)
            extras.append(extra)
        return CommittedStep(fence, plan, t.planned[slots].copy(), t.reported_generated(slots),
                             tuple(u for u in uploads if u.pages), tuple(extras), now)

    def assign_pages(self, req: LiveRequest, positions: int) -> PageUpload:
        need = self.new_pages_needed(req, positions)
        if need:
            reserved = min(need, req.page_budget)
            if need - reserved > self.unreserved_pages:
                raise CapacityError(f"request {req.rid} outgrew its page reservation and no page is unreserved")
            req.pages.extend(self.pages.take(need))
            req.page_budget -= reserved
            self.reserved_pages -= reserved
            self.table.num_pages[req.slot] = len(req.pages)
        first = req.uploaded_pages
        req.uploaded_pages = len(req.pages)
        return PageUpload(req.slot, first, tuple(req.pages[first:]))

    def _commit_row(self, kind: StepKind, row, req: LiveRequest, fence: int, now: float):
        req.inflight += 1
        req.last_fence = fence
        upload = self.assign_pages(req, kind.mapped_positions(self, row, req))
        extra = kind.commit_row(self, row, req, fence, now)
        req.bump()
        return upload, extra

    def publish_snapshot(self, req: LiveRequest, row: int, fence: int, *, terminal: bool) -> None:
        """Publish the checkpoint the SNAPSHOT step at ``fence`` captures."""
        if terminal:
            endpoint = req.planned
            req.history.append(np.asarray(req.sampled[:endpoint - req.prompt_len], dtype=np.int32))
            req.terminal_row = -1
            req.terminal_fence = fence
        else:
            endpoint = req.snapshot_due
            i = req.targets.index(endpoint)
            req.targets.pop(i)
            req.target_rows.pop(i)
            req.snapshot_due = -1
            if req.ended is None:
                req.phase = Phase.DECODING if req.planned == req.prompt_len else Phase.PREFILLING
        start = req.tip_endpoint // self.page_tokens
        end = endpoint // self.page_tokens
        result = None
        if endpoint > req.tip_endpoint and start >= req.private_from:
            result = self.cache.publish(req.history, endpoint, parent=req.tip, pages=req.pages[start:end],
                                        snapshot=row, consumed=endpoint, ready_fence=fence)
        if isinstance(result, Created):
            # Pages before `start` that are still private (an earlier publish found an existing
            # checkpoint and kept them) stay this request's: its page table maps them until it
            # retires. They used to fall out of every owner here (a leak the page-ownership
            # state machine found: the same one-page prompt twice, admitted together).
            req.kept_pages.extend(req.pages[req.private_from:start])
            req.private_from = end
            self._move_tip(req, result.checkpoint, endpoint, fence)
        else:
            if result is not None:  # Existing: keep our pages, chain onto the cached checkpoint
                self._move_tip(req, result.checkpoint, endpoint, fence)
            self.rows.retire([row], fence, self.completed_fence)
        if terminal:
            req.phase = Phase.RETIRING
        elif req.ended is not None:
            self._after_end(req)

    def _move_tip(self, req: LiveRequest, checkpoint: int, endpoint: int, fence: int) -> None:
        self.cache.pin(checkpoint)
        self.cache.mark_used(checkpoint, fence)
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
        cols = step.cols
        slots = cols.slots
        kind = step.plan.kind
        if kind == GraphKind.SPECULATIVE:
            return self._complete_speculative(step, records, duration_ns)
        bad = fast.validate_records(records, slots, cols.generations, step.consumed, step.generated,
                                    STEPS[kind].max_new_tokens)
        if bad >= 0:
            s = int(slots[bad])
            rec = records[s] if 0 <= s < len(records) else None
            fields = None if rec is None else tuple(
                int(rec[i]) for i in (REC_SLOT, REC_GENERATION, REC_CONSUMED, REC_GENERATED, REC_NEW_TOKENS))
            raise CompletionError(
                f"{step.plan.kind.name} completion at fence {fence} for slot {s}: record {fields} "
                f"(slot, generation, consumed, generated, new); expected generation {cols.generations[bad]}, "
                f"consumed {step.consumed[bad]}, generated {step.generated[bad]}")
        # -- commit the completion
        t = self.table
        self._pop_completion(step, step.consumed, step.generated, duration_ns)
        new = records[slots, REC_NEW_TOKENS] > 0
        emit = new & ~t.ended[slots]
        late = new & t.records_after_end[slots] & t.ended[slots]
        if late.any():  # recorded for the terminal checkpoint, never emitted
            ls = slots[late]
            at = t.num_out[ls]
            t.out[ls, at] = records[ls, REC_TOKEN0]
            t.num_out[ls] = at + 1
        ended: list[Ended] = []
        if emit.any():
            es = slots[emit]
            tokens = records[es, REC_TOKEN0]
            index = t.num_out[es]
            t.out[es, index] = tokens
            t.num_out[es] = index + 1
            rids = t.rid[es].copy()
            if self._origin:  # continuations report their client's ID
                rids = np.fromiter((self._origin.get(r, r) for r in rids.tolist()), np.int64, len(rids))
            stop = (tokens[:, None] == self._eos[None, :]).any(axis=1) & ~t.ignore_eos[es]
            if t.has_stop_ids[es].any():
                for i in np.flatnonzero(t.has_stop_ids[es]):
                    stop[i] |= int(tokens[i]) in self.by_slot[int(es[i])].stop_ids
            done = stop | (t.num_out[es] >= t.limit[es])
            for i in np.flatnonzero(done):
                req = self.by_slot[int(es[i])]
                end = Ended(req.rid, "stop", int(tokens[i])) if stop[i] else Ended(req.rid, "length", None)
                self._end(req, end)
                ended.append(end._replace(rid=self.client_rid(req.rid)))
        else:
            es = rids = tokens = index = _EMPTY
        if self.speculation is not None and kind in (GraphKind.DECODE, GraphKind.MIXED):
            self.speculation.observe_decode(len(slots) if kind == GraphKind.DECODE else step.plan.decode_rows,
                                            duration_ns)
        return self._finish_completion(step, es, rids, tokens, index, ended, duration_ns)

    def _finish_completion(self, step: CommittedStep, es, rids, tokens, index, ended, duration_ns: int) -> StepResult:
        t, fence, slots = self.table, step.fence, step.cols.slots
        self.selection.update_prices(step, duration_ns * 1e-9, es)
        published = self._advance(fence)
        for s in slots[(t.phase[slots] == int(Phase.RETIRING)) & (t.inflight[slots] == 0)]:
            self._try_retire(self.by_slot[int(s)])
        return StepResult(fence, rids, es, tokens, index, tuple(ended), published)

    def _pop_completion(self, step: CommittedStep, consumed, generated, duration_ns: int) -> None:
        t, slots = self.table, step.cols.slots
        self.inflight.popleft()
        self.completed_fence = step.fence
        now = self.clock()
        self._oldest_submit = now
        self.launches[step.plan.kind] += 1
        self.timing.observe(step.plan.graph_index, duration_ns, now)
        t.consumed[slots] = consumed
        t.generated[slots] = generated
        t.inflight[slots] -= 1
        t.epoch[slots] += 1

    def _complete_speculative(self, step: CommittedStep, records: np.ndarray, duration_ns: int) -> StepResult:
        """A verification: each row kept 1 + its accepted drafts. Planned counters fall back
        from the commit's upper bound to what was accepted; the tokens are emitted in order up
        to the first stop or the output limit. A request that ends inside its accepted drafts
        has device state past its end, so it publishes no terminal checkpoint (an inexact one
        would be worse); its earlier checkpoints stay."""
        spec, t, cols = self.speculation, self.table, step.cols
        slots = cols.slots
        new = spec.validate(step, records)
        width = cols.num_tokens
        t.planned[slots] -= width - new
        t.planned_gen[slots] -= width - new
        t.spec_inflight[slots] = False
        self._pop_completion(step, step.consumed - width + new, step.generated - width + new, duration_ns)
        spec.counters.verification_steps += 1
        es, rids, tokens, index, ended = [], [], [], [], []
        for i, s in enumerate(slots.tolist()):
            req = self.by_slot[s]
            n = int(new[i])
            row = records[s, REC_TOKEN0:REC_TOKEN0 + n]
            at = int(t.num_out[s])
            if t.ended[s]:
                if t.records_after_end[s]:  # recorded for the terminal checkpoint, never emitted
                    t.out[s, at:at + n] = row
                    t.num_out[s] = at + n
                continue
            kept, end = n, None
            for j, token in enumerate(row.tolist()):
                if token in req.stop_ids:
                    kept, end = j + 1, Ended(req.rid, "stop", token)
                    break
                if at + j + 1 >= t.limit[s]:
                    kept, end = j + 1, Ended(req.rid, "length", None)
                    break
            t.out[s, at:at + kept] = row[:kept]
            t.num_out[s] = at + kept
            client = self.client_rid(req.rid)
            es.extend([s] * kept)
            rids.extend([client] * kept)
            tokens.extend(row[:kept].tolist())
            index.extend(range(at, at + kept))
            spec.observe(req, int(width[i]) - 1, n - 1, kept)
            if end is not None:
                if kept < n:
                    req.terminal_row = self._release_row(req.terminal_row, req)
                self._end(req, end)
                ended.append(end._replace(rid=client))
        as_array = lambda values: np.asarray(values, np.int64)  # noqa: E731
        return self._finish_completion(step, as_array(es), as_array(rids), as_array(tokens), as_array(index),
                                       ended, duration_ns)

    def _end(self, req: LiveRequest, end: Ended) -> None:
        """A request just ended: count it and move it toward retirement."""
        req.ended = end
        self.table.ended[req.slot] = True
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
        """Release a terminal request's resources once its last step has completed."""
        if req.phase != Phase.RETIRING or req.inflight:
            return
        fence, done = req.last_fence, self.completed_fence
        if req.tip is not None:
            self.cache.unpin(req.tip)
            req.tip = None
        self.pages.retire(req.pages[req.private_from:] + req.kept_pages, fence, done)
        req.kept_pages = []
        self.rows.retire(req.target_rows, fence, done)
        req.target_rows, req.targets = [], []
        req.terminal_row = self._release_row(req.terminal_row, req)
        self.reserved_pages -= req.page_budget
        req.page_budget = 0
        slot = req.slot
        self.slots.retire([slot], fence, done)
        if not req.preempted:
            self._forget_alias(req)
        del self.live[req.rid]
        del self.by_slot[slot]
        req.phase = Phase.RETIRED
        req.bump()
        req.detach()
        self._admission_blocked = False

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
