"""The learned drafter: a draft core beside the target (``--speculative draft --draft-core DIR``).

A draft core is any exported core with the target's tokenizer, usually a smaller model of its
family. It is loaded as a second model with its own weights, KV page pool, captured graphs and
executor; :class:`DraftProposer` drives it on the model thread when the scheduler asks for
drafts (scheduler/speculation.py) and returns greedy drafts, a point-mass proposal that the
target's verification accepts or rejects losslessly.

The drafter keeps each target slot's history in its own KV, in the slot of the same number:

- a round catches up on the history it has not seen: after a verification that is the bonus
  token (and the last draft when all were accepted), fed through the round's greedy DECODE
  steps; a longer catch-up (the whole prompt the first time) is prefilled first, but for its
  last token. Each later step reads the token the one before it wrote on the device, so the
  steps queue without host round trips;
- after verification the drafter's KV is valid up to the longest common prefix of what it was
  fed and the request's new history: rejected drafts lie past it and are overwritten, as on
  the target;
- its pages come from its own pool; when that runs short, the least recently drafted slots
  not in the round give theirs back (their history is recomputed if they draft again).

Each round's wall time (steady rounds only: no long catch-up) is kept per batch capacity and
depth, so the scheduler weighs a width's drafter time with its verification time.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from ..config import EngineConfig
from ..contract import REC_SLOT, REC_TOKEN0, GraphKind
from ..core.format import Core, load_core
from ..errors import ExecutionError, FrontendError
from ..model.inputs import Inputs
from ..request import SamplingParams
from ..scheduler.speculation import MAX_DEPTH, Proposer

log = logging.getLogger("flare.drafter")

GREEDY = SamplingParams(temperature=0.0)
# On a GPU the drafter's KV gets this share of the free memory (the target, loaded after it,
# takes its kv_memory_fraction of what is left).
DRAFT_KV_FRACTION = 0.08
COST_AGING = 0.8
# Catch-ups of at most this many tokens are fed through the round's DECODE steps; after a
# verification the drafter has seen all but the bonus token, or all but the last draft and the
# bonus token when every draft was accepted.
FEED_TOKENS = 2  # each steady round moves its (batch, depth) cost estimate this far toward the last
_EMPTY = np.zeros(0, np.int64)


def check_compatible(target: Core, draft: Core) -> None:
    """FrontendError unless ``draft`` can draft for ``target``: the same tokenizer (file or
    vocabulary) and a context at least the target's."""
    same_file = target.assets["tokenizer.json"]["sha256"] == draft.assets["tokenizer.json"]["sha256"]
    if not same_file:
        from tokenizers import Tokenizer

        vocab = [Tokenizer.from_file(str(c.asset("tokenizer.json"))).get_vocab(with_added_tokens=True)
                 for c in (target, draft)]
        if vocab[0] != vocab[1]:
            raise FrontendError(f"draft core {draft.identifier} has a different tokenizer from the target "
                                f"{target.identifier}; a draft core must share the target's vocabulary")
    if draft.contract.context < target.contract.context:
        raise FrontendError(f"draft core {draft.identifier} serves {draft.contract.context} tokens of context, "
                            f"less than the target's {target.contract.context}")


def load_drafter(path: str | Path | Core, target: Core, config: EngineConfig, max_active: int,
                 progress=None) -> "DraftProposer":
    """Load a draft core for ``target`` (verified, weights placed, KV sized, graphs captured)."""
    from ..model.loader import load_model

    draft = path if isinstance(path, Core) else load_core(Path(path), progress=progress)
    check_compatible(target, draft)
    if draft.contract.max_active < max_active:
        raise FrontendError(f"draft core {draft.identifier} serves {draft.contract.max_active} active requests, "
                            f"fewer than the target's {max_active}; export it with --max-active {max_active}")
    draft_config = replace(config, max_active=max_active, speculative="none", draft_core="", mixed_prefill=False,
                           kv_memory_fraction=DRAFT_KV_FRACTION)
    if progress:
        progress(f"draft core {draft.identifier}: loading")
    loaded = load_model(draft, draft_config, progress)
    if loaded.device.type == "cuda":
        from ..execution.cuda import make_cuda_executor
        executor = make_cuda_executor(loaded, progress)
    else:
        from ..execution.cpu import CpuExecutor
        executor = CpuExecutor(loaded.programs, name="flare-draft-executor")
    return DraftProposer(loaded.contract, executor, target.recipe.vocab_size)


