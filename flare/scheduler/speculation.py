"""Speculative decoding on the host: proposals, acceptance statistics, width selection.

A SPECULATIVE step verifies up to w - 1 drafted tokens per request in one forward pass
(model/programs.py, ``_speculative``). The host side lives here:

- a :class:`Proposer` drafts each round's tokens: :class:`CopyProposer` (n-gram lookup
  over the prompt and output, ``flare serve --speculative copy``) or the benchmark's
  :class:`ReplayProposer` (a known continuation, right with a chosen probability);
- :class:`AcceptanceStats`, one per request and proposal source, learns the conditional
  acceptance of each draft depth from that request's own verifications;
- :class:`Speculation` builds the SPECULATIVE candidates (one per captured width, valued
  by the tokens each row is expected to keep), decides when pipelined decode should drain
  so that a speculative round can run, funds probes once speculation stopped paying, and
  keeps the spec's counters (verification and drafter steps, acceptance length, DEPTH).

Eligible requests: not grammar-constrained, no logprobs, no presence/frequency/repetition
penalty. Others decode as before (docs/speculative.md).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Mapping, NamedTuple

import numpy as np

from .._fast.ngram import propose_copy
from .._fast.sched import validate_verification
from ..contract import (
    REC_NEW_TOKENS,
    RECORD_TOKENS,
    GraphKind,
    GraphSpec,
)
from .errors import CompletionError, StalePlanError
from .plan import CommittedStep, RowArrays, ScheduledPlan
from .steps.decode import Decode

if TYPE_CHECKING:
    from .live import LiveRequest

MAX_DEPTH = RECORD_TOKENS - 1
# A request's prior for each depth is the population's rate for its proposal source (every
# request's verifications, aged more slowly) with this weight in observations; the population
# starts at Beta(1, 1), even odds. A fixed prior was wrong both ways: at a third it never started
# speculating on the CPU (a width-5 verification costs 1.8 decode steps there), at a half it kept
# 32 rejected copies going for three rounds on the H200.
PRIOR_WEIGHT = 2.0
AGING = 0.9  # each verification ages the request's earlier observations by this factor
POPULATION_AGING = 0.98
AVAILABILITY_AGING = 0.8
PROBE_FRACTION = 0.01  # of decode time, funding speculative rounds once speculation stopped paying
DRAIN_MARGIN = 1.05  # speculation must beat pipelined decode by this much to drain the window for it


class Proposer:
    """Drafts the tokens expected to follow a request's history."""

    source = ""  # "copy" | "replay" (acceptance statistics are kept per source)
    learned = False  # a learned drafter: its depth counts as drafter steps

    def propose(self, req: "LiveRequest", out: np.ndarray, num_out: int, depth: int) -> np.ndarray:
        """Up to ``depth`` tokens (int64) to follow ``req.prompt`` + ``out[:num_out]``."""
        raise NotImplementedError

    def propose_batch(self, reqs: list, outs: list, num_outs: list, depths: list) -> list[np.ndarray]:
        """:meth:`propose` for several requests (a learned drafter runs them as one batch)."""
        return [self.propose(r, o, n, d) if d > 0 else _NONE for r, o, n, d in zip(reqs, outs, num_outs, depths)]

    def cost_s_for(self, rows: int, depth: int) -> float | None:
        """Seconds one round of ``rows`` requests at ``depth`` drafts costs (None: unmeasured);
        host lookups cost nothing next to a step."""
        return 0.0


class CopyProposer(Proposer):
    """Prompt-lookup decoding: continue the latest earlier occurrence of the history's longest
    suffix of ``max_ngram`` down to ``min_ngram`` tokens (flare/_fast/ngram.pyx)."""

    source = "copy"

    def __init__(self, min_ngram: int = 2, max_ngram: int = 4):
        self.min_ngram, self.max_ngram = min_ngram, max_ngram
        self._dest = np.zeros(MAX_DEPTH, np.int64)

    def propose(self, req, out, num_out, depth):
        n = propose_copy(req.prompt, out, num_out, self.min_ngram, self.max_ngram, self._dest[:depth])
        return self._dest[:n].copy()


