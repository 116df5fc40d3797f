# cython: language_level=3
"""BLAKE2b-128 prefix keys over int32 token buffers, with the GIL released.

Key construction, version 1 (tests/cache/test_prefix_hash.py recomputes every
key with ``hashlib.blake2b``). Every key is BLAKE2b with ``digest_size=16``, no
key and no salt; the 16-byte personalization names the kind of key, so the
three kinds can never collide with one another. Integers are little-endian.

    root key      BLAKE2b(identity,
                          person=b"flare-prefix-rt1")

    block key b   BLAKE2b(tokens[64b : 64b+64] as int32   (256 bytes)
                          || parent key                   (16 bytes)
                          || identity                     (32 bytes)
                          || event records,
                          person=b"flare-prefix-bk1")
                  parent key = block key b-1, the root key for b = 0; the event
                  records are those with 64b <= position < 64b+64, in order.

    endpoint key  BLAKE2b(T as u64                        (8 bytes)
    (T % 64 != 0) || parent key                           (16 bytes)
                  || identity                             (32 bytes)
                  || tokens[A : T] as int32               (4 * (T - A) bytes)
                  || event records,
                  person=b"flare-prefix-ep1")
                  A = T - T % 64; parent key = the key of the A-token prefix
                  (root or block key); event records with A <= position < T.

    event record  position as u64 (8 bytes) || event identity (32 bytes)

The key of an exact endpoint T is the root key for T = 0, block key T/64 - 1
for aligned T, and the endpoint key otherwise. Every message is unambiguous:
block messages are 304 bytes plus whole 40-byte records; endpoint messages
state T first, which fixes the tail length and so the record count.

Why BLAKE2b is written here rather than called through hashlib: hashlib needs
the GIL and a Python call per block (about 1 us each), while the scheduler
hashes 128k-token prompts on the model thread. A block message is 304 bytes
without events, i.e. three compressions per 64 tokens; the token bytes come
first so that they are read straight from the caller's int32 buffer. The
compression follows RFC 7693 section 3.2, with G expanded on locals so that the
sixteen working words stay in registers (measured on this project's CPU: about
25% faster than indexing a v[16] array, which gcc spills to the stack).
"""

cimport cython
from libc.stdint cimport int32_t, int64_t, uint8_t, uint64_t
from libc.string cimport memcpy, memset

import sys

if sys.byteorder != "little":
    # Token and word loads are plain memcpy of the host representation.
    raise ImportError("flare._fast.prefix_hash supports little-endian hosts only")

ROOT_PERSON = b"flare-prefix-rt1"
BLOCK_PERSON = b"flare-prefix-bk1"
ENDPOINT_PERSON = b"flare-prefix-ep1"
KEY_SIZE = KEY_BYTES
IDENTITY_SIZE = IDENTITY_BYTES
TOKENS_PER_BLOCK = BLOCK_TOKENS

# RFC 7693 section 2.6: the SHA-512 initialization vector.
cdef uint64_t _IV[8]
_IV[:] = [0x6a09e667f3bcc908, 0xbb67ae8584caa73b, 0x3c6ef372fe94f82b, 0xa54ff53a5f1d36f1,
          0x510e527fade682d1, 0x9b05688c2b3e6c1f, 0x1f83d9abfb41bd6b, 0x5be0cd19137e2179]

