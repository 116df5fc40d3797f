"""The executor interface shared by the CPU and CUDA backends.

An executor runs a prepared contract's graphs in submission order with at
most ``FRAMES`` (4) submissions in flight, each in its own frame (the window;
the scheduler keeps at most two steps that decode or prefill in it, and small
steps take the frames left: flare.contract.FRAMES):

- ``can_submit()`` is true while a frame is free; ``next_fence`` is the fence
  the next submission will carry (fences are a single monotonic timeline).
- ``submit(graph_index, uploads, grammar_constrained=False)`` copies each ``(buffer, byte_offset, data)``
  range into a free host frame, then (asynchronously) uploads the ranges and
  runs the graph. Buffers not named keep their device contents.
- A grammar-constrained submission is *held*: its sampling waits for
  ``release(fence, uploads)``, which brings the token masks that depend on the
  previous step's tokens. A DECODE step's forward part runs meanwhile (on the
  CUDA and CPU executors), so the host computes the masks while the device
  computes the logits. Nothing else is submitted while a step is held, and a
  held step completes only after its release.
- ``poll(timeout)`` returns the next :class:`ExecutionCompletion` in fence order
  once its outputs are back on the host, then frees that frame.
- A failure poisons the executor: later submits raise, ``poll`` returns the
  failure, ``close`` drains and reports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np

from ..contract import FRAMES, Upload
from ..errors import ExecutionError


@dataclass(frozen=True)
class ExecutionCompletion:
    """The host copy of one submission's outputs."""

    fence: int
    graph_index: int
    records: np.ndarray  # int64 [S+1, RECORD_FIELDS]
    logprobs: np.ndarray  # float32 [S+1, 1 + K]
    top_ids: np.ndarray  # int64 [S+1, K]
    duration_ns: int  # measured program duration (device time on CUDA)
    error: BaseException | None = None


class FenceTimeline:
    """The fence bookkeeping every executor shares: the next fence to hand out and the
    last one whose completion poll() returned (fences form one monotonic timeline)."""

    _next_fence: int = 1
    _completed_fence: int = 0

    @property
    def next_fence(self) -> int:
        return self._next_fence

    @property
    def completed_fence(self) -> int:
        return self._completed_fence


def check_submission(*, poison: BaseException | None, closed: bool, held_fence: int, window_full: bool) -> None:
    """The rules every executor's submit enforces, in one order and one wording: not poisoned,
    not closed, no held (grammar-constrained, not yet released) step, and a free frame."""
    if poison is not None:
        raise ExecutionError(f"executor is poisoned: {poison}")
    if closed:
        raise ExecutionError("executor is closed")
    if held_fence:
        raise ExecutionError(f"a grammar-constrained step (fence {held_fence}) must be released first")
    if window_full:
        raise ExecutionError(f"all {FRAMES} frames are in flight; poll before submitting again")


# What a release may upload: only buffers the sampling part of a step reads.
RELEASE_BUFFERS = frozenset({"slot.grammar_mask"})


def check_release(*, poison: BaseException | None, closed: bool, held_fence: int, fence: int,
                  uploads: Sequence[Upload]) -> None:
    """The rules of ``release``: the fence is the held step's and the uploads are masks."""
    if poison is not None:
        raise ExecutionError(f"executor is poisoned: {poison}")
    if closed:
        raise ExecutionError("executor is closed")
    if not held_fence or fence != held_fence:
        raise ExecutionError(f"fence {fence} is not a held grammar-constrained step")
    for name, _, _ in uploads:
        if name not in RELEASE_BUFFERS:
            raise ExecutionError(f"a release may upload only {', '.join(sorted(RELEASE_BUFFERS))}, not {name!r}")


def upload_size(capacities: dict[str, int], name: str, offset: int, data) -> int:
    """Bytes of one upload range after checking it names a known input buffer and fits."""
    capacity = capacities.get(name)
    if capacity is None or name.startswith("out."):
        raise ExecutionError(f"upload names unknown input buffer {name!r}")
    size = data.nbytes if isinstance(data, memoryview) else len(data)
    if offset < 0 or offset + size > capacity:
        raise ExecutionError(f"upload to {name} [{offset}, {offset + size}) exceeds its {capacity} bytes")
    return size


class Executor(Protocol):
    """What the runtime drives; CpuExecutor, GraphExecutor and FakeExecutor implement every
    member with these parameters (tests/execution/test_protocol.py checks the signatures)."""

    @property
    def next_fence(self) -> int:
        """The fence the next submission will carry."""

    @property
    def outstanding(self) -> int:
        """Submissions whose completion poll has not returned yet (at most FRAMES)."""

    @property
    def completed_fence(self) -> int:
        """The highest fence whose completion has been returned by poll."""

    @property
    def graph_estimates_ns(self) -> Sequence[int]:
        """Each graph's device time measured before serving, by graph index (0 or an empty
        sequence: not measured); the scheduler's first estimates."""

    def can_submit(self) -> bool:
        """A frame is free, the executor is neither poisoned nor closed, and no step is held."""

    def submit(self, graph_index: int, uploads: Sequence[Upload], grammar_constrained: bool = False) -> int:
        """Upload the ranges and run the graph; returns its fence.

        ``grammar_constrained`` (structured output): the step is held until :meth:`release`
        brings its masks, which depend on the tokens of the step before it; one earlier step
        may still be in flight. Nothing else is submitted while a step is held."""

    def release(self, fence: int, uploads: Sequence[Upload]) -> None:
        """Upload the held step's masks (``slot.grammar_mask`` ranges only) and let its
        sampling run; raises ExecutionError when ``fence`` is not the held step."""

    def poll(self, timeout: float = 0.0) -> ExecutionCompletion | None:
        """The oldest submission's completion once its outputs are on the host, waiting up to
        ``timeout`` seconds; None if it is not back yet."""

    def close(self) -> None:
        """Drain, then release the frames. Idempotent."""