class DraftProposer(Proposer):
    """Greedy drafts from a draft model's own graphs and KV, one batched round per request set."""

    source = "draft"
    learned = True

    def __init__(self, contract, executor, target_vocab: int):
        self.contract = contract
        self.executor = executor
        self.target_vocab = target_vocab
        self.inputs = Inputs(contract)
        n = contract.max_active + 1
        self.free_pages = list(range(contract.num_pages - 1, -1, -1))
        self.pages: list[list[int]] = [[] for _ in range(n)]
        self.owner = np.zeros(n, np.int64)  # the target request whose history the slot's KV holds
        self.fed: list[np.ndarray] = [_EMPTY] * n  # tokens whose KV is written, by slot
        self.last_used = np.zeros(n, np.int64)  # when each slot last drafted (for eviction), in _uses
        self._uses = 0
        self._cache: dict[int, tuple[int, int, np.ndarray]] = {}  # slot -> (rid, num_out, drafts)
        self.decode = sorted((g for g in contract.graphs if g.kind == GraphKind.DECODE and g.greedy),
                             key=lambda g: g.batch)
        self.prefill = sorted((g for g in contract.graphs if g.kind == GraphKind.PREFILL),
                              key=lambda g: (g.batch, g.tokens))
        self.short = min(g.tokens for g in self.prefill)  # catch-ups up to this share cohort steps
        # rows of the widest cohort PREFILL graph at that capacity
        self.cohort_rows = max(g.batch for g in self.prefill if g.tokens == self.short)
        self.cost_s: dict[tuple[int, int], float] = {}  # (decode batch capacity, depth) -> steady round seconds
        self.evictions = 0  # slots whose drafter KV was given up for another's
        self.failure: BaseException | None = None

    # -- the scheduler's side ----------------------------------------------------

    def cost_s_for(self, rows: int, depth: int) -> float | None:
        """Expected seconds of a steady round for ``rows`` requests at ``depth``; None: unmeasured."""
        if depth <= 0:
            return 0.0
        return self.cost_s.get((self._decode_for(rows).batch, min(depth, MAX_DEPTH)))

    def propose(self, req, out, num_out, depth):
        return self.propose_batch([req], [out], [num_out], [depth])[0]

    def propose_batch(self, reqs, outs, num_outs, depths) -> list[np.ndarray]:
        result = [_EMPTY] * len(reqs)
        todo = []
        for i, (req, num_out, depth) in enumerate(zip(reqs, num_outs, depths)):
            if depth <= 0:
                continue
            cached = self._cache.get(req.slot)
            if cached is not None and cached[0] == req.rid and cached[1] == num_out and len(cached[2]) >= depth:
                result[i] = cached[2][:depth]
            else:
                todo.append(i)
        if not todo or self.failure is not None:
            return result
        depth = min(MAX_DEPTH, max(depths[i] for i in todo))
        rows = []
        # The least recently drafted first: when the pool cannot hold every row, it may take the
        # pages of a row of this round not yet prepared, so requests that always arrive together
        # draft in turn instead of the first one in slot order drafting alone.
        todo.sort(key=lambda i: self.last_used[reqs[i].slot] if self.owner[reqs[i].slot] == reqs[i].rid else 0)
        prepared: set[int] = set()
        for i in todo:
            history = np.concatenate([np.asarray(reqs[i].prompt, np.int64),
                                      np.asarray(outs[i][:num_outs[i]], np.int64)])
            row = self._prepare(reqs[i], history, depth, prepared)
            if row is not None:
                rows.append((i, *row))
                prepared.add(reqs[i].slot)
        if not rows:
            return result
        try:
            drafts = self._run(rows, depth)
        except ExecutionError as exc:  # the drafter is off from here on; the target decodes as before
            self.failure = exc
            log.error("the draft model failed, speculative decoding stops: %s", exc)
            return result
        for (i, slot, history, _), draft in zip(rows, drafts):
            # the drafter's KV now holds the history and every draft but the last
            self.fed[slot] = np.concatenate([history, draft[:-1]])
            draft = draft[:depth]
            bad = np.flatnonzero(draft >= self.target_vocab)  # a larger draft vocabulary's extra ids
            if len(bad):
                draft = draft[:bad[0]]
            self._cache[slot] = (reqs[i].rid, num_outs[i], draft)
            result[i] = draft[:depths[i]]
        return result

    def close(self) -> None:
        self.executor.close()

    # -- one round ---------------------------------------------------------------

    def _prepare(self, req, history: np.ndarray, depth: int, busy: set[int]):
        """Install the slot's state for a round: (slot, history, tokens to catch up), or None
        when its KV does not fit."""
        slot = req.slot
        # positions written: the history, then a draft per step but the last; a row that feeds
        # fewer tokens than another in the round runs up to FEED_TOKENS - 1 steps more
        span = len(history) + depth - 1 + FEED_TOKENS - 1
        if span > self.contract.context:
            return None
        if self.owner[slot] != req.rid:
            self.owner[slot] = req.rid
            self.fed[slot] = _EMPTY
            self._cache.pop(slot, None)
        fed = self.fed[slot]
        n = min(len(fed), len(history) - 1)  # at least the last token is fed again: it samples draft 1
        same = fed[:n] == history[:n]
        valid = n if same.all() else int(np.argmin(same))
        need = -(-span // self.contract.page_tokens) - len(self.pages[slot])
        if need > len(self.free_pages) and not self._evict(need, busy | {slot}):
            return None
        first = len(self.pages[slot])
        new = [self.free_pages.pop() for _ in range(max(0, need))]
        self.pages[slot].extend(new)
        self.inputs.admit_slot(slot, generation=int(req.rid), position=valid, seed=0, params=GREEDY)
        self.inputs.set_pages(slot, first, new)
        self._uses += 1
        self.last_used[slot] = self._uses
        return slot, history, history[valid:]

    def _evict(self, need: int, keep: set[int]) -> bool:
        """Free the pages of the least recently drafted slots outside ``keep`` until ``need``
        pages are free; False when that is not enough."""
        for slot in np.argsort(self.last_used).tolist():
            if len(self.free_pages) >= need:
                break
            if slot in keep or not self.pages[slot]:
                continue
            self.free_pages.extend(self.pages[slot])
            self.pages[slot] = []
            self.evictions += 1
            self.owner[slot] = 0
            self.fed[slot] = _EMPTY
            self._cache.pop(slot, None)
        return len(self.free_pages) >= need

    def _decode_for(self, rows: int):
        return next(g for g in self.decode if g.batch >= rows)

    def _run(self, rows: list, depth: int) -> list[np.ndarray]:
        """Greedy DECODE steps over every row: a row first consumes its catch-up tokens (their
        outputs unused), then each output is a draft and the next step's input. A catch-up longer
        than FEED_TOKENS is prefilled first, all but its last token, without sampling (a PREFILL
        step runs the general sampler: on the H200 a 1B drafter's b1 t64 prefill cost as much as
        three decode steps). -> each row's drafts (``depth``, one more when it fed less than the
        longest feed)."""
        started = time.perf_counter()
        slots = [slot for _, slot, _, _ in rows]
        drafts: dict[int, list[int]] = {slot: [] for slot in slots}
        feed = {slot: catchup if len(catchup) <= FEED_TOKENS else catchup[-1:] for _, slot, _, catchup in rows}
        remaining = {slot: catchup[:-1] for _, slot, _, catchup in rows if len(catchup) > FEED_TOKENS}
        steady = not remaining
        pending: list[tuple[int, list[int]]] = []  # (fence, slots whose output is a draft)

        def submit(graph, sampled):
            while not self.executor.can_submit():
                self._collect(pending, drafts)
            pending.append((self.executor.submit(graph.index, self.inputs.take()), sampled))

        while remaining:
            short = [s for s, c in remaining.items() if len(c) <= self.short]
            group = short[:self.cohort_rows] or [next(iter(remaining))]
            if short:  # several short catch-ups in one cohort step
                g = self._prefill_graph(len(group), self.short)
                pieces = [remaining.pop(s) for s in group]
            else:  # a long catch-up: one chunk of one row
                s = group[0]
                pieces = [remaining[s][:self.contract.prefill_chunk_size]]
                g = self._prefill_graph(1, len(pieces[0]))
                remaining[s] = remaining[s][len(pieces[0]):]
                if not len(remaining[s]):
                    del remaining[s]
            self.inputs.set_rows(group, g.batch)
            for r in range(g.batch):
                self.inputs.set_prefill_row(r, pieces[r] if r < len(pieces) else _EMPTY, False)
            submit(g, [])
        decode = self._decode_for(len(slots))
        longest = max(len(f) for f in feed.values())
        for j in range(longest + depth - 1):
            for s in slots:
                if j < len(feed[s]):
                    self.inputs.set_token(s, int(feed[s][j]))
            self.inputs.set_rows(slots, decode.batch)
            submit(decode, [s for s in slots if j >= len(feed[s]) - 1])
        while pending:
            self._collect(pending, drafts)
        if steady:
            key = (decode.batch, depth)
            took = time.perf_counter() - started
            old = self.cost_s.get(key)
            self.cost_s[key] = took if old is None else COST_AGING * took + (1 - COST_AGING) * old
        return [np.asarray(drafts[s], np.int64) for s in slots]

    def _collect(self, pending: list, drafts: dict) -> None:
        fence, sampled = pending[0]
        done = None
        while done is None:
            done = self.executor.poll(timeout=5.0)
            if done is None and self.executor.outstanding == 0:
                raise ExecutionError(f"draft step {fence} was lost")
        if done.error is not None:
            raise ExecutionError(f"draft step {done.fence} failed: {done.error}")
        pending.pop(0)
        for s in sampled:
            rec = done.records[s]
            if int(rec[REC_SLOT]) != s:
                raise ExecutionError(f"draft step {done.fence}: slot {s}'s record names slot {int(rec[REC_SLOT])}")
            drafts[s].append(int(rec[REC_TOKEN0]))

    def _prefill_graph(self, rows: int, tokens: int):
        return next(g for g in self.prefill if g.batch >= rows and g.tokens >= tokens)


__all__ = ["DraftProposer", "check_compatible", "load_drafter"]
