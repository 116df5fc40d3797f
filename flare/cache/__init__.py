"""The exact prefix cache: pure metadata, no torch.

:class:`PrefixHistory` derives BLAKE2b-128 keys for a request's token history;
:class:`PrefixCheckpointCache` holds immutable exact checkpoints (pages,
snapshot rows, pins, fences, leaf LRU eviction) for the scheduler.
"""

from .checkpoints import PrefixCheckpointCache
from .errors import (
                     CacheError,
                     CapacityError,
                     CheckpointStateError,
                     FenceError,
                     HistoryError,
                     OwnershipError,
                     ParentMismatchError,
                     PinError,
                     SnapshotError,
                     UnknownCheckpointError,
)
from .history import BLOCK_TOKENS, ConditioningEvent, PrefixHistory
from .records import (
                     CacheCounters,
                     CheckpointInfo,
                     Completion,
                     Created,
                     Eviction,
                     Existing,
                     PrefixHit,
                     Publication,
                     RetiredResources,
                     Reusable,
)

__all__ = [
    "BLOCK_TOKENS", "CacheCounters", "CacheError", "CapacityError", "CheckpointInfo",
    "CheckpointStateError", "Completion", "ConditioningEvent", "Created", "Eviction", "Existing",
    "FenceError", "HistoryError", "OwnershipError", "ParentMismatchError", "PinError",
    "PrefixCheckpointCache", "PrefixHistory", "PrefixHit", "Publication", "RetiredResources",
    "Reusable", "SnapshotError", "UnknownCheckpointError",
]
