# The chat-template VM's contract (see jinja_vm.pyx).
#
# Program: one compiled template, immutable after construction: the instruction
# words, constants, slot names and per-constant decoded call specs. Shared by every
# thread that renders it.
# _Render: the state of one render: slots (variables), output buffers, marks, fuel
# and recursion depth. Never shared.
# RenderBudget: the wall-clock deadline every render of one request shares.

cdef class RenderBudget:
    cdef readonly double seconds
    cdef readonly double deadline  # CLOCK_MONOTONIC seconds, as time.monotonic() reads


cdef class Program:
    cdef int* code
    cdef Py_ssize_t num_words
    cdef readonly tuple consts
    cdef readonly tuple slot_names
    cdef readonly tuple root_slots
    cdef readonly object mark_kind
    cdef readonly long fuel
    cdef readonly int max_depth
    cdef readonly Py_ssize_t max_int_bits          # bits of an int arithmetic may build
    cdef readonly Py_ssize_t max_string_bytes      # bytes of one str an operation may build
    cdef readonly Py_ssize_t max_collection_bytes  # estimated bytes of one list/tuple/dict
    cdef readonly Py_ssize_t max_output_bytes      # bytes of output per render
    cdef readonly double time_limit_s              # seconds, when render() gets no budget
    cdef int* spec_id        # per const: filter/test id, or -1
    cdef int* spec_nargs     # per const: positional argument count
    cdef int* attr_kind      # per const: 1 when the name is a dict method
    cdef tuple spec_kw       # per const: keyword names tuple, or None
    cdef tuple spec_name     # per const: method name (CALL_METHOD), or None


cdef class _Render:
    cdef Program program
    cdef list slots
    cdef list buffers
    cdef list marks
    cdef long fuel
    cdef int depth
    cdef Py_ssize_t counted_pieces
    cdef Py_ssize_t counted_bytes
    cdef Py_ssize_t out_chars
    cdef int out_kind             # widest PyUnicode kind emitted (output bytes per char)
    cdef long check_at            # fuel level at which the next checkpoint runs
    cdef RenderBudget budget      # the request's deadline
