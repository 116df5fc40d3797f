"""Carrying request events from the model thread to the event loop.

The runtime calls :meth:`EventStream.sink` on its own thread, once per event.
Events go into the request's unbounded deque (its whole output budget,
allocated as events arrive: a paused reader keeps its response). Wakeups are
coalesced twice: a stream is queued on its loop's :class:`EventDispatcher` at
most once until the loop has looked at it, and the dispatcher schedules at
most one ``call_soon_threadsafe`` until it has run, so a model step that
publishes to 64 requests wakes the loop once.

On the loop, a stream is consumed either by awaiting :meth:`next_batch`, or
(the SSE hot path) through :meth:`consume`, whose callback the dispatcher
calls directly with each batch: no task switch per wakeup.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Callable

from ..request import ErrorEvent, Event, FinishEvent

# Drains closer together than this are merged: under a flood of events each connection
# then gets several events per write (one send() instead of several). A drain that
# follows a quiet period runs at once, so this adds latency only when steps come faster
# than every 4 ms, and then by less than one step's worth: a GPU decode step of an 8B
# model takes 5-9 ms (docs/benchmarks.md), so served streams see no delay.
COALESCE_S = 0.004


class EventDispatcher:
    """One per event loop: wakes the loop once for any number of ready streams."""

    __slots__ = ("_loop", "_ready", "_wakeup_pending", "_last_drain")

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._ready: deque[EventStream] = deque()
        self._wakeup_pending = False
        self._last_drain = 0.0

    def notify(self, stream: "EventStream") -> None:
        """Any thread: ``stream`` has new events."""
        # NOTE: append before testing the flag; ``_run`` clears the flag before
        # draining, so the stream is seen by that drain or by the wakeup below.
        self._ready.append(stream)
        if not self._wakeup_pending:
            self._wakeup_pending = True
            try:
                self._loop.call_soon_threadsafe(self._run)
            except RuntimeError:
                pass  # the loop is closed: nobody is left to read

    def _run(self) -> None:
        wait = self._last_drain + COALESCE_S - time.monotonic()
        if wait > 0:
            self._loop.call_later(wait, self._drain)
        else:
            self._drain()

    def _drain(self) -> None:
        # NOTE: yield the GIL once before draining. The model thread must not stall
        # behind the event loop (DESIGN.md); if it is waiting to publish the next
        # step, it does so now and this drain carries both steps in one write per
        # connection. Streams already queued stay queued, so nothing is lost.
        time.sleep(0)
        self._last_drain = time.monotonic()
        self._wakeup_pending = False
        ready = self._ready
        while ready:
            ready.popleft()._wake()


class EventStream:
    """One request's events; ``sink`` is thread-safe, the rest loop-only."""

    __slots__ = ("_dispatcher", "_events", "_waiter", "_queued", "_consumer", "is_terminal_received",
                 "is_abandoned")

    def __init__(self, dispatcher: EventDispatcher):
        self._dispatcher = dispatcher
        self._events: deque[Event] = deque()
        self._waiter: asyncio.Future | None = None
        self._queued = False  # on the dispatcher's ready queue
        self._consumer: Callable[[list[Event]], None] | None = None
        self.is_terminal_received = False  # the consumer has been given Finish/Error
        self.is_abandoned = False  # the consumer stopped listening (its client disconnected)

    def sink(self, event: Event) -> None:
        """Called by the runtime's thread (any thread)."""
        self._events.append(event)
        if not self._queued:
            self._queued = True
            self._dispatcher.notify(self)

    def _take(self) -> list[Event]:
        """Every event queued, up to the first terminal one; nothing once that was taken.

        Two threads may end a stream (the runtime finishing the request, the server
        ending it at shutdown): the first terminal event wins, later ones are dropped.
        """
        events = self._events
        batch = []
        if self.is_terminal_received:
            events.clear()
            return batch
        while events:
            event = events.popleft()
            batch.append(event)
            if isinstance(event, (FinishEvent, ErrorEvent)):
                self.is_terminal_received = True
                events.clear()
                break
        return batch

    def _wake(self) -> None:
        self._queued = False
        consumer = self._consumer
        if consumer is not None:
            if self._events:
                consumer(self._take())
                if self.is_terminal_received:
                    self.stop_consuming()
            return
        self._resolve_waiter()

    def _resolve_waiter(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def consume(self, consumer: Callable[[list[Event]], None]) -> None:
        """Hand batches to ``consumer`` as they arrive, straight from the dispatcher.

        Returns after the terminal event was delivered, after ``abandon``, or
        when the consumer calls ``stop_consuming`` (backpressure); events that
        arrive after that wait for the next ``consume`` or ``next_batch``.
        """
        if self.is_abandoned or self.is_terminal_received:
            return
        self._waiter = self._dispatcher._loop.create_future()
        self._consumer = consumer
        try:
            if self._events:
                consumer(self._take())
                if self.is_terminal_received:
                    return
            if self._consumer is not None:
                await self._waiter
        finally:
            self._consumer = None
            self._waiter = None

    def stop_consuming(self) -> None:
        """Called by a consumer (loop thread): end the current ``consume``."""
        self._consumer = None
        self._resolve_waiter()

    def abandon(self) -> None:
        """Stop waiting (loop thread): ``next_batch`` returns [] from now on."""
        self.is_abandoned = True
        self.stop_consuming()

    async def next_batch(self) -> list[Event]:
        """Every event that has arrived, waiting for at least one; [] once abandoned."""
        while not self._events:
            if self.is_abandoned:
                return []
            self._waiter = self._dispatcher._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._take()
