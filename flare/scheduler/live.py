"""LiveRequest and the SlotTable behind its hot counters.

The counters a decode step touches for every request (positions, generated
counts, epochs, in-flight steps, fairness debts, output tokens) live in
per-slot NumPy arrays, so commit and completion of a 64-request decode are a
handful of vectorized operations. A LiveRequest reads and writes them through
properties once it holds a slot; its cold state (prompt, history, checkpoint
chain, page list) stays on the object.
"""

from __future__ import annotations

import numpy as np

from ..cache import PrefixHistory
from ..request import SamplingParams
from .plan import Ended, Handle, Phase


class SlotTable:
    """Hot per-slot state; row 0 is the padding slot and never used."""

    def __init__(self, max_active: int, max_outputs: int):
        n = max_active + 1
        self.rid = np.zeros(n, np.int64)
        self.generation = np.zeros(n, np.int64)
        self.epoch = np.zeros(n, np.int64)
        self.phase = np.full(n, int(Phase.RETIRED), np.int64)
        self.planned = np.zeros(n, np.int64)  # device position after every committed step
        self.planned_gen = np.zeros(n, np.int64)  # generated tokens after every committed step
        self.consumed = np.zeros(n, np.int64)  # confirmed by completions
        self.generated = np.zeros(n, np.int64)
        self.inflight = np.zeros(n, np.int64)  # committed steps not yet completed
        self.last_fence = np.zeros(n, np.int64)
        self.num_pages = np.zeros(n, np.int64)  # page-table entries assigned
        self.limit = np.zeros(n, np.int64)  # most output tokens: min(max_tokens, context - prompt)
        self.ended = np.zeros(n, np.bool_)
        # Ended on the host (finish(): a stop string) while steps were in flight: their
        # sampled tokens are still recorded, unemitted, since the terminal checkpoint
        # covers every token those steps consumed.
        self.records_after_end = np.zeros(n, np.bool_)
        self.ignore_eos = np.zeros(n, np.bool_)
        self.has_stop_ids = np.zeros(n, np.bool_)  # request-specific stop_token_ids
        self.plain = np.zeros(n, np.bool_)  # greedy without logprobs: may use greedy decode graphs
        self.constrained = np.zeros(n, np.bool_)  # structured output: each sample waits for its mask
        # speculative decoding: the request may speculate (no grammar, logprobs or penalties), and
        # a SPECULATIVE step of it is in flight (its planned counters are an upper bound until then)
        self.speculable = np.zeros(n, np.bool_)
        self.spec_inflight = np.zeros(n, np.bool_)
        self.gen_base = np.zeros(n, np.int64)  # a preempted request's continuation: tokens sampled before
        self.token_debt = np.zeros(n, np.float64)
        self.delivery_debt = np.zeros(n, np.float64)
        self.last_progress = np.zeros(n, np.float64)
        self.num_out = np.zeros(n, np.int64)  # recorded output tokens (emitted, then any after a host end)
        self.out = np.zeros((n, max(1, max_outputs)), np.int32)

    def reported_generated(self, slots: np.ndarray) -> np.ndarray:
        """The cumulative generated count the rows' records report after every committed step:
        a continuation's device counter starts at the tokens its request sampled before."""
        return self.planned_gen[slots] + self.gen_base[slots]

    def reset(self, slot: int) -> None:
        for name in ("rid", "generation", "planned", "planned_gen", "consumed", "generated", "inflight",
                     "last_fence", "num_pages", "limit", "num_out", "gen_base"):
            getattr(self, name)[slot] = 0
        self.ended[slot] = self.records_after_end[slot] = False
        self.ignore_eos[slot] = self.has_stop_ids[slot] = self.plain[slot] = self.constrained[slot] = False
        self.speculable[slot] = self.spec_inflight[slot] = False
        self.token_debt[slot] = self.delivery_debt[slot] = 0.0
        self.phase[slot] = int(Phase.RETIRED)


_PHASES = tuple(Phase)  # by value: the values are 0..n-1
assert all(p.value == i for i, p in enumerate(_PHASES))


def _hot(name: str, kind=int):
    """A property stored in SlotTable.<name>[slot] once the request holds a slot."""

    def get(self):
        return kind(getattr(self.table, name)[self.slot]) if self.slot else kind(self._cold.get(name, 0))

    def put(self, value):
        if self.slot:
            getattr(self.table, name)[self.slot] = value
        else:
            self._cold[name] = value

    return property(get, put)


