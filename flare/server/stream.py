"""Carrying one request's events from the model thread to the event loop.

The runtime calls :meth:`EventStream.sink` on its own thread, once per event.
Events go into an unbounded deque (a request's whole output budget, allocated
as events arrive: a paused reader keeps its response) and the loop is woken
at most once per batch: a wakeup is scheduled only when none is pending, so a
model step that publishes to 64 requests costs 64 appends and at most 64
``call_soon_threadsafe`` calls, and a burst for one request costs one.
"""

from __future__ import annotations

import asyncio
from collections import deque

from ..request import ErrorEvent, Event, FinishEvent


class EventStream:
    """Single-consumer event queue; ``sink`` is thread-safe, the rest loop-only."""

    __slots__ = ("_loop", "_events", "_waiter", "_wakeup_pending", "is_terminal_received", "is_abandoned")

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._events: deque[Event] = deque()
        self._waiter: asyncio.Future | None = None
        self._wakeup_pending = False
        self.is_terminal_received = False  # set by the consumer when it saw Finish/Error
        self.is_abandoned = False  # the consumer stopped listening (disconnect, shutdown)

    def sink(self, event: Event) -> None:
        """Called by the runtime's thread (any thread)."""
        # NOTE: append before testing the flag: the loop clears the flag before
        # draining, so an event appended here is seen by that drain or by the
        # wakeup this call schedules.
        self._events.append(event)
        if not self._wakeup_pending:
            self._wakeup_pending = True
            try:
                self._loop.call_soon_threadsafe(self._wake)
            except RuntimeError:
                pass  # the loop is closed: nobody is left to read

    def _wake(self) -> None:
        self._wakeup_pending = False
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def abandon(self) -> None:
        """Stop waiting (loop thread): ``next_batch`` returns an empty list from now on."""
        self.is_abandoned = True
        self._wake()

    async def next_batch(self) -> list[Event]:
        """Every event that has arrived, waiting for at least one; [] once abandoned."""
        events = self._events
        while not events:
            if self.is_abandoned:
                return []
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        batch = []
        while events:
            batch.append(events.popleft())
        if isinstance(batch[-1], (FinishEvent, ErrorEvent)):
            self.is_terminal_received = True
        return batch
