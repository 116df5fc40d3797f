# Contract of flare._fast.prefix_hash: BLAKE2b (RFC 7693) written in C-level
# Cython, and the prefix-key construction of the prefix cache (documented in
# prefix_hash.pyx and reproduced with hashlib in tests/cache/).
#
# Every cdef function below is pure C: it takes no Python objects, never
# raises, and may be called without the GIL. Callers validate sizes first.

from libc.stdint cimport int32_t, int64_t, uint8_t, uint64_t

cdef enum:
    BLAKE2B_BLOCK_BYTES = 128  # compression-function input size
    BLOCK_TOKENS = 64          # tokens per hashed block; equals flare.config.PAGE_TOKENS
    KEY_BYTES = 16             # BLAKE2b-128 digest: every prefix key
    IDENTITY_BYTES = 32        # model/recipe identity and conditioning-event identity
    EVENT_BYTES = 40           # one serialized event: u64 LE position || 32-byte identity

ctypedef struct Blake2b:
    uint64_t h[8]              # chaining state
    uint64_t t                 # bytes fed so far (low word of the RFC's 128-bit counter)
    uint8_t buf[128]           # pending input; the last block waits here for the final flag
    size_t buf_len
    size_t digest_len

# Start a hash with digest_len in 1..64 and an optional 16-byte personalization
# (NULL for none). No key, no salt, sequential mode (fanout 1, depth 1).
cdef void blake2b_init(Blake2b* state, size_t digest_len, const uint8_t* person) noexcept nogil
cdef void blake2b_update(Blake2b* state, const uint8_t* data, size_t num_bytes) noexcept nogil
# Write state.digest_len bytes to out. The state is consumed.
cdef void blake2b_final(Blake2b* state, uint8_t* out) noexcept nogil

# Key of one complete 64-token block chained from parent (KEY_BYTES); events are
# the num_events conditioning events whose positions fall inside the block, in
# order. Writes KEY_BYTES to out.
cdef void block_key(const uint8_t* parent, const uint8_t* identity, const int32_t* tokens,
                    const int64_t* event_positions, const uint8_t* event_identities,
                    Py_ssize_t num_events, uint8_t* out) noexcept nogil

# Key of an exact endpoint that is not 64-aligned: parent is the key of the
# aligned prefix below it, tail the endpoint % 64 tokens after that prefix.
cdef void endpoint_key_c(const uint8_t* parent, const uint8_t* identity, int64_t endpoint,
                         const int32_t* tail, Py_ssize_t tail_len,
                         const int64_t* event_positions, const uint8_t* event_identities,
                         Py_ssize_t num_events, uint8_t* out) noexcept nogil
