"""FakeExecutor: the executor interface over a model-free program interpreter.

For scheduler tests and host-overhead benchmarks (no torch). It applies uploads
to host copies of the contract's buffers and runs each graph kind with the
same record semantics as the real step programs, using a toy "model" that
still depends on the paged KV contents: a token written at position p lands in
page ``page_table[p // 64]`` offset ``p % 64``, and a sampled token is a hash
of every token read back through the page table. Wrong page tables, missing
restores or replayed positions therefore change the tokens, just as they
would with a real model. Snapshot rows hold a copy of the tail page and the
position, so restores are checked too.

Completions are produced synchronously at submit (``poll`` returns them in
order) unless ``manual=True``, in which case :meth:`step` releases them, or a
``device_time`` cost model is given: then a simulated device runs the graphs
back to back in submission order, each for ``device_time(graph)`` seconds of
wall time, and ``poll`` releases a completion only once the device has finished
it. A host pipeline that submits late leaves the simulated device idle, exactly
as it would a GPU, so host overhead can be measured without one
(tools/bench_host.py).

A ``sample`` callable replaces the toy model's token choice: it gets the slot's
consumed history (int64, the tokens read back through the page table) and returns
the next token; an ExecutionError it raises becomes that step's error completion
(the executor is poisoned, as after a device fault). Sampled rows also get
deterministic logprobs (:func:`toy_logprobs`) so the runtime's logprob path runs.
"""

from __future__ import annotations

import collections
import functools
import time
from typing import Callable, Sequence

import numpy as np

from ..contract import (
    REC_CONSUMED,
    REC_FLAG_PARTICIPATED,
    REC_FLAG_SAMPLED,
    REC_FLAGS,
    REC_GENERATED,
    REC_GENERATION,
    REC_KIND,
    REC_NEW_TOKENS,
    REC_SLOT,
    REC_TOKEN0,
    RECORD_FIELDS,
    GraphKind,
    GraphSpec,
    PreparedContract,
    Upload,
)
from ..errors import ExecutionError
from ..execution.base import FRAMES, ExecutionCompletion, FenceTimeline, check_release, check_submission

_MIX = np.uint64(0x9E3779B97F4A7C15)


