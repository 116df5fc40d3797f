"""BLAKE2b-128 prefix keys over int32 token buffers (see prefix_hash.pyx for the construction)."""

import numpy as np
import numpy.typing as npt

ROOT_PERSON: bytes  # b"flare-prefix-rt1"
BLOCK_PERSON: bytes  # b"flare-prefix-bk1"
ENDPOINT_PERSON: bytes  # b"flare-prefix-ep1"
KEY_SIZE: int  # 16
IDENTITY_SIZE: int  # 32
TOKENS_PER_BLOCK: int  # 64

def blake2b(data: bytes | bytearray | memoryview | npt.NDArray[np.uint8], digest_size: int = 64,
            person: bytes | None = None) -> bytes:
    """Unkeyed sequential BLAKE2b, equal to hashlib.blake2b(data, digest_size=..., person=...)."""

def root_key(identity: bytes) -> bytes:
    """The key of the empty prefix."""

def chain_keys(identity: bytes, parent: bytes, tokens: npt.NDArray[np.int32], first_position: int,
               event_positions: npt.NDArray[np.int64], event_identities: npt.NDArray[np.uint8],
               out: npt.NDArray[np.uint8]) -> None:
    """Write the keys of len(out) consecutive complete blocks into out[n, 16] (GIL released)."""

def endpoint_key(identity: bytes, parent: bytes, endpoint: int, tail: npt.NDArray[np.int32],
                 event_positions: npt.NDArray[np.int64],
                 event_identities: npt.NDArray[np.uint8]) -> bytes:
    """The key of an exact endpoint that is not 64-aligned."""