class ReplayProposer(Proposer):
    """A benchmarking tool (not a serving option): replays a precomputed continuation of each
    prompt as the draft, each position right with probability ``accept`` (a wrong draft is the
    true token + 1), so speed can be measured as a function of acceptance on random weights."""

    source = "replay"

    def __init__(self, continuations: Mapping[bytes, np.ndarray], accept: float, vocab_size: int, seed: int = 0):
        self.continuations = continuations
        self.accept = accept
        self.vocab_size = vocab_size
        self.rng = np.random.default_rng(seed)

    def propose(self, req, out, num_out, depth):
        truth = self.continuations.get(np.asarray(req.prompt, np.int32).tobytes())
        if truth is None:
            return np.zeros(0, np.int64)
        draft = np.asarray(truth[num_out:num_out + depth], np.int64).copy()
        wrong = self.rng.random(len(draft)) >= self.accept
        draft[wrong] = (draft[wrong] + 1) % self.vocab_size
        return draft


class AcceptanceStats:
    """One request's conditional draft acceptance by depth, for one proposal source.

    Depth i's rate is the chance the i-th draft is accepted given the ones before it were.
    Observations age (AGING) so a request that stops copying is noticed; the prior is added
    after aging, so an unobserved depth keeps the prior mean."""

    __slots__ = ("hits", "trials", "available", "prior", "aging", "version", "_expected", "_expected_at")

    def __init__(self, prior: "AcceptanceStats | None" = None, aging: float = AGING):
        self.hits = np.zeros(MAX_DEPTH)
        self.trials = np.zeros(MAX_DEPTH)
        self.available = 1.0  # aged share of rounds the proposer had a draft
        self.prior = prior  # the population's statistics (None: even odds)
        self.aging = aging
        self.version = 0  # bumped by every observation
        self._expected: np.ndarray | None = None
        self._expected_at = (-1, -1)  # (version, the prior's version) _expected was computed at

    def rates(self) -> np.ndarray:
        prior = self.prior.rates() if self.prior is not None else 0.5
        return (self.hits + PRIOR_WEIGHT * prior) / (self.trials + PRIOR_WEIGHT)

    def expected(self, depth: int) -> float:
        """Expected accepted drafts of ``depth`` offered (the bonus token not counted)."""
        return float(self.expected_by_depth()[depth])

    def expected_by_depth(self) -> np.ndarray:
        """:meth:`expected` for every depth 0..MAX_DEPTH at once (cached until an observation,
        this request's or the population's)."""
        at = (self.version, self.prior.version if self.prior is not None else 0)
        if self._expected_at != at:
            out = np.zeros(MAX_DEPTH + 1)
            np.cumsum(np.cumprod(self.rates()), out=out[1:])
            self._expected, self._expected_at = out, at
        return self._expected

    def observe(self, offered: int, accepted: int, censored: bool) -> None:
        """A verification: ``accepted`` of ``offered`` drafts; ``censored``: the request ended
        inside the accepted prefix, so the depths after it were not tested."""
        self.version += 1
        self.hits *= self.aging
        self.trials *= self.aging
        self.hits[:accepted] += 1
        self.trials[:accepted] += 1
        if accepted < offered and not censored:
            self.trials[accepted] += 1  # the first rejected draft

    def saw_draft(self, had: bool) -> None:
        self.available = AVAILABILITY_AGING * self.available + (1 - AVAILABILITY_AGING) * had


class SpeculativeRows(NamedTuple):
    """A SPECULATIVE candidate's rows (column-wise) and each row's drafts."""

    cols: RowArrays
    drafts: tuple[np.ndarray, ...]

    def __len__(self) -> int:
        return len(self.cols)


