# cython: boundscheck=False, wraparound=False, initializedcheck=False
"""Scheduler hot loops (see flare/scheduler/scheduler.py)."""

cdef enum:
    # Completion-record field offsets (flare.model.contract.REC_*).
    REC_SLOT = 0  # physical slot
    REC_GENERATION = 1  # slot generation
    REC_CONSUMED = 2  # cumulative consumed tokens
    REC_GENERATED = 3  # cumulative sampled tokens
    REC_NEW_TOKENS = 4  # tokens sampled by this step


cpdef Py_ssize_t select_candidate(const double[::1] value, const double[::1] est_ms,
                                  const double[::1] wait_per_ms) except -2:
    """Index of the best candidate.

    Unmeasured candidates (est_ms == 0) rank ahead of every measured one and
    compete among themselves by value. Measured candidates score
    (value - wait_per_ms * est_ms) / est_ms: useful value per millisecond less
    the waiting cost of the requests they leave unserved.
    """
    cdef:
        Py_ssize_t n = value.shape[0], i, best = -1
        bint best_unmeasured = False
        double best_score = 0.0, score
    if n == 0:
        return -1
    with nogil:
        for i in range(n):
            if est_ms[i] <= 0.0:
                if not best_unmeasured or value[i] > best_score:
                    best, best_score, best_unmeasured = i, value[i], True
            elif not best_unmeasured:
                score = (value[i] - wait_per_ms[i] * est_ms[i]) / est_ms[i]
                if best < 0 or score > best_score:
                    best, best_score = i, score
    return best


cpdef Py_ssize_t validate_records(const long long[:, ::1] records, const long long[::1] slots,
                                  const long long[::1] generations, const long long[::1] consumed,
                                  const long long[::1] generated, long long max_new) except -2:
    """First row whose record disagrees with what was committed, or -1.

    Checks the slot, generation, cumulative consumed and generated counters and
    the per-step bound on new tokens.
    """
    cdef:
        Py_ssize_t n = slots.shape[0], i
        long long s, new
    if records.shape[1] <= REC_NEW_TOKENS:
        raise ValueError("records have too few fields")
    with nogil:
        for i in range(n):
            s = slots[i]
            if s < 0 or s >= records.shape[0]:
                return i
            new = records[s, REC_NEW_TOKENS]
            if (records[s, REC_SLOT] != s or records[s, REC_GENERATION] != generations[i]
                    or records[s, REC_CONSUMED] != consumed[i] or records[s, REC_GENERATED] != generated[i]
                    or new < 0 or new > max_new):
                return i
    return -1
