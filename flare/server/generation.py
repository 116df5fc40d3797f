"""What every route family shares about a generation in progress.

:class:`ActiveGeneration` ties a submitted request's ticket to the event stream
its response reads. The server keeps every one in ``ServerState.generations``
so that shutdown can end each response with its family's terminal error event
(rather than cutting the connection) and free its model slot.
"""

from __future__ import annotations

from typing import Any

from ..errors import Error
from ..request import ErrorEvent
from .stream import EventStream


class ActiveGeneration:
    """A submitted request and the stream its response reads (loop thread)."""

    __slots__ = ("ticket", "stream")

    def __init__(self, ticket: Any, stream: EventStream):
        self.ticket = ticket
        self.stream = stream

    def end(self, error: Error) -> None:
        """End the response with ``error`` as its terminal event and stop the model's work.

        If the runtime finishes the request at the same moment, whichever terminal
        event the stream takes first is the one the client sees (EventStream._take).
        """
        self.stream.sink(ErrorEvent(error))
        self.ticket.cancel()
