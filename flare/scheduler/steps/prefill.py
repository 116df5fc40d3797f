"""PREFILL: consume prompt tokens up to the next checkpoint endpoint, alone or in a cohort.

Each loaded token capacity competes on the tokens it can actually consume (a larger
one consuming the same tokens is dominated); cohorts of several requests' chunks run
within the largest single chunk's token budget. A row that reaches the prompt end
samples the first output token.
"""

from __future__ import annotations

from ...contract import GraphKind
from ..plan import Phase, PlanRow
from .base import StepKind


class Prefill(StepKind):
    kind = GraphKind.PREFILL
    name = "prefill"
    phases = (Phase.PREFILLING,)

    def candidates(self, sel, budget):
        s = sel.s
        unit = sel.pol.output_token_value
        free_pages = budget.free_pages
        prefilling = budget.by_phase.get(Phase.PREFILLING, [])
        # One request's chunks on the same graph differ only in value (the same duration, the
        # same decoders left waiting), and selection takes the first of the highest score, so
        # of each graph's chunks only the first of the highest value can win. A funded refresh
        # of a stale graph takes its first candidate that did not win: the first two stay too.
        # With hundreds of prompts waiting this keeps a plan's candidates to a few per graph
        # (tools/bench_host.py at concurrency 256 built about a thousand a plan).
        kept: dict[int, list] = {}  # graph index -> [first, second, best] as (order, r, k, sample, value)
        order = 0
        for r in prefilling:
            planned = r.planned
            remaining = r.next_stop - planned
            per_token = sel.prefill_price_per_token(r)
            last_tokens = -1
            for g in s.graphs_of(GraphKind.PREFILL):
                k = min(g.tokens, remaining)
                if k == last_tokens:
                    break  # larger capacities consume the same tokens: dominated
                last_tokens = k
                if s.new_pages_needed(r, planned + k) > free_pages:
                    break
                sample = planned + k == r.prompt_len
                entry = (order, r, k, sample, k * (1.0 + per_token) + (unit if sample else 0.0), g)
                order += 1
                slots = kept.get(g.index)
                if slots is None:
                    kept[g.index] = [entry, None, entry]
                    continue
                if slots[1] is None:
                    slots[1] = entry
                if entry[4] > slots[2][4]:
                    slots[2] = entry
        entries = sorted({e[0]: e for slots in kept.values() for e in slots if e is not None}.values(),
                         key=lambda e: e[0])
        out = [(GraphKind.PREFILL, g, [PlanRow(r.rid, r.handle, r.epoch, r.planned, k, sample, -1)], value)
               for _, r, k, sample, value, g in entries]
        if len(prefilling) > 1:
            out.extend(self.cohorts(sel, prefilling, free_pages))
        return out

    def cohorts(self, sel, prefilling, free_pages: int):
        """Cohort prefill candidates: the most indebted requests first, each row consuming
        what the token capacity allows up to its next stop. A batch capacity that a smaller
        one could hold, or a token capacity consuming the same tokens as a smaller one, is
        dominated and skipped."""
        s, unit = sel.s, sel.pol.output_token_value
        order = sorted(prefilling, key=lambda r: r.token_debt, reverse=True)
        per_token = {r.rid: sel.prefill_price_per_token(r) for r in order}
        out = []
        last: tuple[int, tuple[int, ...]] | None = None
        for g in s.cohort_prefill_graphs:  # by (batch, tokens)
            if len(order) <= g.batch // 2:
                break  # every larger batch is dominated too
            rows, value, pages = [], 0.0, free_pages
            for r in order[:g.batch]:
                k = min(g.tokens, r.next_stop - r.planned)
                need = s.new_pages_needed(r, r.planned + k)
                if need > pages:
                    continue
                pages -= need
                sample = r.planned + k == r.prompt_len
                rows.append(PlanRow(r.rid, r.handle, r.epoch, r.planned, k, sample, -1))
                value += k * (1.0 + per_token[r.rid]) + (unit if sample else 0.0)
            if len(rows) < 2:
                continue
            work = (g.batch, tuple(row.num_tokens for row in rows))
            if last is not None and work == last:
                continue  # a smaller token capacity consumes the same tokens
            last = work
            out.append((GraphKind.PREFILL, g, rows, value))
        return out

    def mapped_positions(self, view, row, req):
        return row.start + row.num_tokens

    def commit_row(self, view, row, req, fence, now):
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
        return tokens, None


STEP = Prefill()