class SpeculationCounters:
    """The spec's speculative figures (docs/metrics.md)."""

    __slots__ = ("verification_steps", "drafter_steps", "draft_positions", "accepted_drafts", "draft_rounds",
                 "generation_rounds", "probes")

    def __init__(self):
        for name in self.__slots__:
            setattr(self, name, 0)

    @property
    def mean_acceptance_length(self) -> float:
        """Accepted drafts per request round that offered at least one draft (no bonus token)."""
        return self.accepted_drafts / self.draft_rounds if self.draft_rounds else 0.0

    @property
    def depth(self) -> float:
        """DEPTH: allocated draft positions per progressing generation request round."""
        return self.draft_positions / self.generation_rounds if self.generation_rounds else 0.0


class Speculation:
    """SPECULATIVE candidates, commit and completion for one RequestScheduler."""

    def __init__(self, scheduler, proposer: Proposer):
        self.s = scheduler
        self.proposer = proposer
        graphs = [g for g in scheduler.contract.graphs if g.kind == GraphKind.SPECULATIVE]
        self.widths = sorted({g.tokens for g in graphs})
        self.batches = sorted({g.batch for g in graphs})
        self.graphs: dict[tuple[int, int, bool], GraphSpec] = {(g.batch, g.tokens, g.greedy): g for g in graphs}
        self.counters = SpeculationCounters()
        self.population: dict[str, AcceptanceStats] = {}  # per source: every request's verifications
        self.probe_credit_s = 0.0
        # Benchmarks only: every decode round is a verification of the widest width, drafts or
        # not (no back-off), so a continuation comes from verification rows alone.
        self.always = False

    @property
    def max_batch(self) -> int:
        return self.batches[-1]

    def _batch_for(self, n: int) -> int:
        return next(b for b in self.batches if b >= n)

    def stats(self, req: "LiveRequest") -> AcceptanceStats:
        by_source = req.speculation
        if by_source is None:
            by_source = req.speculation = {}
        source = self.proposer.source
        st = by_source.get(source)
        if st is None:
            population = self.population.get(source)
            if population is None:
                population = self.population[source] = AcceptanceStats(aging=POPULATION_AGING)
            st = by_source[source] = AcceptanceStats(population)
        return st

    # -- planning --------------------------------------------------------------

    def eligible(self, slots: np.ndarray) -> np.ndarray:
        t = self.s.table
        return slots[t.speculable[slots] & ~t.spec_inflight[slots]]

    def candidates(self, sel, decoding: np.ndarray, decode_graph: GraphSpec | None = None) -> list:
        """One SPECULATIVE candidate per captured width over the decoders with nothing in flight
        that may speculate; none when no row has a draft. A learned drafter runs only when its
        round is expected to pay (or must be measured, or a probe is funded), at the depth of
        the width expected to do best."""
        s, t = self.s, self.s.table
        slots = self.eligible(decoding)
        slots = slots[t.inflight[slots] == 0]
        if not len(slots):
            return []
        top = self.widths[-1] - 1
        verdict = None
        if self.proposer.learned and not self.always:
            verdict, width = self._outlook(slots, decode_graph)
            if verdict is None:
                return []
            top = width - 1
        if self.proposer.learned:  # a drafter's round costs per row: only the rows a step can take
            slots = slots[:self.max_batch]
        reqs = [s.by_slot[slot] for slot in slots.tolist()]
        # a round may emit 1 + depth tokens: within the output limit and the context
        depths = np.minimum(np.minimum(top, t.limit[slots] - t.planned_gen[slots] - 1),
                            s.contract.context - t.planned[slots] - 1).tolist()
        started = time.perf_counter() if verdict == "probe" else 0.0
        proposed = self.proposer.propose_batch(reqs, [t.out[slot] for slot in slots.tolist()],
                                               t.num_out[slots].tolist(), depths)
        if verdict == "probe":  # the drafter's round is the probe's cost as well
            self.probe_credit_s -= time.perf_counter() - started
        # pages past a request's reservation come from unreserved pages (as decode's do)
        free, unreserved = s.num_free_pages, None  # unreserved: counted once a row needs one
        rows, drafts = [], []
        for slot, req, draft in zip(slots.tolist(), reqs, proposed):
            def shortfall(n: int) -> tuple[int, int]:
                need = s.new_pages_needed(req, int(t.planned[slot]) + n + 1)
                return need, max(0, need - req.page_budget)

            need, over = shortfall(len(draft))  # cutting drafts only shrinks both
            if over and unreserved is None:
                unreserved = s.unreserved_pages
            while len(draft) and (need > free or (over and over > unreserved)):  # fewer drafts when pages are short
                draft = draft[:-1]
                need, over = shortfall(len(draft))
            if need > free or (over and over > unreserved):
                continue
            free -= need
            if over:
                unreserved -= over
            self.stats(req).saw_draft(len(draft) > 0)
            rows.append(slot)
            drafts.append(draft)
        if not rows or (not self.always and not any(len(d) for d in drafts)):
            return []
        if len(rows) > 1:
            order = sorted(range(len(rows)), key=lambda i: -len(drafts[i]))[:self.max_batch]
            rows, drafts = [rows[i] for i in order], [drafts[i] for i in order]
        rows = np.asarray(rows, np.int64)
        b = self._batch_for(len(rows))
        greedy = bool(t.plain[rows].all())
        unit = sel.pol.output_token_value
        base = Decode.value(sel, rows)
        cols = Decode.plan_rows(s, rows)
        lengths = np.fromiter((len(d) for d in drafts), np.int64, len(drafts))
        # each row's expected accepted drafts for every number offered (index: drafts offered)
        expected = [self.stats(s.by_slot[r]).expected_by_depth() for r in rows.tolist()]
        out = []
        for w in self.widths:
            offered = np.minimum(lengths, w - 1)
            cut = tuple(d[:w - 1] for d in drafts)
            value = base + unit * sum(float(e[k]) for e, k in zip(expected, offered.tolist()))
            g = self.graphs[(b, w, greedy)]
            out.append((GraphKind.SPECULATIVE, g, SpeculativeRows(cols.with_num_tokens(1 + offered), cut), value))
        return out

    def prefers(self, cohort: np.ndarray, decode_graph: GraphSpec) -> bool:
        """Whether the window of pipelined decode steps should drain so that the cohort's
        eligible decoders can speculate (see :meth:`_outlook`)."""
        slots = self.eligible(cohort)
        if not len(slots):
            return False
        return self.always or self._outlook(slots, decode_graph)[0] is not None

    def _outlook(self, slots: np.ndarray, decode_graph: GraphSpec | None) -> tuple[str | None, int]:
        """(verdict, width) for speculating over ``slots`` now. The verdict is "pays" when the
        best width's expected tokens per millisecond, its drafting included, beat the decode
        step's by DRAIN_MARGIN; "explore" when a width or its drafting is unmeasured; "probe"
        when the probe credit covers a width; None otherwise. ``width``: the best one."""
        s = self.s
        decode_ms = s.timing.estimate_ns(decode_graph.index) * 1e-6 if decode_graph is not None else 0.0
        if not decode_ms:
            return None, 0
        slots = slots[:self.max_batch]
        b = self._batch_for(len(slots))
        greedy = bool(s.table.plain[slots].all())
        stats = [self.stats(s.by_slot[int(r)]) for r in slots.tolist()]
        expected = sum(st.available * st.expected_by_depth() for st in stats)
        best, best_w = 0.0, self.widths[-1]
        for w in self.widths:
            g = self.graphs[(b, w, greedy)]
            est = s.timing.estimate_ns(g.index) * 1e-6
            drafting = self.proposer.cost_s_for(len(slots), w - 1)
            if not est or drafting is None:
                return "explore", w
            total = est + drafting * 1e3
            if total <= self.probe_credit_s * 1e3:
                return "probe", w
            tokens = len(stats) + float(expected[w - 1])
            if tokens / total > best:
                best, best_w = tokens / total, w
        return ("pays" if best > DRAIN_MARGIN * len(slots) / decode_ms else None), best_w

    def probe(self, candidates: list) -> int:
        """Index of a funded probe among the SPECULATIVE candidates (the widest one whose
        estimate the credit covers), or -1."""
        credit_ms = self.probe_credit_s * 1e3
        best = -1
        for i, (kind, g, _, _) in enumerate(candidates):
            if kind == GraphKind.SPECULATIVE:
                est = self.s.timing.estimate_ns(g.index) * 1e-6
                if est and est <= credit_ms:
                    best = i
        return best

    def plan(self, candidate, estimate_ns: int, probe: bool) -> ScheduledPlan:
        _, g, rows, _ = candidate
        if probe:
            self.probe_credit_s -= estimate_ns * 1e-9
            self.counters.probes += 1
        return ScheduledPlan(self.s.id, GraphKind.SPECULATIVE, g.index, g.batch, g.tokens, rows.cols, estimate_ns,
                             drafts=rows.drafts)

    # -- commit and completion ---------------------------------------------------

    def commit(self, plan: ScheduledPlan, fence: int, now: float) -> CommittedStep:
        """Map every position a row may write (its last token and drafts), advance its planned
        state to the most the round can emit; completion corrects it to what was accepted."""
        s, t = self.s, self.s.table
        slots = plan.cols.slots
        width = plan.cols.num_tokens  # 1 + drafts
        reqs = [s.by_slot[int(x)] for x in slots.tolist()]
        need = sum(s.new_pages_needed(r, int(t.planned[r.slot]) + int(n)) for r, n in zip(reqs, width.tolist()))
        if need > s.num_free_pages:
            raise StalePlanError("the plan needs more free pages than are available")
        uploads = [s.assign_pages(r, int(t.planned[r.slot]) + int(n)) for r, n in zip(reqs, width.tolist())]
        t.planned[slots] += width
        t.planned_gen[slots] += width
        t.inflight[slots] += 1
        t.spec_inflight[slots] = True
        t.last_fence[slots] = fence
        t.epoch[slots] += 1
        t.last_progress[slots] = now
        return CommittedStep(fence, plan, t.planned[slots].copy(), t.reported_generated(slots),
                             tuple(u for u in uploads if u.pages), committed_at=now)

    def validate(self, step: CommittedStep, records: np.ndarray) -> np.ndarray:
        """Each row's new tokens (1 + accepted drafts) after checking its record against the
        commit: slot, generation, 1 <= new <= 1 + drafts, counters advanced by exactly new."""
        cols = step.cols
        slots = cols.slots
        width = cols.num_tokens
        bad = validate_verification(records, slots, cols.generations, step.consumed, step.generated, width)
        if bad >= 0:
            rec = records[slots[bad]] if 0 <= slots[bad] < len(records) else np.full(5, -1)
            raise CompletionError(
                f"SPECULATIVE completion at fence {step.fence} for slot {int(slots[bad])}: record "
                f"{tuple(int(x) for x in rec[:5])} (slot, generation, consumed, generated, new); expected "
                f"generation {int(cols.generations[bad])}, new tokens 1..{int(width[bad])}")
        return records[slots, REC_NEW_TOKENS]

    def observe(self, req: "LiveRequest", offered: int, accepted: int, emitted: int) -> None:
        """A row's verification outcome: ``emitted`` of its new tokens were kept (fewer when the
        request ended inside them)."""
        c = self.counters
        c.generation_rounds += 1
        c.draft_positions += offered
        if offered:
            kept = min(accepted, emitted)
            c.accepted_drafts += kept
            c.draft_rounds += 1
            st = self.stats(req)
            st.observe(offered, kept, censored=emitted <= accepted)
            st.prior.observe(offered, kept, censored=emitted <= accepted)
        if self.proposer.learned:
            c.drafter_steps += offered

    def observe_decode(self, rows: int, duration_ns: int) -> None:
        """A decode (or mixed) step's decoders: progressing rounds without drafts; their time
        funds probes."""
        self.counters.generation_rounds += rows
        self.probe_credit_s = min(self.probe_credit_s + PROBE_FRACTION * duration_ns * 1e-9, 0.05)


_NONE = np.zeros(0, np.int64)


__all__ = ["AcceptanceStats", "CopyProposer", "Proposer", "ReplayProposer", "Speculation", "SpeculativeRows"]
