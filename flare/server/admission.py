"""HTTP admission permits and the frontend worker pool.

HTTP admission is the first bound a generation request meets: at most
``queue_capacity + max_active`` requests hold a :class:`Permit` at once. The
permit is taken once the request has arrived whole, so a client that sends its
body slowly holds none (80 such connections used to refuse everyone else for
the request timeout); when every permit is taken the refusal (429) comes as
soon as the head is read, before any body is buffered. A permit lives until the
response has been written completely, streamed or not, so HTTP capacity also
counts finished responses that a slow client has not read yet. It is
independent of the model's own slots (the runtime answers 503 when those are
exhausted).

Request bodies are bounded together instead: the bytes of every body held in
memory (arriving, or of a request not finished yet) count against a
:class:`BodyBudget` of ``capacity x max_body_bytes``, the most that permits
taken at the head could ever hold; a body that would pass it is refused (503).

Admitted requests then wait for one of ``frontend_workers`` threads to render
the chat template and tokenize (CPU work that must stay off the event loop).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any, Callable, TypeVar

T = TypeVar("T")


class Permit:
    """One reserved request; ``release`` is idempotent."""

    __slots__ = ("_admission",)

    def __init__(self, admission: "HttpAdmission"):
        self._admission = admission

    def release(self) -> None:
        admission, self._admission = self._admission, None
        if admission is not None:
            admission._release()


class HttpAdmission:
    """Counts permits against a fixed capacity; lives on the event loop thread."""

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"HTTP admission capacity must be positive, got {capacity}")
        self.capacity = capacity
        self.num_in_use = 0
        self.num_rejected = 0  # capacity exhaustion (429)
        self.num_refused_paused = 0  # refused while admission was paused (503)
        self.is_paused = False
        self._idle_waiters: list[asyncio.Future] = []

    def refuses(self) -> bool:
        """Whether every permit is taken; a refusal counts as rejected (the caller answers 429)."""
        if self.num_in_use < self.capacity:
            return False
        self.num_rejected += 1
        return True

    def try_acquire(self) -> Permit | None:
        """A permit, or None when every slot is taken (the caller answers 429)."""
        if self.refuses():
            return None
        self.num_in_use += 1
        return Permit(self)

    def _release(self) -> None:
        self.num_in_use -= 1
        if self.num_in_use == 0 and self._idle_waiters:
            waiters, self._idle_waiters = self._idle_waiters, []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(True)

    async def wait_idle(self, timeout: float | None) -> bool:
        """Wait until no permit is held; False if ``timeout`` passed first."""
        if self.num_in_use == 0:
            return True
        waiter = asyncio.get_running_loop().create_future()
        self._idle_waiters.append(waiter)
        try:
            return await asyncio.wait_for(asyncio.shield(waiter), timeout)
        except asyncio.TimeoutError:
            return self.num_in_use == 0


class BodyShare:
    """One request's bytes in a :class:`BodyBudget`; ``release`` (idempotent) gives them back."""

    __slots__ = ("_budget", "num_bytes")

    def __init__(self, budget: "BodyBudget"):
        self._budget: BodyBudget | None = budget
        self.num_bytes = 0

    def take(self, num_bytes: int) -> bool:
        """Count ``num_bytes`` more of the body; False (nothing counted) past the budget."""
        budget = self._budget
        if budget is None:
            return True
        if budget.num_bytes + num_bytes > budget.capacity:
            budget.num_refused += 1
            return False
        budget.num_bytes += num_bytes
        self.num_bytes += num_bytes
        return True

    def release(self) -> None:
        budget, self._budget = self._budget, None
        if budget is not None:
            budget.num_bytes -= self.num_bytes
            self.num_bytes = 0


class BodyBudget:
    """Bytes of request bodies held at once, across connections; lives on the event loop thread."""

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"the request body budget must be positive, got {capacity}")
        self.capacity = capacity
        self.num_bytes = 0
        self.num_refused = 0  # bodies refused for the budget (503)

    def share(self) -> BodyShare:
        return BodyShare(self)


class FrontendPool:
    """``num_workers`` threads for template rendering and tokenization."""

    def __init__(self, num_workers: int):
        if num_workers < 1:
            raise ValueError(f"frontend_workers must be positive, got {num_workers}")
        self.num_workers = num_workers
        self.num_pending = 0  # submitted and not finished (loop thread only)
        self._executor = concurrent.futures.ThreadPoolExecutor(num_workers, thread_name_prefix="flare-frontend")

    @property
    def num_busy(self) -> int:
        return min(self.num_pending, self.num_workers)

    @property
    def num_waiting(self) -> int:
        return max(0, self.num_pending - self.num_workers)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` on a worker; exceptions propagate to the awaiting handler."""
        self.num_pending += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)
        finally:
            self.num_pending -= 1

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
