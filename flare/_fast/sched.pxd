# Scheduler hot loops: candidate selection and completion-record validation.
# Contract: pure functions over NumPy buffers; no Python objects touched inside nogil loops.
# Completion records are read through the offsets of records.pxd (flare.contract's layout).

cpdef Py_ssize_t select_candidate(const double[::1] value, const double[::1] est_ms,
                                  const double[::1] wait_per_ms) except -2
cpdef Py_ssize_t validate_records(const long long[:, ::1] records, const long long[::1] slots,
                                  const long long[::1] generations, const long long[::1] consumed,
                                  const long long[::1] generated, long long max_new) except -2
cpdef void update_debts(const long long[::1] phase, const unsigned char[::1] ended,
                        double[::1] token_debt, double[::1] delivery_debt,
                        const long long[::1] served_slots, const long long[::1] served_tokens,
                        const long long[::1] delivered_slots, double per_prompt_s, double per_output_s,
                        double elapsed, double fade, long long first_runnable, long long decoding) noexcept