def toy_token(history: np.ndarray, vocab: int, salt: int = 0) -> int:
    """A deterministic function of the whole consumed history (FNV-style)."""
    h = 1469598103934665603 ^ salt
    for t in history.tolist():
        h = ((h ^ (t + 1)) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return int(h % vocab)


def toy_logprobs(token: int, num_top: int, vocab: int, out: tuple[np.ndarray, np.ndarray] | None = None
                 ) -> tuple[np.ndarray, np.ndarray]:
    """``(logprobs [1 + num_top], top_ids [num_top])`` for a sampled token: the chosen token's
    logprob first, then the alternatives, the chosen token among them with its own value.
    ``out`` (a float32 and an int64 row) receives them in place: the simulated device's
    sampling runs on the model thread, so it should cost that thread little."""
    values, ids = out if out is not None else (np.empty(1 + num_top, np.float32), np.empty(num_top, np.int64))
    chosen = -0.125 * (token % 8)  # multiples of 1/8 and 1/2: exact in float32
    values[0] = chosen
    np.subtract(chosen, _half_steps(num_top), out=values[1:])
    np.add(_steps(num_top), token, out=ids)
    np.remainder(ids, vocab, out=ids)
    return values, ids


@functools.cache
def _steps(n: int) -> np.ndarray:
    return np.arange(n, dtype=np.int64)


@functools.cache
def _half_steps(n: int) -> np.ndarray:
    return (0.5 * np.arange(n)).astype(np.float32)


class FakeExecutor(FenceTimeline):
    def __init__(self, contract: PreparedContract, *, duration_ns: int = 1_000_000, manual: bool = False,
                 eos_token: int | None = None, eos_every: int = 0, read_history: bool = True,
                 device_time: Callable[[GraphSpec], float] | None = None,
                 sample: Callable[[np.ndarray], int] | None = None):
        if manual and device_time is not None:
            raise ValueError("manual and device_time are exclusive")
        self.contract = contract
        self.sample = sample  # None: toy_token over the history (or slot and position)
        self.device_time = device_time
        self._device_free = 0.0  # perf_counter time at which the simulated device goes idle
        self._finish_at: collections.deque[float] = collections.deque()
        # False: tokens depend only on (slot, position), for host-overhead benchmarks
        self.read_history = read_history
        self.duration_ns = duration_ns
        self.manual = manual
        self.eos_token = eos_token
        self.eos_every = eos_every  # every n-th generated token is EOS (0: never)
        self.buffers = {b.name: np.zeros(b.shape, dtype=b.dtype) for b in contract.buffers()
                        if b.role in ("slot", "step")}
        s1 = contract.max_active + 1
        self.kv = np.full((contract.num_pages + 1, contract.page_tokens), -1, dtype=np.int64)
        self.snap_page = np.full((contract.num_snapshot_rows + 1, contract.page_tokens), -1, dtype=np.int64)
        self.snap_length = np.zeros(contract.num_snapshot_rows + 1, dtype=np.int64)
        self.records = np.zeros((s1, RECORD_FIELDS), dtype=np.int64)
        self.logprobs = np.zeros((s1, 1 + contract.top_logprobs), dtype=np.float32)
        self.top_ids = np.zeros((s1, contract.top_logprobs), dtype=np.int64)
        self._queue: collections.deque[ExecutionCompletion] = collections.deque()
        self._ready = 0
        self._next_fence = 1
        self._completed_fence = 0
        self.poison: BaseException | None = None
        self.fail_at_fence: int | None = None
        self.submissions: list[tuple[int, GraphKind, int]] = []  # (fence, kind, upload bytes)
        self.closed = False
        self._held: tuple | None = None  # (fence, graph index, uploads) of a held step

    @property
    def graph_estimates_ns(self) -> tuple[int, ...]:
        """The simulated device's cost of each graph, as the CUDA executor times its graphs at load."""
        if self.device_time is None:
            return ()
        return tuple(int(self.device_time(g) * 1e9) for g in self.contract.graphs)

    @property
    def outstanding(self) -> int:
        return len(self._queue) + (self._held is not None)

    def can_submit(self) -> bool:
        return self.outstanding < FRAMES and self.poison is None and not self.closed and self._held is None

    def submit(self, graph_index: int, uploads: Sequence[Upload], grammar_constrained: bool = False) -> int:
        """Run one graph now; returns its fence. A grammar-constrained step is held, as on the
        other executors: it runs at ``release``, and nothing else is submitted before."""
        check_submission(poison=self.poison, closed=self.closed, held_fence=self._held[0] if self._held else 0,
                         window_full=self.outstanding >= FRAMES)
        fence = self._next_fence
        self._next_fence += 1
        if grammar_constrained:
            self._held = (fence, graph_index, list(uploads))
            return fence
        self._execute(fence, graph_index, uploads)
        return fence

    def release(self, fence: int, uploads: Sequence[Upload]) -> None:
        check_release(poison=self.poison, closed=self.closed, held_fence=self._held[0] if self._held else 0,
                      fence=fence, uploads=uploads)
        _, graph_index, staged = self._held
        self._held = None
        self._execute(fence, graph_index, [*staged, *uploads])

    def _execute(self, fence: int, graph_index: int, uploads: Sequence[Upload]) -> None:
        graph = self.contract.graphs[graph_index]
        size = 0
        for name, offset, data in uploads:
            view = self.buffers[name].reshape(-1).view(np.uint8)
            raw = np.frombuffer(bytes(data), dtype=np.uint8)
            view[offset:offset + raw.size] = raw
            size += raw.size
        self.submissions.append((fence, graph.kind, size))
        submitted = time.perf_counter()  # the simulated device starts here: _run is its work, not the host's
        error = None
        if self.fail_at_fence == fence:
            error = ExecutionError(f"injected failure at fence {fence}")
            self.poison = error
        else:
            try:
                self._run(graph)
            except ExecutionError as exc:  # from the sample hook: this step failed on the "device"
                error = exc
                self.poison = exc
        duration_ns = self.duration_ns
        if self.device_time is not None:
            cost = self.device_time(graph)
            self._device_free = max(submitted, self._device_free) + cost
            self._finish_at.append(self._device_free)
            duration_ns = int(cost * 1e9)
        self._queue.append(ExecutionCompletion(fence, graph_index, self.records.copy(), self.logprobs.copy(),
                                               self.top_ids.copy(), duration_ns, error))
        if not self.manual and self.device_time is None:
            self._ready = len(self._queue)

    def step(self, count: int = 1) -> None:
        """Manual mode: let the next ``count`` submissions complete."""
        self._ready = min(len(self._queue), self._ready + count)

    def poll(self, timeout: float = 0.0) -> ExecutionCompletion | None:
        if self._finish_at:  # the simulated device: the oldest graph finishes at _finish_at[0]
            wait = self._finish_at[0] - time.perf_counter()
            if wait > 0 and timeout:
                time.sleep(min(wait, timeout))
                wait = self._finish_at[0] - time.perf_counter()
            if wait > 0:
                return None  # the timeout was spent waiting on the device
            self._finish_at.popleft()
            self._ready += 1
        if not self._ready:
            if timeout:
                time.sleep(min(timeout, 0.001))
            return None
        self._ready -= 1
        done = self._queue.popleft()
        self._completed_fence = done.fence
        return done

    def close(self) -> None:
        self.closed = True

    # -- toy programs ----------------------------------------------------------

    def _history(self, slot: int, length: int) -> np.ndarray:
        table = self.buffers["slot.page_table"][slot]
        p = self.contract.page_tokens
        pos = np.arange(length)
        return self.kv[table[pos // p], pos % p]

    def _write(self, slot: int, position: int, token: int) -> None:
        p = self.contract.page_tokens
        page = self.buffers["slot.page_table"][slot][position // p]
        self.kv[page, position % p] = token

    def _sample(self, slot: int) -> None:
        b = self.buffers
        length = int(b["slot.position"][slot])
        if self.sample is not None:
            token = int(self.sample(self._history(slot, length)))
        elif self.read_history:
            token = toy_token(self._history(slot, length), self.contract.vocab_size, int(b["slot.seed"][slot]))
        else:
            token = (length * 31 + slot) % self.contract.vocab_size
        b["slot.generated"][slot] += 1
        if self.eos_token is not None and self.eos_every and b["slot.generated"][slot] % self.eos_every == 0:
            token = self.eos_token
        b["slot.token"][slot] = token
        toy_logprobs(token, self.contract.top_logprobs, self.contract.vocab_size,
                     out=(self.logprobs[slot], self.top_ids[slot]))

    def _record(self, slot: int, kind: GraphKind, sampled: bool) -> None:
        b = self.buffers
        rec = self.records[slot]
        rec[:] = 0
        rec[REC_SLOT] = slot
        rec[REC_GENERATION] = b["slot.generation"][slot]
        rec[REC_CONSUMED] = b["slot.position"][slot]
        rec[REC_GENERATED] = b["slot.generated"][slot]
        rec[REC_KIND] = int(kind)
        rec[REC_NEW_TOKENS] = int(sampled)
        rec[REC_FLAGS] = REC_FLAG_PARTICIPATED | (REC_FLAG_SAMPLED if sampled else 0)
        rec[REC_TOKEN0] = b["slot.token"][slot]

    def _run(self, graph) -> None:
        b = self.buffers
        p = self.contract.page_tokens
        rows = [int(s) for s in b["step.slots"][:graph.batch]]
        packed = b["step.tokens"].reshape(-1)
        at = 0  # MIXED: the next prefill row's first flat token
        for i, slot in enumerate(rows):
            kind = graph.kind
            if kind == GraphKind.MIXED and i >= graph.width:
                n = int(b["step.num_tokens"][i])
                start, at = at, at + n
            if slot == 0:
                continue
            sampled = False
            if kind == GraphKind.MIXED:
                if i < graph.width:  # a decode row
                    pos = int(b["slot.position"][slot])
                    self._write(slot, pos, int(b["slot.token"][slot]))
                    b["slot.position"][slot] = pos + 1
                    self._sample(slot)
                    sampled = True
                else:
                    pos = int(b["slot.position"][slot])
                    for j in range(n):
                        self._write(slot, pos + j, int(packed[start + j]))
                    b["slot.position"][slot] = pos + n
                    if b["step.sample"][i]:
                        self._sample(slot)
                        sampled = True
            elif kind == GraphKind.PREFILL:
                n = int(b["step.num_tokens"][i])
                pos = int(b["slot.position"][slot])
                for j in range(n):
                    self._write(slot, pos + j, int(b["step.tokens"][i, j]))
                b["slot.position"][slot] = pos + n
                if b["step.sample"][i]:
                    self._sample(slot)
                    sampled = True
            elif kind == GraphKind.DECODE:
                pos = int(b["slot.position"][slot])
                self._write(slot, pos, int(b["slot.token"][slot]))
                b["slot.position"][slot] = pos + 1
                self._sample(slot)
                sampled = True
            elif kind == GraphKind.SNAPSHOT:
                row = int(b["step.snapshot_rows"][i])
                length = int(b["slot.position"][slot])
                page = b["slot.page_table"][slot][length // p]
                self.snap_page[row] = self.kv[page]
                self.snap_length[row] = length
            elif kind == GraphKind.RESTORE:
                row = int(b["step.snapshot_rows"][i])
                length = int(self.snap_length[row])
                page = b["slot.page_table"][slot][length // p]
                self.kv[page] = self.snap_page[row]
                b["slot.position"][slot] = length
            elif kind == GraphKind.RESUME:
                self._sample(slot)
                sampled = True
            self._record(slot, kind, sampled)
