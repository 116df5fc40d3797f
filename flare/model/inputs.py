"""Inputs: host mirrors of the contract's input buffers and the uploads they need.

Every write goes through a host mirror of the device buffer and records the
byte range that changed; ``take()`` hands those ranges to the executor with the
next submission. Writes that leave the mirror unchanged upload nothing, so a
decode step that repeats the previous cohort uploads no bytes at all, and a
growing request uploads only its newly assigned page-table entries.

NOTE: the mirror equals the device contents only because every upload is made
through one Inputs object, in submission order, and only for buffers programs
never write. Programs advance slot.position/generated/token on the device, so
writes to those are always uploaded.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..contract import (
    SAMPLING_COLUMNS,
    SAMPLING_FREQUENCY,
    SAMPLING_GRAMMAR,
    SAMPLING_LOGPROBS,
    SAMPLING_MIN_P,
    SAMPLING_PRESENCE,
    SAMPLING_REPETITION,
    SAMPLING_TEMPERATURE,
    SAMPLING_TOP_K,
    SAMPLING_TOP_P,
    PreparedContract,
    Upload,
)


def sampling_row(params) -> np.ndarray:
    """The float32 sampling-parameter row for a :class:`flare.request.SamplingParams`."""
    row = np.zeros(SAMPLING_COLUMNS, dtype=np.float32)
    row[SAMPLING_TEMPERATURE] = params.temperature
    row[SAMPLING_TOP_P] = params.top_p
    row[SAMPLING_TOP_K] = params.top_k
    row[SAMPLING_MIN_P] = params.min_p
    row[SAMPLING_PRESENCE] = params.presence_penalty
    row[SAMPLING_FREQUENCY] = params.frequency_penalty
    row[SAMPLING_REPETITION] = params.repetition_penalty
    row[SAMPLING_GRAMMAR] = params.grammar is not None
    row[SAMPLING_LOGPROBS] = bool(params.logprobs)
    return row


# Slot buffers the step programs advance on the device: the mirror is stale for them.
DEVICE_WRITTEN = frozenset({"slot.position", "slot.generated", "slot.token"})


class Inputs:
    """Packs admission, state and forward inputs into uploads."""

    def __init__(self, contract: PreparedContract):
        self.contract = contract
        self.mirror: dict[str, np.ndarray] = {
            b.name: np.zeros(b.shape, dtype=b.dtype) for b in contract.buffers() if b.role in ("slot", "step")
        }
        self._uploads: list[Upload] = []
        self.uploaded_bytes = 0  # lifetime total, for tests and metrics

    def _write(self, name: str, index: tuple | int | slice, values, changed: bool = False,
               flat: bool = False) -> None:
        """Assign mirror[name][index] = values; queue the changed contiguous byte range
        (``changed``: the caller already compared them with the mirror; ``flat``: ``index``
        addresses the flattened buffer)."""
        array = self.mirror[name].reshape(-1) if flat else self.mirror[name]
        new = np.asarray(values, dtype=array.dtype)
        if not changed and name not in DEVICE_WRITTEN and np.array_equal(
                np.broadcast_to(new, np.shape(array[index])), array[index]):
            return
        array[index] = new
        # the written region is a contiguous run of the flattened buffer
        flat_start, flat_stop = _flat_extent(array, index)
        item = array.itemsize
        data = array.reshape(-1)[flat_start:flat_stop].tobytes()
        self._uploads.append((name, flat_start * item, data))
        self.uploaded_bytes += len(data)

    def take(self) -> list[Upload]:
        uploads, self._uploads = self._uploads, []
        return uploads

    # -- slot state ------------------------------------------------------------

    def admit_slot(self, slot: int, *, generation: int, position: int, seed: int, params, generated: int = 0) -> None:
        """Install a new request's state row (position = reused prefix length; generated: the
        sampled-token count a preempted request's continuation resumes its RNG stream at)."""
        self._write("slot.generation", slot, generation)
        self._write("slot.position", slot, position)
        self._write("slot.generated", slot, generated)
        self._write("slot.seed", slot, seed)
        self._write("slot.sampling", slot, sampling_row(params))

    def set_token(self, slot: int, token: int) -> None:
        """The token a slot's next DECODE step consumes (in place of the one it last sampled)."""
        self._write("slot.token", slot, token)

    def set_pages(self, slot: int, first: int, logical_pages: Sequence[int]) -> None:
        """Assign logical pages to page-table entries first, first+1, ... of a slot."""
        if len(logical_pages):
            physical = np.asarray(logical_pages, dtype=np.int64) + 1
            self._write("slot.page_table", (slot, slice(first, first + len(physical))), physical)

    def set_grammar_masks(self, slots: Sequence[int], masks: Sequence[np.ndarray]) -> None:
        """Constrained slots' allowed next tokens; only the rows that changed are uploaded
        (one vectorized comparison for the batch: inside a JSON string most rows repeat)."""
        if not slots:
            return
        mirror = self.mirror["slot.grammar_mask"]
        rows = np.stack(masks)
        index = np.asarray(slots, dtype=np.int64)
        changed = np.flatnonzero((mirror[index] != rows).any(axis=1))
        for i in changed.tolist():
            self._write("slot.grammar_mask", int(index[i]), rows[i], changed=True)

    # -- step inputs -----------------------------------------------------------

    def set_rows(self, slots: Sequence[int], capacity: int) -> None:
        """step.slots[:capacity] = slots padded with slot 0."""
        row = np.zeros(capacity, dtype=np.int64)
        row[:len(slots)] = slots
        self._write("step.slots", slice(0, capacity), row)

    def set_prefill_row(self, row: int, tokens: np.ndarray, sample: bool) -> None:
        n = len(tokens)
        self._write("step.tokens", (row, slice(0, n)), tokens)
        self._write("step.num_tokens", row, n)
        self._write("step.sample", row, int(sample))

    def set_packed_prefill(self, first_row: int, rows: Sequence[tuple[np.ndarray, bool]], capacity: int) -> None:
        """A MIXED step's prefill rows: their tokens back to back from the start of the
        flattened step.tokens, each row's count and sample flag at step rows first_row..;
        rows up to ``capacity`` are padding (no tokens, no sample)."""
        tokens = np.concatenate([t for t, _ in rows]) if rows else _NO_TOKENS
        if len(tokens):
            self._write("step.tokens", slice(0, len(tokens)), tokens, flat=True)
        counts = np.zeros(capacity, np.int64)
        sample = np.zeros(capacity, np.int64)
        for j, (t, s) in enumerate(rows):
            counts[j], sample[j] = len(t), int(s)
        self._write("step.num_tokens", slice(first_row, first_row + capacity), counts)
        self._write("step.sample", slice(first_row, first_row + capacity), sample)

    def set_drafts(self, drafts: Sequence[np.ndarray], capacity: int) -> None:
        """A SPECULATIVE step's drafts: row i's tokens in step.tokens[i, :d] and d in
        step.num_tokens[i]; rows up to ``capacity`` are padding (no drafts)."""
        counts = np.zeros(capacity, np.int64)
        for i, draft in enumerate(drafts):
            counts[i] = len(draft)
            if len(draft):
                self._write("step.tokens", (i, slice(0, len(draft))), draft)
        self._write("step.num_tokens", slice(0, capacity), counts)

    def set_snapshot_rows(self, rows: Sequence[int], capacity: int) -> None:
        """Logical snapshot IDs -> physical rows (id + 1); padding uses scratch row 0."""
        row = np.zeros(capacity, dtype=np.int64)
        row[:len(rows)] = np.asarray(rows, dtype=np.int64) + 1
        self._write("step.snapshot_rows", slice(0, capacity), row)

    def set_prompt(self, tokens: np.ndarray | None, outputs: np.ndarray | None = None) -> None:
        """Prompt tokens whose repetition penalty the INITIALIZE program marks (None: none),
        and output tokens it counts (a preempted request's continuation), after them."""
        n = 0 if tokens is None else len(tokens)
        m = 0 if outputs is None else len(outputs)
        if n:
            self._write("step.prompt", slice(0, n), tokens)
        if m:
            self._write("step.prompt", slice(n, n + m), outputs)
        self._write("step.prompt_len", 0, n)
        self._write("step.output_len", 0, m)