class LiveRequest:
    def __init__(self, rid: int, prompt: np.ndarray, endpoints: tuple[int, ...], params: SamplingParams,
                 seed: int, arrival: float, stop_ids: frozenset[int], table: SlotTable):
        self.rid = rid
        self.prompt = prompt  # int32 [L]
        self.endpoints = endpoints  # complete-message token endpoints inside the prompt
        self.params = params
        self.seed = seed
        self.arrival = arrival
        self.stop_ids = stop_ids  # EOS (unless ignore_eos) and stop_token_ids
        self.table = table
        self.slot = 0  # 0 while queued
        self._cold: dict = {"phase": int(Phase.QUEUED)}
        self.handle: Handle | None = None
        self.history: PrefixHistory | None = None
        self.reused = 0  # prompt tokens reused from the cache at admission
        self.tip: int | None = None  # the pinned checkpoint at the end of this request's chain
        self.tip_endpoint = 0
        self.pages: list[int] = []  # logical page IDs by page index
        self.private_from = 0  # pages[i] for i >= private_from belong to this request
        self.kept_pages: list[int] = []  # private pages below private_from (see publish_snapshot)
        self.uploaded_pages = 0  # page-table entries already uploaded
        self.page_budget = 0  # pages still reserved for this request
        self.targets: list[int] = []  # checkpoint endpoints still to capture
        self.target_rows: list[int] = []  # their reserved snapshot rows
        self.terminal_row = -1  # snapshot row reserved for a terminal capture
        self.terminal_fence = 0  # the fence that makes the published terminal checkpoint visible
        self.snapshot_due = -1  # endpoint whose snapshot is the next step (SNAPSHOTTING)
        self.ended: Ended | None = None
        self.cancelled = False
        self.finished_at = 0.0
        # Preemption: a continuation (prompt = the preempted request's prompt and outputs) starts
        # its device counters at gen_base; base_outputs are those outputs (for penalty counts).
        self.gen_base = 0
        self.base_outputs: np.ndarray | None = None
        self.preempted = False
        self.last_output: float | None = None
        self.speculation: dict | None = None  # proposal source -> AcceptanceStats (scheduler/speculation.py)

    planned = _hot("planned")
    planned_generated = _hot("planned_gen")
    consumed = _hot("consumed")
    generated = _hot("generated")
    inflight = _hot("inflight")
    last_fence = _hot("last_fence")
    epoch = _hot("epoch")
    token_debt = _hot("token_debt", float)
    delivery_debt = _hot("delivery_debt", float)
    last_progress = _hot("last_progress", float)

    @property
    def phase(self) -> Phase:
        # a tuple index, not Phase(value): the enum call was 6% of the model thread at 256 live
        return _PHASES[self.table.phase[self.slot] if self.slot else self._cold["phase"]]

    @phase.setter
    def phase(self, value: Phase) -> None:
        if self.slot:
            self.table.phase[self.slot] = int(value)
        else:
            self._cold["phase"] = int(value)

    def attach(self, slot: int, generation: int, context: int, now: float) -> None:
        """Take a slot: move the request's state into its SlotTable row."""
        t = self.table
        t.reset(slot)
        self.slot = slot
        self.handle = Handle(slot, generation)
        t.rid[slot] = self.rid
        t.generation[slot] = generation
        t.phase[slot] = self._cold["phase"]
        t.limit[slot] = min(self.params.max_tokens, context - self.prompt_len)
        t.ignore_eos[slot] = self.params.ignore_eos
        t.has_stop_ids[slot] = bool(self.params.stop_token_ids)
        t.plain[slot] = self.params.is_greedy and not self.params.logprobs
        t.constrained[slot] = self.params.grammar is not None
        p = self.params
        t.speculable[slot] = (p.grammar is None and not p.logprobs and p.presence_penalty == 0
                              and p.frequency_penalty == 0 and p.repetition_penalty == 1)
        t.gen_base[slot] = self.gen_base
        t.last_progress[slot] = now

    def detach(self) -> None:
        """Give the slot row back (after retirement); the object keeps its cold state."""
        self._cold.update(phase=int(self.phase), planned=self.planned, planned_gen=self.planned_generated,
                          consumed=self.consumed, generated=self.generated, epoch=self.epoch)
        self._cold["sampled"] = self.sampled
        self.table.reset(self.slot)
        self.slot = 0

    @property
    def sampled(self) -> list[int]:
        """Recorded output tokens: every emitted one, then those of steps in flight at a host end."""
        if not self.slot:
            return list(self._cold.get("sampled", ()))
        return self.table.out[self.slot, :self.table.num_out[self.slot]].tolist()

    @property
    def prompt_len(self) -> int:
        return int(self.prompt.shape[0])

    @property
    def max_tokens(self) -> int:
        return self.params.max_tokens

    @property
    def next_stop(self) -> int:
        """Where the current prefill chunk must end: the next target or the prompt end."""
        planned = self.planned
        for t in self.targets:
            if t > planned:
                return t
        return self.prompt_len

    @property
    def is_decodable(self) -> bool:
        return (self.phase == Phase.DECODING and self.ended is None
                and self.planned_generated < self.max_tokens)

    def bump(self) -> None:
        self.epoch = self.epoch + 1
