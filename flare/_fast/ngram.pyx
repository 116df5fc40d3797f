# cython: boundscheck=False, wraparound=False, initializedcheck=False
"""Copy proposals: n-gram lookup over a request's prompt and output (prompt-lookup decoding).

The history is the prompt followed by the recorded outputs, read in place from the two
buffers (no concatenation per step). The proposal continues the most recent earlier
occurrence of the history's longest suffix of max_ngram..min_ngram tokens.
"""


cdef inline int _at(const int[::1] prompt, const int[::1] out, Py_ssize_t plen, Py_ssize_t j) noexcept nogil:
    return prompt[j] if j < plen else out[j - plen]


cpdef Py_ssize_t propose_copy(const int[::1] prompt, const int[::1] out, Py_ssize_t num_out,
                              Py_ssize_t min_ngram, Py_ssize_t max_ngram, long long[::1] dest) except -1:
    """Write up to len(dest) proposed tokens into dest; returns how many (0: no match).

    For n from max_ngram down to min_ngram, the suffix h[L-n:L] of the history h (length L)
    is searched backwards for its latest earlier occurrence h[i:i+n]; the tokens after it,
    h[i+n:], are the proposal (at most up to the end of the history).
    """
    cdef:
        Py_ssize_t plen = prompt.shape[0], length, n, i, j, count, depth = dest.shape[0]
        bint match
    if num_out < 0 or num_out > out.shape[0] or min_ngram < 1 or max_ngram < min_ngram:
        raise ValueError("propose_copy: bad arguments")
    length = plen + num_out
    if depth == 0:
        return 0
    with nogil:
        n = max_ngram
        while n >= min_ngram:
            if n < length:
                i = length - n - 1
                while i >= 0:
                    match = True
                    for j in range(n):
                        if _at(prompt, out, plen, i + j) != _at(prompt, out, plen, length - n + j):
                            match = False
                            break
                    if match:
                        count = 0
                        while count < depth and i + n + count < length:
                            dest[count] = _at(prompt, out, plen, i + n + count)
                            count += 1
                        return count
                    i -= 1
            n -= 1
    return 0
