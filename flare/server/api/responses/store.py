"""The stored responses behind ``previous_response_id`` and ``GET /v1/responses/{id}``.

An in-memory LRU bounded twice: at most :data:`MAX_STORED_RESPONSES` entries
and :data:`MAX_STORED_CHARS` characters of JSON among them. Storing beyond
either bound evicts the least recently used entries (a lookup or a
continuation counts as a use); an entry larger than the whole character budget
is not stored at all. Nothing survives a restart.

Each entry keeps its response object (what ``GET`` returns) and its
conversation: the earlier turns it continued, its own input and its output,
as the chat messages the template renders (instructions excluded: OpenAI does
not carry them into a continuation). A continuation shares the message dicts of
the turns before it rather than copying them, so an entry's size, counted over
its whole conversation, bounds what it can keep alive even after the entries
it continued were evicted. Loop thread only: no locks.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

MAX_STORED_RESPONSES = 1024
MAX_STORED_CHARS = 64 << 20  # 64 Mi characters: a few hundred full-context conversations


@dataclass(frozen=True)
class StoredResponse:
    """One finished response (completed or incomplete) and the conversation it ends."""

    id: str
    response: dict[str, Any]  # the response object, as GET /v1/responses/{id} returns it
    conversation: tuple[dict[str, Any], ...]  # chat messages: earlier turns, this input, this output
    size: int  # characters of JSON: the response object plus the whole conversation

    @classmethod
    def of(cls, response: dict[str, Any], conversation: tuple[dict[str, Any], ...]) -> "StoredResponse":
        size = len(json.dumps(response, ensure_ascii=False)) + len(json.dumps(conversation, ensure_ascii=False))
        return cls(response["id"], response, conversation, size)


class ResponseStore:
    """An LRU of :class:`StoredResponse` by id, within a count and a character budget."""

    def __init__(self, max_responses: int = MAX_STORED_RESPONSES, max_chars: int = MAX_STORED_CHARS):
        if max_responses < 1 or max_chars < 1:
            raise ValueError("a response store holds at least one response and one character")
        self.max_responses = max_responses
        self.max_chars = max_chars
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()  # least recently used first
        self.num_chars = 0
        self.num_evicted = 0  # entries dropped for room (deletes not counted)
        self.num_refused = 0  # entries larger than the whole budget, never stored

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, response_id: str) -> bool:
        return response_id in self._entries

    def put(self, entry: StoredResponse) -> bool:
        """Store ``entry``, evicting the least recently used for room; False if it can never fit."""
        if entry.size > self.max_chars:
            self.num_refused += 1
            return False
        self.delete(entry.id)
        while self._entries and (len(self._entries) >= self.max_responses
                                 or self.num_chars + entry.size > self.max_chars):
            _, evicted = self._entries.popitem(last=False)
            self.num_chars -= evicted.size
            self.num_evicted += 1
        self._entries[entry.id] = entry
        self.num_chars += entry.size
        return True

    def get(self, response_id: str) -> StoredResponse | None:
        """The entry, now the most recently used; None when unknown, deleted or evicted."""
        entry = self._entries.get(response_id)
        if entry is not None:
            self._entries.move_to_end(response_id)
        return entry

    def delete(self, response_id: str) -> bool:
        entry = self._entries.pop(response_id, None)
        if entry is None:
            return False
        self.num_chars -= entry.size
        return True