def _flat_extent(array: np.ndarray, index) -> tuple[int, int]:
    """[start, stop) of an index's region in the flattened C-contiguous array.

    Supports the forms Inputs uses: ``i``, ``slice(a, b)`` and ``(i, slice(a, b))``.
    """
    row = array.size // array.shape[0] if array.ndim else 1
    if isinstance(index, tuple):
        i, cols = index
        start, stop, _ = cols.indices(row)
        return i * row + start, i * row + stop
    if isinstance(index, slice):
        start, stop, _ = index.indices(array.shape[0])
        return start * row, stop * row
    return index * row, (index + 1) * row


_NO_TOKENS = np.zeros(0, dtype=np.int64)


def pack_step(inputs: Inputs, step) -> list[Upload]:
    """Pack a :class:`flare.scheduler.plan.CommittedStep` into uploads for its graph."""
    from ..contract import GraphKind

    plan = step.plan
    kind = plan.kind
    cols = plan.cols
    if kind != GraphKind.DECODE:
        first = None
        for slot, generation, (_, admission) in zip(cols.slots, cols.generations, step.extras):
            if admission is not None:
                inputs.admit_slot(int(slot), generation=int(generation), position=admission.position,
                                  seed=admission.seed, params=admission.params, generated=admission.generated)
                if first is None:
                    first = admission
                elif admission.penalty_prompt is not None or admission.penalty_outputs is not None:
                    raise ValueError("an INITIALIZE step marks the penalty tokens of its first row only")
        if first is not None:  # the marks of the first row, or none (a step's buffers persist)
            inputs.set_prompt(first.penalty_prompt, first.penalty_outputs)
    for upload in step.page_uploads:
        inputs.set_pages(upload.slot, upload.first, upload.pages)
    if kind == GraphKind.MIXED:
        # decode rows from 0, prefill rows from the graph's decode width
        d, w = plan.decode_rows, plan.width
        slots = np.zeros(plan.batch, np.int64)
        slots[:d] = cols.slots[:d]
        slots[w:w + len(cols) - d] = cols.slots[d:]
        inputs.set_rows(slots, plan.batch)
        inputs.set_packed_prefill(w, [(tokens, bool(sample)) for (tokens, _), sample
                                      in zip(step.extras[d:], cols.sample[d:])], plan.batch - w)
        return inputs.take()
    inputs.set_rows(cols.slots, plan.batch)
    if kind == GraphKind.PREFILL:
        for i, (tokens, _) in enumerate(step.extras):
            inputs.set_prefill_row(i, tokens, bool(cols.sample[i]))
        for i in range(len(step.extras), plan.batch):  # padding rows consume and sample nothing
            inputs.set_prefill_row(i, _NO_TOKENS, False)
    elif kind in (GraphKind.SNAPSHOT, GraphKind.RESTORE):
        inputs.set_snapshot_rows(cols.snapshot, plan.batch)
    elif kind == GraphKind.SPECULATIVE:
        inputs.set_drafts(plan.drafts, plan.batch)
    return inputs.take()
