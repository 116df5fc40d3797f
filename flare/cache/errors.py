"""Typed contract violations of the prefix cache.

Every method of :class:`~flare.cache.checkpoints.PrefixCheckpointCache` and
:class:`~flare.cache.history.PrefixHistory` validates its whole request before
changing anything, so one of these errors always leaves the object exactly as
it was. They are caller bugs (the scheduler is the only client), hence status
500; the message names the offending checkpoint, ID, position or fence.
"""

from __future__ import annotations

from ..errors import Error


class CacheError(Error):
    """Base class of every prefix-cache contract violation."""

    status = 500
    code = "prefix_cache_error"


class HistoryError(CacheError):
    """Malformed tokens, identities or conditioning events, or an endpoint
    outside the history."""


class UnknownCheckpointError(CacheError):
    """The checkpoint ID is not held by the cache (never created, evicted or cancelled)."""


class ParentMismatchError(CacheError):
    """A proposal's parent does not describe a prefix of the supplied history,
    or does not end before the proposed endpoint."""


class CapacityError(CacheError):
    """A page or snapshot ID outside the prepared capacities, or a proposal
    with the wrong number of pages for its endpoint."""


class SnapshotError(CacheError):
    """A proposal whose snapshot row did not consume exactly the endpoint's tokens."""


class OwnershipError(CacheError):
    """A proposed page or snapshot ID is already owned by a checkpoint, still
    retiring, or listed twice."""


class PinError(CacheError):
    """Unpinning a checkpoint that holds no direct pin, or cancelling or
    evicting one that is pinned."""


class FenceError(CacheError):
    """A completion fence that moves backwards, or a use recorded at a fence
    that has already completed."""


class CheckpointStateError(CacheError):
    """An operation that does not apply to the checkpoint's state, such as
    cancelling a ready checkpoint or one with descendants."""
