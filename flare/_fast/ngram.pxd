cpdef Py_ssize_t propose_copy(const int[::1] prompt, const int[::1] out, Py_ssize_t num_out,
                              Py_ssize_t min_ngram, Py_ssize_t max_ngram, long long[::1] dest) except -1
