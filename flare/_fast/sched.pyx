# cython: boundscheck=False, wraparound=False, initializedcheck=False
"""Scheduler hot loops (see flare/scheduler/scheduler.py)."""

from flare._fast.records cimport (
    RECORD_FIELDS, RECORD_META, RECORD_TOKENS, REC_CONSUMED, REC_FLAG_PARTICIPATED, REC_FLAG_SAMPLED, REC_FLAGS,
    REC_GENERATED, REC_GENERATION, REC_KIND, REC_NEW_TOKENS, REC_SLOT, REC_TOKEN0,
)


def record_layout():
    """The completion-record offsets this module was compiled with (records.pxd), by their
    flare.contract names, so a test can prove the two copies agree."""
    return {
        "RECORD_META": RECORD_META, "RECORD_TOKENS": RECORD_TOKENS, "RECORD_FIELDS": RECORD_FIELDS,
        "REC_SLOT": REC_SLOT, "REC_GENERATION": REC_GENERATION, "REC_CONSUMED": REC_CONSUMED,
        "REC_GENERATED": REC_GENERATED, "REC_NEW_TOKENS": REC_NEW_TOKENS, "REC_KIND": REC_KIND,
        "REC_FLAGS": REC_FLAGS, "REC_TOKEN0": REC_TOKEN0,
        "REC_FLAG_PARTICIPATED": REC_FLAG_PARTICIPATED, "REC_FLAG_SAMPLED": REC_FLAG_SAMPLED,
    }


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


cdef inline bint _row_ok(const long long[:, ::1] records, long long s, long long generation, long long consumed,
                         long long generated, long long least, long long most, long long ahead) noexcept nogil:
    """Slot s's record names it and ``generation``, reports least..most new tokens, and its
    counters are the committed ones less ``ahead`` - new (the commit's upper bound, ``ahead``
    past the row's state before the step; 0 for steps whose counters the commit knows)."""
    cdef long long new = records[s, REC_NEW_TOKENS]
    cdef long long behind = ahead - new if ahead else 0
    return (records[s, REC_SLOT] == s and records[s, REC_GENERATION] == generation and least <= new <= most
            and records[s, REC_CONSUMED] == consumed - behind and records[s, REC_GENERATED] == generated - behind)


cpdef Py_ssize_t validate_records(const long long[:, ::1] records, const long long[::1] slots,
                                  const long long[::1] generations, const long long[::1] consumed,
                                  const long long[::1] generated, long long max_new) except -2:
    """First row whose record disagrees with what was committed, or -1.

    Checks the slot, generation, cumulative consumed and generated counters and
    the per-step bound on new tokens.
    """
    cdef Py_ssize_t n = slots.shape[0], i
    if records.shape[1] <= REC_NEW_TOKENS:
        raise ValueError("records have too few fields")
    with nogil:
        for i in range(n):
            if (slots[i] < 0 or slots[i] >= records.shape[0]
                    or not _row_ok(records, slots[i], generations[i], consumed[i], generated[i], 0, max_new, 0)):
                return i
    return -1


cpdef Py_ssize_t validate_verification(const long long[:, ::1] records, const long long[::1] slots,
                                       const long long[::1] generations, const long long[::1] consumed,
                                       const long long[::1] generated, const long long[::1] width) except -2:
    """:func:`validate_records` for a SPECULATIVE step: row i kept 1..width[i] tokens, and its
    counters advanced by exactly what it kept (``consumed``/``generated``: the commit's upper
    bounds, width[i] past the row's state before the step)."""
    cdef Py_ssize_t n = slots.shape[0], i
    if records.shape[1] <= REC_NEW_TOKENS:
        raise ValueError("records have too few fields")
    with nogil:
        for i in range(n):
            if (slots[i] < 0 or slots[i] >= records.shape[0]
                    or not _row_ok(records, slots[i], generations[i], consumed[i], generated[i], 1, width[i],
                                   width[i])):
                return i
    return -1


cpdef void update_debts(const long long[::1] phase, const unsigned char[::1] ended,
                        double[::1] token_debt, double[::1] delivery_debt,
                        const long long[::1] served_slots, const long long[::1] served_tokens,
                        const long long[::1] delivered_slots, double per_prompt_s, double per_output_s,
                        double elapsed, double fade, long long first_runnable, long long decoding) noexcept:
    """Fairness debts after one frame (see flare.scheduler.policy.Selection.update_prices).

    Runnable slots have first_runnable <= phase <= decoding and are not ended; each one's
    debt fades, grows by the frame's duration and shrinks by the solo service time of the
    tokens it was served (delivery debt: decoding slots, per delivered token). The minimum
    over runnable slots is then subtracted, clamped at zero.
    """
    cdef:
        Py_ssize_t n = phase.shape[0], i
        double served_s, lo_tok = 1e300, lo_del = 1e300
        bint any_run = False, any_dec = False
        double[::1] served
        unsigned char[::1] got
    import numpy
    served = numpy.zeros(n, dtype=numpy.float64)
    got = numpy.zeros(n, dtype=numpy.uint8)
    with nogil:
        for i in range(served_slots.shape[0]):
            served[served_slots[i]] += served_tokens[i]
        for i in range(delivered_slots.shape[0]):
            got[delivered_slots[i]] = 1
        for i in range(n):
            if ended[i] or phase[i] < first_runnable or phase[i] > decoding:
                continue
            any_run = True
            served_s = served[i] * (per_output_s if phase[i] == decoding else per_prompt_s)
            token_debt[i] = token_debt[i] * fade + elapsed - served_s
            if token_debt[i] < lo_tok:
                lo_tok = token_debt[i]
            if phase[i] == decoding:
                any_dec = True
                delivery_debt[i] = delivery_debt[i] * fade + elapsed - (per_output_s if got[i] else 0.0)
                if delivery_debt[i] < lo_del:
                    lo_del = delivery_debt[i]
        if not any_run:
            return
        for i in range(n):
            if ended[i] or phase[i] < first_runnable or phase[i] > decoding:
                continue
            token_debt[i] = token_debt[i] - lo_tok if token_debt[i] > lo_tok else 0.0
            if phase[i] == decoding and any_dec:
                delivery_debt[i] = delivery_debt[i] - lo_del if delivery_debt[i] > lo_del else 0.0
