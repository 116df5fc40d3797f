"""PREFILL: consume prompt tokens up to the next checkpoint endpoint, alone or in a cohort.

Each loaded token capacity competes on the tokens it can actually consume (a larger
one consuming the same tokens is dominated); cohorts of several requests' chunks run
within the largest single chunk's token budget. A row that reaches the prompt end
samples the first output token.
"""

from __future__ import annotations

import numpy as np

from ...contract import GraphKind
from ..plan import Phase, PlanRow
from .base import StepKind


class PrefillColumns:
    """The prefilling requests' counters as columns, in ``budget.by_phase`` order, built once
    a plan: where each chunk must stop (the next target, else the prompt end), the pages each
    holds, and each one's token-service price per token.

    The price (Selection.price) is paid per token served: a chunk earns the share of it that
    its tokens are of the request's largest feasible chunk, ``min(stop - planned,
    prefill_chunk_size)``. (Paid whole to any chunk, it would make the smallest capacity the
    best value per millisecond and cut prompts into 64-token steps that each cost a full
    weight pass.) Computed here in Selection.price's order of operations, so these are the
    floats it gives."""

    __slots__ = ("requests", "planned", "remaining", "prompt_len", "num_pages", "per_token", "by_debt", "rows")

    def __init__(self, sel, requests: list):
        s, pol = sel.s, sel.pol
        n = len(requests)
        self.requests = requests
        slots = np.fromiter((r.slot for r in requests), np.int64, n)
        debt = s.table.token_debt[slots]
        self.planned = s.table.planned[slots]
        self.prompt_len = np.fromiter((r.prompt_len for r in requests), np.int64, n)
        self.num_pages = np.fromiter((len(r.pages) for r in requests), np.int64, n)
        stop = self.prompt_len.copy()
        for i, r in enumerate(requests):
            for target in r.targets:  # LiveRequest.next_stop
                if target > self.planned[i]:
                    stop[i] = target
                    break
        self.remaining = stop - self.planned  # tokens to the next stop
        per = sel.per_prompt_s
        price = pol.token_fairness * debt / per if per else np.zeros(n)
        chunk = s.contract.prefill_chunk_size
        self.per_token = price / np.maximum(1, np.minimum(self.remaining, chunk))
        # The most indebted first, ties in by_phase order (as sorted(..., reverse=True) keeps them).
        self.by_debt: list[int] = np.argsort(-debt, kind="stable").tolist()
        # Per request, as Python numbers for the loops that build rows one at a time:
        # (request, planned, tokens to the next stop, prompt length, pages held, price per token)
        self.rows = list(zip(requests, self.planned.tolist(), self.remaining.tolist(),
                             self.prompt_len.tolist(), self.num_pages.tolist(), self.per_token.tolist()))

    def chunk(self, i: int, capacity: int, free_pages: int, page_tokens: int, unit: float):
        """Request i's chunk in ``capacity`` tokens, as a row of a multi-row step: (PlanRow,
        value, new pages), or None when its new pages are not free."""
        r, planned, remaining, prompt_len, num_pages, per_token = self.rows[i]
        k = min(capacity, remaining)
        need = max(0, -(-max(planned + k, 1) // page_tokens) - num_pages)  # RequestScheduler.new_pages_needed
        if k <= 0 or need > free_pages:
            return None
        sample = planned + k == prompt_len
        return (PlanRow(r.rid, r.handle, r.epoch, planned, k, sample, -1),
                k * (1.0 + per_token) + (unit if sample else 0.0), need)

    @classmethod
    def of(cls, sel, budget) -> "PrefillColumns":
        if budget.prefill_columns is None:
            budget.prefill_columns = cls(sel, budget.by_phase.get(Phase.PREFILLING, []))
        return budget.prefill_columns


class Prefill(StepKind):
    kind = GraphKind.PREFILL
    name = "prefill"
    phases = (Phase.PREFILLING,)

    def candidates(self, sel, budget):
        cols = PrefillColumns.of(sel, budget)
        out = self.single_chunks(sel, cols, budget.free_pages)
        if len(cols.requests) > 1:
            out.extend(self.cohorts(sel, cols, budget.free_pages))
        return out

    @staticmethod
    def single_chunks(sel, cols: PrefillColumns, free_pages: int) -> list:
        """Each request alone in each one-row PREFILL graph: a chunk up to its next stop. A
        request's larger capacities consuming the same tokens are dominated, and so is every
        capacity past one whose new pages are not free.

        One request's chunks on the same graph differ only in value (the same duration, the
        same decoders left waiting), and selection takes the first of the highest score, so of
        each graph's chunks only the first of the highest value can win. A funded refresh of a
        stale graph takes its first candidate that did not win: the first two stay too. With
        hundreds of prompts waiting this keeps a plan's candidates to a few per graph
        (tools/bench_host.py at concurrency 256 built about a thousand a plan), and the
        columns keep the chunks' arithmetic off a loop over requests and graphs."""
        s, unit = sel.s, sel.pol.output_token_value
        graphs = s.graphs_of(GraphKind.PREFILL)
        n = len(cols.requests)
        if not n or not graphs:
            return []
        tokens = np.empty((n, len(graphs)), np.int64)  # [request, graph] chunk sizes
        valid = np.empty((n, len(graphs)), np.bool_)
        alive = np.ones(n, np.bool_)
        last = np.full(n, -1, np.int64)
        page = s.page_tokens
        for j, g in enumerate(graphs):
            k = np.minimum(g.tokens, cols.remaining)
            alive &= k != last  # larger capacities consume the same tokens: dominated
            last = k
            alive &= np.maximum(0, -(-np.maximum(cols.planned + k, 1) // page) - cols.num_pages) <= free_pages
            tokens[:, j] = k
            valid[:, j] = alive
        sample = cols.planned[:, None] + tokens == cols.prompt_len[:, None]
        value = tokens * (1.0 + cols.per_token[:, None]) + np.where(sample, unit, 0.0)
        order = (np.cumsum(valid.ravel()) - 1).reshape(valid.shape)  # place in request-major order
        kept = set()
        for j in range(len(graphs)):
            rows = np.flatnonzero(valid[:, j])
            if rows.size:
                kept.update((int(order[i, j]), int(i), j) for i in rows[:2])
                best = int(rows[np.argmax(value[rows, j])])  # the first of the highest value
                kept.add((int(order[best, j]), best, j))
        out = []
        for _, i, j in sorted(kept):
            r = cols.requests[i]
            row = PlanRow(r.rid, r.handle, r.epoch, int(cols.planned[i]), int(tokens[i, j]), bool(sample[i, j]), -1)
            out.append((GraphKind.PREFILL, graphs[j], [row], float(value[i, j])))
        return out

    def cohorts(self, sel, cols: PrefillColumns, free_pages: int):
        """Cohort prefill candidates: the most indebted requests first, each row consuming
        what the token capacity allows up to its next stop. A batch capacity that a smaller
        one could hold, or a token capacity consuming the same tokens as a smaller one, is
        dominated and skipped."""
        s, unit, page = sel.s, sel.pol.output_token_value, sel.s.page_tokens
        order = cols.by_debt
        out = []
        last: tuple[int, tuple[int, ...]] | None = None
        for g in s.cohort_prefill_graphs:  # by (batch, tokens)
            if len(order) <= g.batch // 2:
                break  # every larger batch is dominated too
            rows, value, pages = [], 0.0, free_pages
            for i in order[:g.batch]:
                chunk = cols.chunk(i, g.tokens, pages, page, unit)
                if chunk is None:
                    continue
                rows.append(chunk[0])
                value += chunk[1]
                pages -= chunk[2]
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