# RFC 7693 section 2.7: message word permutations; rounds 10 and 11 repeat 0 and 1.
cdef uint8_t _SIGMA[12][16]
_SIGMA_ROWS = (
    (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
    (14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3),
    (11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4),
    (7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8),
    (9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13),
    (2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9),
    (12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11),
    (13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10),
    (6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5),
    (10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0),
)
for _r in range(12):
    for _i in range(16):
        _SIGMA[_r][_i] = _SIGMA_ROWS[_r % 10][_i]

cdef uint8_t _ROOT_P[16]
cdef uint8_t _BLOCK_P[16]
cdef uint8_t _ENDPOINT_P[16]
memcpy(_ROOT_P, b"flare-prefix-rt1", 16)
memcpy(_BLOCK_P, b"flare-prefix-bk1", 16)
memcpy(_ENDPOINT_P, b"flare-prefix-ep1", 16)


cdef inline uint64_t _rotr(uint64_t x, int n) noexcept nogil:
    return (x >> n) | (x << (64 - n))


cdef inline uint64_t _load64(const uint8_t* p) noexcept nogil:
    cdef uint64_t x
    memcpy(&x, p, 8)
    return x


cdef void _compress(uint64_t* h, const uint8_t* block, uint64_t t, bint is_last) noexcept nogil:
    """RFC 7693 F: mix one 128-byte block into h; t counts bytes fed so far."""
    cdef:
        uint64_t m[16]
        uint64_t v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15
        const uint8_t* s
        int r
    memcpy(m, block, 128)
    v0 = h[0]; v1 = h[1]; v2 = h[2]; v3 = h[3]
    v4 = h[4]; v5 = h[5]; v6 = h[6]; v7 = h[7]
    v8 = _IV[0]; v9 = _IV[1]; v10 = _IV[2]; v11 = _IV[3]
    v12 = _IV[4] ^ t  # the high counter word is zero: messages stay far below 2**64 bytes
    v13 = _IV[5]; v14 = _IV[6]; v15 = _IV[7]
    if is_last:
        v14 = ~v14
    for r in range(12):
        s = _SIGMA[r]
        # G(v0, v4, v8, v12, m[s[0]], m[s[1]])
        v0 = v0 + v4 + m[s[0]]
        v12 = _rotr(v12 ^ v0, 32)
        v8 = v8 + v12
        v4 = _rotr(v4 ^ v8, 24)
        v0 = v0 + v4 + m[s[1]]
        v12 = _rotr(v12 ^ v0, 16)
        v8 = v8 + v12
        v4 = _rotr(v4 ^ v8, 63)
        # G(v1, v5, v9, v13, m[s[2]], m[s[3]])
        v1 = v1 + v5 + m[s[2]]
        v13 = _rotr(v13 ^ v1, 32)
        v9 = v9 + v13
        v5 = _rotr(v5 ^ v9, 24)
        v1 = v1 + v5 + m[s[3]]
        v13 = _rotr(v13 ^ v1, 16)
        v9 = v9 + v13
        v5 = _rotr(v5 ^ v9, 63)
        # G(v2, v6, v10, v14, m[s[4]], m[s[5]])
        v2 = v2 + v6 + m[s[4]]
        v14 = _rotr(v14 ^ v2, 32)
        v10 = v10 + v14
        v6 = _rotr(v6 ^ v10, 24)
        v2 = v2 + v6 + m[s[5]]
        v14 = _rotr(v14 ^ v2, 16)
        v10 = v10 + v14
        v6 = _rotr(v6 ^ v10, 63)
        # G(v3, v7, v11, v15, m[s[6]], m[s[7]])
        v3 = v3 + v7 + m[s[6]]
        v15 = _rotr(v15 ^ v3, 32)
        v11 = v11 + v15
        v7 = _rotr(v7 ^ v11, 24)
        v3 = v3 + v7 + m[s[7]]
        v15 = _rotr(v15 ^ v3, 16)
        v11 = v11 + v15
        v7 = _rotr(v7 ^ v11, 63)
        # G(v0, v5, v10, v15, m[s[8]], m[s[9]])
        v0 = v0 + v5 + m[s[8]]
        v15 = _rotr(v15 ^ v0, 32)
        v10 = v10 + v15
        v5 = _rotr(v5 ^ v10, 24)
        v0 = v0 + v5 + m[s[9]]
        v15 = _rotr(v15 ^ v0, 16)
        v10 = v10 + v15
        v5 = _rotr(v5 ^ v10, 63)
        # G(v1, v6, v11, v12, m[s[10]], m[s[11]])
        v1 = v1 + v6 + m[s[10]]
        v12 = _rotr(v12 ^ v1, 32)
        v11 = v11 + v12
        v6 = _rotr(v6 ^ v11, 24)
        v1 = v1 + v6 + m[s[11]]
        v12 = _rotr(v12 ^ v1, 16)
        v11 = v11 + v12
        v6 = _rotr(v6 ^ v11, 63)
        # G(v2, v7, v8, v13, m[s[12]], m[s[13]])
        v2 = v2 + v7 + m[s[12]]
        v13 = _rotr(v13 ^ v2, 32)
        v8 = v8 + v13
        v7 = _rotr(v7 ^ v8, 24)
        v2 = v2 + v7 + m[s[13]]
        v13 = _rotr(v13 ^ v2, 16)
        v8 = v8 + v13
        v7 = _rotr(v7 ^ v8, 63)
        # G(v3, v4, v9, v14, m[s[14]], m[s[15]])
        v3 = v3 + v4 + m[s[14]]
        v14 = _rotr(v14 ^ v3, 32)
        v9 = v9 + v14
        v4 = _rotr(v4 ^ v9, 24)
        v3 = v3 + v4 + m[s[15]]
        v14 = _rotr(v14 ^ v3, 16)
        v9 = v9 + v14
        v4 = _rotr(v4 ^ v9, 63)
    h[0] ^= v0 ^ v8; h[1] ^= v1 ^ v9; h[2] ^= v2 ^ v10; h[3] ^= v3 ^ v11
    h[4] ^= v4 ^ v12; h[5] ^= v5 ^ v13; h[6] ^= v6 ^ v14; h[7] ^= v7 ^ v15


cdef void blake2b_init(Blake2b* state, size_t digest_len, const uint8_t* person) noexcept nogil:
    cdef int i
    for i in range(8):
        state.h[i] = _IV[i]
    # Parameter block word 0: digest length, key length 0, fanout 1, depth 1.
    state.h[0] ^= 0x01010000 ^ <uint64_t>digest_len
    if person != NULL:
        # Parameter block bytes 48..63.
        state.h[6] ^= _load64(person)
        state.h[7] ^= _load64(person + 8)
    state.t = 0
    state.buf_len = 0
    state.digest_len = digest_len


cdef void blake2b_update(Blake2b* state, const uint8_t* data, size_t num_bytes) noexcept nogil:
    cdef size_t fill
    if num_bytes == 0:
        return
    fill = BLAKE2B_BLOCK_BYTES - state.buf_len
    if num_bytes > fill:
        # NOTE: a block is compressed only once more input follows it, because
        # the final block must be compressed with the last-block flag.
        memcpy(state.buf + state.buf_len, data, fill)
        state.t += BLAKE2B_BLOCK_BYTES
        _compress(state.h, state.buf, state.t, False)
        state.buf_len = 0
        data += fill
        num_bytes -= fill
        while num_bytes > BLAKE2B_BLOCK_BYTES:
            state.t += BLAKE2B_BLOCK_BYTES
            _compress(state.h, data, state.t, False)
            data += BLAKE2B_BLOCK_BYTES
            num_bytes -= BLAKE2B_BLOCK_BYTES
    memcpy(state.buf + state.buf_len, data, num_bytes)
    state.buf_len += num_bytes


cdef void blake2b_final(Blake2b* state, uint8_t* out) noexcept nogil:
    state.t += state.buf_len
    memset(state.buf + state.buf_len, 0, BLAKE2B_BLOCK_BYTES - state.buf_len)
    _compress(state.h, state.buf, state.t, True)
    # The digest is the little-endian serialization of h, truncated.
    memcpy(out, state.h, state.digest_len)


cdef inline void _update_events(Blake2b* state, const int64_t* event_positions,
                                const uint8_t* event_identities, Py_ssize_t num_events) noexcept nogil:
    cdef:
        uint8_t record[EVENT_BYTES]
        uint64_t position
        Py_ssize_t e
    for e in range(num_events):
        position = <uint64_t>event_positions[e]
        memcpy(record, &position, 8)
        memcpy(record + 8, event_identities + IDENTITY_BYTES * e, IDENTITY_BYTES)
        blake2b_update(state, record, EVENT_BYTES)


cdef void block_key(const uint8_t* parent, const uint8_t* identity, const int32_t* tokens,
                    const int64_t* event_positions, const uint8_t* event_identities,
                    Py_ssize_t num_events, uint8_t* out) noexcept nogil:
    cdef Blake2b state
    blake2b_init(&state, KEY_BYTES, _BLOCK_P)
    # The 256 token bytes are exactly two compression blocks and more input
    # always follows them, so they are compressed in place rather than staged
    # through state.buf (what blake2b_update would do).
    _compress(state.h, <const uint8_t*>tokens, BLAKE2B_BLOCK_BYTES, False)
    _compress(state.h, <const uint8_t*>tokens + BLAKE2B_BLOCK_BYTES, 2 * BLAKE2B_BLOCK_BYTES, False)
    state.t = 2 * BLAKE2B_BLOCK_BYTES
    blake2b_update(&state, parent, KEY_BYTES)
    blake2b_update(&state, identity, IDENTITY_BYTES)
    _update_events(&state, event_positions, event_identities, num_events)
    blake2b_final(&state, out)


cdef void endpoint_key_c(const uint8_t* parent, const uint8_t* identity, int64_t endpoint,
                         const int32_t* tail, Py_ssize_t tail_len,
                         const int64_t* event_positions, const uint8_t* event_identities,
                         Py_ssize_t num_events, uint8_t* out) noexcept nogil:
    cdef:
        Blake2b state
        uint64_t t = <uint64_t>endpoint
    blake2b_init(&state, KEY_BYTES, _ENDPOINT_P)
    blake2b_update(&state, <const uint8_t*>&t, 8)
    blake2b_update(&state, parent, KEY_BYTES)
    blake2b_update(&state, identity, IDENTITY_BYTES)
    blake2b_update(&state, <const uint8_t*>tail, 4 * <size_t>tail_len)
    _update_events(&state, event_positions, event_identities, num_events)
    blake2b_final(&state, out)


# ---------------------------------------------------------------------------
# Python interface. Sizes and event order are validated here (ValueError), so
# the cdef functions above can trust their arguments.


cdef int _check_size(const uint8_t[::1] value, Py_ssize_t size, str name) except -1:
    if value.shape[0] != size:
        raise ValueError(f"{name} must be {size} bytes, got {value.shape[0]}")
    return 0


@cython.boundscheck(False)
@cython.wraparound(False)
cdef int _check_events(const int64_t[::1] positions, const uint8_t[:, ::1] identities,
                       int64_t start, int64_t end) except -1:
    cdef:
        Py_ssize_t e, n = positions.shape[0]
        int64_t previous = start
    if identities.shape[0] != n or (n and identities.shape[1] != IDENTITY_BYTES):
        raise ValueError(f"event identities must have shape ({n}, {IDENTITY_BYTES}), "
                         f"got ({identities.shape[0]}, {identities.shape[1]})")
    for e in range(n):
        if positions[e] < previous or positions[e] >= end:
            raise ValueError(f"event positions must be nondecreasing within [{start}, {end}); "
                             f"event {e} is at {positions[e]}")
        previous = positions[e]
    return 0


@cython.boundscheck(False)
@cython.wraparound(False)
def blake2b(const uint8_t[::1] data, Py_ssize_t digest_size=64, person=None):
    """BLAKE2b of data (unkeyed, sequential), equal to ``hashlib.blake2b(data,
    digest_size=digest_size, person=person).digest()``; person is at most 16
    bytes and is zero-padded. Exposed for differential tests and benchmarks."""
    cdef:
        Blake2b state
        uint8_t person_block[16]
        uint8_t digest[64]
        const uint8_t* person_ptr = NULL
        const uint8_t* data_ptr = NULL
        Py_ssize_t n = data.shape[0]
    if not 1 <= digest_size <= 64:
        raise ValueError(f"digest_size must be in 1..64, got {digest_size}")
    if person is not None:
        person = bytes(person)
        if len(person) > 16:
            raise ValueError(f"person must be at most 16 bytes, got {len(person)}")
        memset(person_block, 0, 16)
        memcpy(person_block, <const char*>person, len(person))
        person_ptr = person_block
    if n:
        data_ptr = &data[0]
    with nogil:
        blake2b_init(&state, digest_size, person_ptr)
        blake2b_update(&state, data_ptr, n)
        blake2b_final(&state, digest)
    return digest[:digest_size]


@cython.boundscheck(False)
@cython.wraparound(False)
def root_key(const uint8_t[::1] identity):
    """The key of the empty prefix: BLAKE2b-128(identity, person=ROOT_PERSON)."""
    cdef:
        Blake2b state
        uint8_t out[KEY_BYTES]
    _check_size(identity, IDENTITY_BYTES, "identity")
    with nogil:
        blake2b_init(&state, KEY_BYTES, _ROOT_P)
        blake2b_update(&state, &identity[0], IDENTITY_BYTES)
        blake2b_final(&state, out)
    return out[:KEY_BYTES]


@cython.boundscheck(False)
@cython.wraparound(False)
def chain_keys(const uint8_t[::1] identity, const uint8_t[::1] parent,
               const int32_t[::1] tokens, int64_t first_position,
               const int64_t[::1] event_positions, const uint8_t[:, ::1] event_identities,
               uint8_t[:, ::1] out):
    """Write the block keys of consecutive complete blocks into out.

    tokens holds len(out) * 64 tokens starting at absolute position
    first_position (64-aligned); parent is the key of the prefix that ends
    there. The events are exactly those whose positions fall inside the hashed
    range, nondecreasing. The GIL is released while hashing.
    """
    cdef:
        Py_ssize_t num_blocks = out.shape[0]
        Py_ssize_t num_events = event_positions.shape[0]
        Py_ssize_t b, e = 0, first_event
        int64_t block_end
        const uint8_t* previous
        const int64_t* positions_ptr = NULL
        const uint8_t* identities_ptr = NULL
    _check_size(identity, IDENTITY_BYTES, "identity")
    _check_size(parent, KEY_BYTES, "parent")
    if first_position < 0 or first_position % BLOCK_TOKENS:
        raise ValueError(f"first_position must be a nonnegative multiple of {BLOCK_TOKENS}, "
                         f"got {first_position}")
    if tokens.shape[0] != num_blocks * BLOCK_TOKENS:
        raise ValueError(f"{num_blocks} blocks need {num_blocks * BLOCK_TOKENS} tokens, "
                         f"got {tokens.shape[0]}")
    if num_blocks and out.shape[1] != KEY_BYTES:
        raise ValueError(f"out must have {KEY_BYTES} columns, got {out.shape[1]}")
    _check_events(event_positions, event_identities, first_position,
                  first_position + num_blocks * BLOCK_TOKENS)
    if num_blocks == 0:
        return
    if num_events:
        positions_ptr = &event_positions[0]
        identities_ptr = &event_identities[0, 0]
    with nogil:
        previous = &parent[0]
        for b in range(num_blocks):
            block_end = first_position + (b + 1) * BLOCK_TOKENS
            first_event = e
            while e < num_events and positions_ptr[e] < block_end:
                e += 1
            block_key(previous, &identity[0], &tokens[b * BLOCK_TOKENS],
                      positions_ptr + first_event, identities_ptr + IDENTITY_BYTES * first_event,
                      e - first_event, &out[b, 0])
            previous = &out[b, 0]


@cython.boundscheck(False)
@cython.wraparound(False)
def endpoint_key(const uint8_t[::1] identity, const uint8_t[::1] parent, int64_t endpoint,
                 const int32_t[::1] tail, const int64_t[::1] event_positions,
                 const uint8_t[:, ::1] event_identities):
    """The key of an exact endpoint that is not 64-aligned.

    parent is the key of the aligned prefix endpoint - endpoint % 64, tail the
    endpoint % 64 tokens after it, and the events exactly those inside
    [endpoint - endpoint % 64, endpoint), nondecreasing.
    """
    cdef:
        uint8_t out[KEY_BYTES]
        Py_ssize_t tail_len = tail.shape[0]
        Py_ssize_t num_events = event_positions.shape[0]
        int64_t aligned
        const int64_t* positions_ptr = NULL
        const uint8_t* identities_ptr = NULL
    _check_size(identity, IDENTITY_BYTES, "identity")
    _check_size(parent, KEY_BYTES, "parent")
    if endpoint <= 0 or endpoint % BLOCK_TOKENS == 0:
        raise ValueError(f"endpoint must be positive and not a multiple of {BLOCK_TOKENS} "
                         f"(aligned endpoints use block keys), got {endpoint}")
    aligned = endpoint - endpoint % BLOCK_TOKENS
    if tail_len != endpoint - aligned:
        raise ValueError(f"endpoint {endpoint} needs {endpoint - aligned} tail tokens, got {tail_len}")
    _check_events(event_positions, event_identities, aligned, endpoint)
    if num_events:
        positions_ptr = &event_positions[0]
        identities_ptr = &event_identities[0, 0]
    with nogil:
        endpoint_key_c(&parent[0], &identity[0], endpoint, &tail[0], tail_len,
                       positions_ptr, identities_ptr, num_events, out)
    return out[:KEY_BYTES]
