"""MIXED: the decode cohort and packed prefill chunks in one forward pass.

A mixed candidate carries every decoding request (as DECODE's cohort would) plus up
to the graph's prefill rows of prefilling requests, the most indebted first, each
consuming what is left of the prompt capacity p up to its next stop. Rows are
variable-length: a 2,048-token capacity may hold one request's 2,048 tokens or five
short prompts whole. The decode rows ride on the prefill's weight pass instead of
waiting for it (one prefill-only step used to stall all decoders for its duration),
and the prompt tokens run in GEMMs sized for the GPU's peak.

With no decoding request the candidates are packed prefill alone (the w = 0 graphs).
A decode cohort holding a grammar-constrained request whose previous step is still in
flight rides in no mixed step (its mask is not known before that step completes, and
only DECODE graphs have the held two-part form: docs/architecture.md, Departures); the
candidates are then packed prefill alone, and the decoders take their own step.
"""

from __future__ import annotations

import numpy as np

from ...contract import GraphKind
from ..plan import MixedRows, Phase
from . import prefill
from .base import StepKind
from .decode import Decode


class Mixed(StepKind):
    kind = GraphKind.MIXED
    name = "mixed"
    phases = ()  # it combines the phases PREFILL and DECODE serve (combines, below)
    combines = (GraphKind.PREFILL, GraphKind.DECODE)

    def candidates(self, sel, budget):
        s = sel.s
        graphs = s.mixed_graphs
        prefilling = budget.by_phase.get(Phase.PREFILLING, [])
        if not graphs or not prefilling:
            return []
        t = s.table
        decoding = Decode.cohort_slots(s)
        if len(decoding) and bool(np.any(t.constrained[decoding] & (t.inflight[decoding] > 0))):
            decoding = decoding[:0]  # packed prefill alone; the decoders take their own (held) step
        width = 0
        if len(decoding):
            width = next((w for w in s.mixed_widths if w >= len(decoding)), 0)
            if not width:
                return []
        free_pages = budget.free_pages - int(np.count_nonzero(Decode.pages_needed(s, decoding)))
        if free_pages < 0:
            return []
        decode_rows = Decode.plan_rows(s, decoding)  # column-wise: no per-decoder objects
        decode_value = Decode.value(sel, decoding) if len(decoding) else 0.0
        plain_decoders = bool(t.plain[decoding].all())
        # The decoders would take a decode step anyway: in a mixed step they are credited the
        # decode value of that step's duration, so the step's prompt tokens compete on the time
        # they add, not on the decode step's value rate (which no prefill ever matches).
        decode_ms = 0.0
        if len(decoding):
            general, greedy = s.decode_graph_for[len(decoding)]
            solo = greedy if greedy is not None and plain_decoders else general
            decode_ms = s.timing.estimate_ns(solo.index) * 1e-6
            if not decode_ms:
                # While decoders ride in mixed steps their own graph may never run: any measured
                # decode graph that holds them, else the cheapest mixed step of this width (an
                # overestimate), so the credit still favours the larger prompt capacities.
                cheapest = graphs[width][0]
                fallback = [g for g in s.decode_graphs if g.batch >= len(decoding)]
                fallback += [cheapest, s.mixed_greedy.get((width, cheapest.tokens), cheapest)]
                known = [e for e in (s.timing.estimate_ns(g.index) for g in fallback) if e]
                decode_ms = min(known) * 1e-6 if known else 0.0
        unit, page = sel.pol.output_token_value, s.page_tokens
        cols = prefill.PrefillColumns.of(sel, budget)  # the most indebted first: cols.by_debt
        out = []
        last_work = -1
        budget = sel.pol.mixed_token_budget if len(decoding) else None
        for g in graphs.get(width, ()):  # by prompt capacity
            if budget is not None and g.tokens > budget and g is not graphs[width][0]:
                break
            room, pages, rows, value = g.tokens, free_pages, [], 0.0
            for i in cols.by_debt:
                if room == 0 or len(rows) == g.prefill_rows:
                    break
                chunk = cols.chunk(i, room, pages, page, unit)
                if chunk is None:
                    continue
                row, row_value, need = chunk
                pages -= need
                room -= row.num_tokens
                rows.append(row)
                value += row_value
            work = g.tokens - room
            if not rows or work == last_work:
                continue  # nothing fits, or a smaller capacity consumes the same tokens
            last_work = work
            if plain_decoders and all(t.plain[r.handle.slot] for r in rows if r.sample):
                g = s.mixed_greedy.get((g.width, g.tokens), g)  # argmax sampling for every row
            mixed_ms = s.timing.estimate_ns(g.index) * 1e-6
            credit = mixed_ms / decode_ms if decode_ms and mixed_ms > decode_ms else 1.0
            out.append((GraphKind.MIXED, g, MixedRows(decode_rows, rows), decode_value * credit + value))
        return out

    # The decode rows commit column-wise (RequestScheduler._commit_mixed, as DECODE's); the
    # prefill rows as PREFILL's.
    def mapped_positions(self, view, row, req):
        return prefill.STEP.mapped_positions(view, row, req)

    def commit_row(self, view, row, req, fence, now):
        return prefill.STEP.commit_row(view, row, req, fence, now)


STEP = Mixed()
