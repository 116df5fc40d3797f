# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""The chat-template virtual machine.

Executes the bytecode produced by ``flare.frontend.template.codegen``. Values are the
caller's JSON values themselves (borrowed, never copied) plus a few runtime types that
mirror jinja2's (Undefined, TemplateNamespace, LoopContext, Macro), so comparisons,
arithmetic, ``str()`` conversion and the error messages they raise are the ones jinja2
produces under Transformers' ``apply_chat_template`` configuration.

Sandboxing: attribute access is resolved here against fixed tables (no ``getattr`` on
arbitrary objects, no dunder or underscore attributes, no mutating list/dict methods),
only whitelisted callables can be called, and each render has an instruction budget
(fuel), a macro recursion bound, a wall-clock deadline shared by all renders of one
request (checked, with the GIL released for a moment, every few thousand units of
fuel), and size limits on the ints, strings, collections and output it builds,
checked before building them (jinja_limits.pxi).

The module is one compiled unit split by concern: this file (opcodes, Program, the
dispatch loop), jinja_runtime.pxi (value types, globals), jinja_access.pxi (sandboxed
access, calls, operators), jinja_filters.pxi (filters, tests) and jinja_text.pxi
(the tojson encoder and container repr), jinja_limits.pxi (budgets and size guards).
"""

from cpython.dict cimport PyDict_GetItem, PyDict_Items, PyDict_Next
from cpython.object cimport PyObject, PyObject_IsTrue, PyObject_RichCompare, Py_EQ, Py_NE, Py_LT, Py_LE, Py_GT, Py_GE
from cpython.sequence cimport PySequence_Contains
from cpython.list cimport PyList_GET_SIZE
from cpython.unicode cimport PyUnicode_GET_LENGTH
from libc.stdlib cimport malloc, free, realloc
from libc.string cimport memset, memchr, memcmp

import html as _html
import itertools as _itertools
import json
import math
import pprint as _pprint
import re
import textwrap as _textwrap
from urllib.parse import quote_from_bytes as _quote_from_bytes
import string as _string
from collections import abc as _abc
from datetime import datetime
from numbers import Number as _Number

from flare.errors import FrontendError

cdef extern from "Python.h":
    bint PyUnicode_IS_ASCII(object)
    Py_ssize_t PyUnicode_GET_LENGTH(object)
    int PyUnicode_KIND(object)
    void* PyUnicode_DATA(object)
    Py_UCS4 PyUnicode_READ(int kind, void* data, Py_ssize_t index)
    object PyUnicode_FromKindAndData(int kind, const void* buffer, Py_ssize_t size)
    bint Py_UNICODE_ISPRINTABLE(Py_UCS4 ch)
    bint Py_UNICODE_ISSPACE(Py_UCS4 ch)


# Opcode numbers: must equal flare.frontend.template.opcodes.Op (a test checks).
cdef enum Opc:
    NOP = 0
    EMIT_CONST = 1
    EMIT = 2
    LOAD_CONST = 3
    LOAD = 4
    STORE = 5
    COPY_SLOTS = 6
    GETATTR = 7
    GETITEM = 8
    SLICE = 9
    BINARY = 10
    COMPARE = 11
    NOT = 12
    NEG = 13
    POS = 14
    JUMP = 15
    JUMP_IF_FALSE = 16
    JUMP_IF_TRUE = 17
    JUMP_IF_FALSE_KEEP = 18
    JUMP_IF_TRUE_KEEP = 19
    BUILD_LIST = 20
    BUILD_TUPLE = 21
    BUILD_DICT = 22
    UNPACK = 23
    FILTER = 24
    TEST = 25
    CALL = 26
    CALL_METHOD = 27
    FOR_INIT = 28
    FOR_NEXT = 29
    FOR_BREAK = 30
    CAPTURE = 31
    CAPTURE_END = 32
    SET_ATTR = 33
    MAKE_MACRO = 34
    RETURN = 35
    MARK = 36
    MARK_VALUE = 37
    POP = 38
    DUP = 39
    LIST_APPEND = 40
    HALT = 41
    SKIP_IF_UNBOUND = 42
    LOAD_UNDEFINED = 43
    RAISE = 44
    CHAIN_ADD = 45
    EMIT_CHAIN = 46

OPCODE_COUNT = 47

# Name -> number of every opcode, for the consistency test against opcodes.Op.
OPCODES = {
    "NOP": NOP,
    "EMIT_CONST": EMIT_CONST,
    "EMIT": EMIT,
    "LOAD_CONST": LOAD_CONST,
    "LOAD": LOAD,
    "STORE": STORE,
    "COPY_SLOTS": COPY_SLOTS,
    "GETATTR": GETATTR,
    "GETITEM": GETITEM,
    "SLICE": SLICE,
    "BINARY": BINARY,
    "COMPARE": COMPARE,
    "NOT": NOT,
    "NEG": NEG,
    "POS": POS,
    "JUMP": JUMP,
    "JUMP_IF_FALSE": JUMP_IF_FALSE,
    "JUMP_IF_TRUE": JUMP_IF_TRUE,
    "JUMP_IF_FALSE_KEEP": JUMP_IF_FALSE_KEEP,
    "JUMP_IF_TRUE_KEEP": JUMP_IF_TRUE_KEEP,
    "BUILD_LIST": BUILD_LIST,
    "BUILD_TUPLE": BUILD_TUPLE,
    "BUILD_DICT": BUILD_DICT,
    "UNPACK": UNPACK,
    "FILTER": FILTER,
    "TEST": TEST,
    "CALL": CALL,
    "CALL_METHOD": CALL_METHOD,
    "FOR_INIT": FOR_INIT,
    "FOR_NEXT": FOR_NEXT,
    "FOR_BREAK": FOR_BREAK,
    "CAPTURE": CAPTURE,
    "CAPTURE_END": CAPTURE_END,
    "SET_ATTR": SET_ATTR,
    "MAKE_MACRO": MAKE_MACRO,
    "RETURN": RETURN,
    "MARK": MARK,
    "MARK_VALUE": MARK_VALUE,
    "POP": POP,
    "DUP": DUP,
    "LIST_APPEND": LIST_APPEND,
    "HALT": HALT,
    "SKIP_IF_UNBOUND": SKIP_IF_UNBOUND,
    "LOAD_UNDEFINED": LOAD_UNDEFINED,
    "RAISE": RAISE,
    "CHAIN_ADD": CHAIN_ADD,
    "EMIT_CHAIN": EMIT_CHAIN,
}

# Filter and test numbering: codegen resolves names through these tuples.
FILTER_NAMES = (
    "abs", "attr", "batch", "capitalize", "center", "default", "dictsort", "escape",
    "first", "float", "forceescape", "format", "indent", "int", "items", "join", "last",
    "length", "list", "lower", "map", "max", "min", "reject", "rejectattr", "replace",
    "reverse", "round", "safe", "select", "selectattr", "sort", "string", "sum", "title",
    "tojson", "trim", "unique", "upper", "wordcount", "groupby", "slice", "truncate",
    "wordwrap", "striptags", "filesizeformat", "urlencode", "pprint",
)
cdef enum Flt:
    F_ABS, F_ATTR, F_BATCH, F_CAPITALIZE, F_CENTER, F_DEFAULT, F_DICTSORT, F_ESCAPE
    F_FIRST, F_FLOAT, F_FORCEESCAPE, F_FORMAT, F_INDENT, F_INT, F_ITEMS, F_JOIN, F_LAST
    F_LENGTH, F_LIST, F_LOWER, F_MAP, F_MAX, F_MIN, F_REJECT, F_REJECTATTR, F_REPLACE
    F_REVERSE, F_ROUND, F_SAFE, F_SELECT, F_SELECTATTR, F_SORT, F_STRING, F_SUM, F_TITLE
    F_TOJSON, F_TRIM, F_UNIQUE, F_UPPER, F_WORDCOUNT, F_GROUPBY, F_SLICE, F_TRUNCATE
    F_WORDWRAP, F_STRIPTAGS, F_FILESIZEFORMAT, F_URLENCODE, F_PPRINT

TEST_NAMES = (
    "defined", "undefined", "none", "boolean", "false", "true", "integer", "float",
    "number", "string", "mapping", "iterable", "sequence", "callable", "sameas", "eq",
    "ne", "lt", "le", "gt", "ge", "in", "odd", "even", "divisibleby", "lower", "upper",
    "escaped", "filter", "test",
)
cdef enum Tst:
    T_DEFINED, T_UNDEFINED, T_NONE, T_BOOLEAN, T_FALSE, T_TRUE, T_INTEGER, T_FLOAT
    T_NUMBER, T_STRING, T_MAPPING, T_ITERABLE, T_SEQUENCE, T_CALLABLE, T_SAMEAS, T_EQ
    T_NE, T_LT, T_LE, T_GT, T_GE, T_IN, T_ODD, T_EVEN, T_DIVISIBLEBY, T_LOWER, T_UPPER
    T_ESCAPED, T_FILTER, T_TEST

# Sandbox limits (defaults; each Program takes its own, see compile_template).
# Real chat templates stay far below them: a prompt for a 1M-token context is a few MB.
DEFAULT_FUEL = 20_000_000                  # instructions per render
DEFAULT_MAX_DEPTH = 200                    # nested macro calls
DEFAULT_MAX_INT_BITS = 4096                # bits of an int that arithmetic builds
DEFAULT_MAX_STRING_BYTES = 16 * 1024 * 1024      # bytes of one str an operation builds
DEFAULT_MAX_COLLECTION_BYTES = 16 * 1024 * 1024  # estimated bytes of one list/tuple/dict
DEFAULT_MAX_OUTPUT_BYTES = 32 * 1024 * 1024      # bytes of output per render
DEFAULT_TIME_LIMIT_S = 2.0                 # seconds for all renders of one request
MAX_RANGE = 100_000                        # jinja2's sandbox limit for range()

cdef object MISSING = object()   # an unset slot


try:
    # Run by the interpreter (not Cython): newer CPythons also report how many values
    # there were in this message, and jinja2's errors are the interpreter's.
    exec("_a, _b = (1, 2, 3)", {})
except ValueError as _exc:
    _UNPACK_SAYS_GOT = "got" in str(_exc)

cdef frozenset _STR_METHODS = frozenset((
    "capitalize", "casefold", "center", "count", "endswith", "expandtabs", "find",
    "format", "index", "isalnum", "isalpha", "isascii", "isdecimal", "isdigit",
    "isidentifier", "islower", "isnumeric", "isprintable", "isspace", "istitle", "isupper",
    "join", "ljust", "lower", "lstrip", "partition", "removeprefix", "removesuffix",
    "replace", "rfind", "rindex", "rjust", "rpartition", "rsplit", "rstrip", "split",
    "splitlines", "startswith", "strip", "swapcase", "title", "upper", "zfill"))
cdef frozenset _DICT_METHODS = frozenset(("get", "items", "keys", "values", "copy"))
cdef frozenset _DICT_MUTATORS = frozenset(("clear", "pop", "popitem", "setdefault", "update"))
cdef frozenset _LIST_METHODS = frozenset(("index", "count", "copy"))
cdef frozenset _LIST_MUTATORS = frozenset(("append", "clear", "extend", "insert", "pop",
                                           "remove", "reverse", "sort"))
cdef frozenset _TUPLE_METHODS = frozenset(("index", "count"))
cdef frozenset _NUMBER_METHODS = frozenset(("real", "imag", "numerator", "denominator",
                                            "conjugate", "bit_length", "bit_count",
                                            "is_integer", "as_integer_ratio", "hex"))

_word_beginning_split_re = re.compile(r"([-\s({\[<]+)")
_word_re = re.compile(r"\w+")
_formatter = _string.Formatter()


include "jinja_runtime.pxi"
include "jinja_access.pxi"
include "jinja_filters.pxi"
include "jinja_text.pxi"
include "jinja_limits.pxi"


# ============================================================== the program

cdef class Program:
    """One compiled template: immutable bytecode and constants, shared by renders."""

    def __cinit__(self):
        self.code = NULL
        self.spec_id = NULL
        self.spec_nargs = NULL
        self.attr_kind = NULL

    def __init__(self, tuple code, tuple consts, tuple slot_names, tuple root_slots,
                 mark_kind=None, long fuel=DEFAULT_FUEL, int max_depth=DEFAULT_MAX_DEPTH,
                 Py_ssize_t max_int_bits=DEFAULT_MAX_INT_BITS,
                 Py_ssize_t max_string_bytes=DEFAULT_MAX_STRING_BYTES,
                 Py_ssize_t max_collection_bytes=DEFAULT_MAX_COLLECTION_BYTES,
                 Py_ssize_t max_output_bytes=DEFAULT_MAX_OUTPUT_BYTES,
                 double time_limit_s=DEFAULT_TIME_LIMIT_S):
        cdef Py_ssize_t i, n = len(code), nc = len(consts)
        if n % 2:
            raise ValueError("code must hold (op, arg) pairs")
        if min(fuel, max_depth, max_int_bits, max_string_bytes, max_collection_bytes,
               max_output_bytes) <= 0 or not time_limit_s > 0:
            raise ValueError("template limits must be positive")
        self.code = <int*>malloc(max(n, 1) * sizeof(int))
        self.spec_id = <int*>malloc(max(nc, 1) * sizeof(int))
        self.spec_nargs = <int*>malloc(max(nc, 1) * sizeof(int))
        self.attr_kind = <int*>malloc(max(nc, 1) * sizeof(int))
        if not self.code or not self.spec_id or not self.spec_nargs or not self.attr_kind:
            raise MemoryError()
        for i in range(n):
            self.code[i] = code[i]
        for i in range(0, n, 2):
            if not 0 <= code[i] < OPCODE_COUNT:
                raise ValueError(f"bad opcode {code[i]} at {i // 2}")
        self.num_words = n
        self.consts = consts
        self.slot_names = slot_names
        self.root_slots = root_slots
        self.mark_kind = mark_kind
        self.fuel = fuel
        self.max_depth = max_depth
        self.max_int_bits = max_int_bits
        self.max_string_bytes = max_string_bytes
        self.max_collection_bytes = max_collection_bytes
        self.max_output_bytes = max_output_bytes
        self.time_limit_s = time_limit_s
        kws = []
        names = []
        for i in range(nc):
            c = consts[i]
            self.spec_id[i] = -1
            self.spec_nargs[i] = 0
            self.attr_kind[i] = 0
            if type(c) is str:
                if c in _DICT_METHODS or c in _DICT_MUTATORS:
                    self.attr_kind[i] = 1
                else:
                    self.attr_kind[i] = _LOOP_ATTRS.get(c, 0)
            kw = None
            name = None
            if type(c) is tuple and len(c) == 3 and type(c[1]) is int and type(c[2]) is tuple:
                if type(c[0]) is int:
                    self.spec_id[i] = c[0]
                else:
                    name = c[0]
                self.spec_nargs[i] = c[1]
                kw = c[2]
            kws.append(kw)
            names.append(name)
        self.spec_kw = tuple(kws)
        self.spec_name = tuple(names)

    def __dealloc__(self):
        free(self.code)
        free(self.spec_id)
        free(self.spec_nargs)
        free(self.attr_kind)

    def render(self, dict context, bint marked=False, RenderBudget budget=None):
        """Render with ``context``; returns the text, or (text, marks) when ``marked``.

        ``budget`` is the deadline of the request this render belongs to (shared with
        its other renders); without one the render gets ``time_limit_s`` of its own.
        """
        cdef _Render st = _Render.__new__(_Render)
        cdef list slots = [MISSING] * len(self.slot_names)
        cdef PyObject* p
        st.program = self
        st.slots = slots
        st.buffers = [[]]
        st.marks = []
        st.fuel = self.fuel
        st.depth = 0
        st.counted_pieces = 0
        st.counted_bytes = 0
        st.out_chars = 0
        st.out_kind = 1
        st.budget = budget if budget is not None else RenderBudget(self.time_limit_s)
        for slot, name in self.root_slots:
            p = PyDict_GetItem(context, name)
            if p == NULL:
                p = PyDict_GetItem(GLOBALS, name)
            if p != NULL:
                slots[slot] = <object>p
        try:
            _checkpoint(st, st.fuel)  # a request whose budget is spent renders nothing
            _run(st, 0)
        except FrontendError:
            raise
        except RecursionError:
            raise FrontendError("template recursion too deep") from None
        except MemoryError:
            raise FrontendError("template exhausted memory") from None
        except Exception as exc:
            raise FrontendError(str(exc)) from exc
        finally:
            # Macros in slots point back at this render: empty the slots so the
            # cycle is freed by refcounting instead of waiting for the GC.
            del slots[:]
        text = "".join(st.buffers[0])
        if marked:
            return text, tuple(st.marks)
        return text


cdef class _Render:
    pass


cdef inline Py_ssize_t _work(object v):
    """Extra fuel for values whose size measures the work done on them (filters,
    method calls, comparisons, `in` and the strings `+`, `~` and slicing build): one
    unit per 64 characters (copying text is cheap) or per item (each item is an
    object), so loops over big inputs exhaust the budget instead of hanging, and
    checkpoints come at least every few hundred microseconds."""
    if type(v) is str:
        return PyUnicode_GET_LENGTH(v) >> 6
    if type(v) is list:
        return PyList_GET_SIZE(v)
    if type(v) is tuple:
        return len(v)
    return 0


cdef Py_ssize_t _push_grow(list stack, Py_ssize_t sp, object v) except -1:
    stack.append(v)
    return sp + 1


cdef inline int _count_output(_Render st, object v) except -1:
    """Charge emitted text ``v`` to the render's output limit (in bytes of the
    widest character emitted, as the final join stores them)."""
    cdef int kind = PyUnicode_KIND(v)
    st.out_chars += PyUnicode_GET_LENGTH(v)
    if kind > st.out_kind:
        st.out_kind = kind
    if st.out_chars * st.out_kind > st.program.max_output_bytes:
        raise TemplateLimitError(
            f"template output exceeded {st.program.max_output_bytes} bytes")
    return 0


cdef inline Py_ssize_t _push(list stack, Py_ssize_t sp, object v) except -1:
    # The operand stack only grows: popping just moves sp, so no list resizing
    # (and realloc churn) happens per instruction.
    if sp < PyList_GET_SIZE(stack):
        stack[sp] = v
        return sp + 1
    return _push_grow(stack, sp, v)


cdef int _run(_Render st, Py_ssize_t pc) except -1:
    """Execute from instruction ``pc`` until RETURN or HALT."""
    cdef Program p = st.program
    cdef int* code = p.code
    cdef tuple consts = p.consts
    cdef list slots = st.slots
    cdef list stack = []
    cdef Py_ssize_t sp = 0
    cdef list loops = []
    cdef list out = st.buffers[len(st.buffers) - 1]
    cdef long fuel = st.fuel
    cdef long check_at = st.check_at
    cdef int op, arg, nargs, i, n
    cdef object a, b, v
    cdef tuple args, kwnames, pairs
    cdef dict kwargs
    cdef LoopContext lc
    cdef Macro m
    cdef Py_ssize_t k
    cdef PyObject* pv
    cdef object obj, spec
    # Output `+` chain state: >0 str pieces pending on the stack, 0 at a chain's
    # start, -1 once folded into one value (see CHAIN_ADD).
    cdef Py_ssize_t chain = 0
    while True:
        op = code[2 * pc]
        arg = code[2 * pc + 1]
        pc += 1
        fuel -= 1
        if fuel < check_at:
            st.fuel = fuel
            _checkpoint(st, fuel)
            check_at = st.check_at
        if op == EMIT_CONST:
            v = consts[arg]
            out.append(v)
            _count_output(st, v)
        elif op == LOAD:
            v = slots[arg]
            if v is MISSING:
                v = _undef_name(p.slot_names[arg])
            sp = _push(stack, sp, v)
        elif op == GETATTR:
            a = stack[sp - 1]
            if type(a) is dict and not p.attr_kind[arg]:
                pv = PyDict_GetItem(a, consts[arg])
                if pv != NULL:
                    stack[sp - 1] = <object>pv
                else:
                    stack[sp - 1] = _undef_attr(a, consts[arg])
            elif type(a) is LoopContext and p.attr_kind[arg] >= 2:
                stack[sp - 1] = (<LoopContext>a).attr_code(p.attr_kind[arg], consts[arg])
            else:
                stack[sp - 1] = _getattr(a, consts[arg])
        elif op == EMIT:
            sp -= 1
            v = stack[sp]
            if type(v) is not str:
                if type(v) is Undefined:
                    continue
                v = _str(st, v)
            out.append(v)
            _count_output(st, v)
        elif op == LOAD_CONST:
            sp = _push(stack, sp, consts[arg])
        elif op == STORE:
            sp -= 1
            slots[arg] = stack[sp]
        elif op == COMPARE:
            sp -= 1
            b = stack[sp]
            sp -= 1
            a = stack[sp]
            # `in` scans the container; ==, < compare item by item
            fuel -= _work(b) if arg >= 6 else _work(a)
            sp = _push(stack, sp, _compare(arg, a, b))
        elif op == JUMP_IF_FALSE:
            sp -= 1
            v = stack[sp]
            if v is False or v is None or (v is not True and not v):
                pc = arg
        elif op == JUMP_IF_TRUE:
            sp -= 1
            v = stack[sp]
            if v is True or (v is not False and v is not None and v):
                pc = arg
        elif op == JUMP:
            pc = arg
        elif op == FOR_NEXT:
            lc = <LoopContext>loops[len(loops) - 1]
            lc.index0 += 1
            if lc.index0 < lc.length:
                sp = _push(stack, sp, lc.seq[lc.index0])
            else:
                loops.pop()
                if lc.has_else:
                    sp = _push(stack, sp, lc.length == 0)
                pc = arg
        elif op == FOR_INIT:
            sp -= 1
            v = stack[sp]
            lc = LoopContext.__new__(LoopContext)
            if type(v) is list or type(v) is tuple:
                lc.seq = v
            elif type(v) is Undefined:
                lc.seq = ()
            else:
                _check_items(st, v)
                lc.seq = list(v)
                fuel -= _work(lc.seq)
            lc.index0 = -1
            lc.length = len(lc.seq)
            lc.has_else = arg & 1
            lc.last_changed = MISSING
            loops.append(lc)
            if (arg >> 1) > 0:
                slots[(arg >> 1) - 1] = lc
        elif op == COPY_SLOTS:
            pairs = <tuple>consts[arg]
            for i in range(0, len(pairs), 2):
                slots[<int>pairs[i]] = slots[<int>pairs[i + 1]]
        elif op == FILTER:
            nargs = p.spec_nargs[arg]
            kwnames = <tuple>p.spec_kw[arg]
            n = len(kwnames)
            kwargs = None
            if n:
                kwargs = dict(zip(kwnames, stack[sp - n:sp]))
                sp -= n
            if nargs:
                args = tuple(stack[sp - nargs:sp])
                sp -= nargs
            else:
                args = ()
            sp -= 1
            v = stack[sp]
            fuel -= _work(v)
            st.fuel = fuel
            v = _filter(st, p.spec_id[arg], v, args, kwargs)
            fuel -= _work(v)
            sp = _push(stack, sp, v)
        elif op == TEST:
            nargs = p.spec_nargs[arg]
            kwnames = <tuple>p.spec_kw[arg]
            n = len(kwnames)
            kwargs = None
            if n:
                kwargs = dict(zip(kwnames, stack[sp - n:sp]))
                sp -= n
            if nargs:
                args = tuple(stack[sp - nargs:sp])
                sp -= nargs
            else:
                args = ()
            sp -= 1
            v = stack[sp]
            sp = _push(stack, sp, _test(st, p.spec_id[arg], v, args, kwargs))
        elif op == CALL_METHOD or op == CALL:
            nargs = p.spec_nargs[arg]
            kwnames = <tuple>p.spec_kw[arg]
            n = len(kwnames)
            kwargs = None
            if n:
                kwargs = dict(zip(kwnames, stack[sp - n:sp]))
                sp -= n
            if nargs:
                args = tuple(stack[sp - nargs:sp])
                sp -= nargs
            else:
                args = ()
            sp -= 1
            v = stack[sp]
            fuel -= _work(v)
            st.fuel = fuel
            if op == CALL_METHOD:
                v = _call_method(st, v, <str>p.spec_name[arg], args, kwargs)
            else:
                v = _call(st, v, args, kwargs)
            fuel = st.fuel - _work(v)
            sp = _push(stack, sp, v)
        elif op == JUMP_IF_FALSE_KEEP:
            v = stack[sp - 1]
            if not v:
                pc = arg
            else:
                sp -= 1
        elif op == JUMP_IF_TRUE_KEEP:
            v = stack[sp - 1]
            if v:
                pc = arg
            else:
                sp -= 1
        elif op == NOT:
            sp -= 1
            v = stack[sp]
            sp = _push(stack, sp, not v)
        elif op == GETITEM:
            sp -= 1
            b = stack[sp]
            a = stack[sp - 1]
            if type(a) is dict and type(b) is str:
                pv = PyDict_GetItem(a, b)
                if pv != NULL:
                    stack[sp - 1] = <object>pv
                    continue
            stack[sp - 1] = _getitem(a, b)
        elif op == BINARY:
            sp -= 1
            b = stack[sp]
            sp -= 1
            a = stack[sp]
            v = _binary(st, arg, a, b)
            fuel -= _work(v)
            sp = _push(stack, sp, v)
        elif op == SLICE:
            sp -= 1
            v = stack[sp]
            sp -= 1
            b = stack[sp]
            sp -= 1
            a = stack[sp]
            sp -= 1
            obj = stack[sp]
            if type(obj) is Undefined:
                (<Undefined>obj).fail()
            try:
                v = obj[a:b:v]
                fuel -= _work(v)
                sp = _push(stack, sp, v)
            except TypeError:
                sp = _push(stack, sp, _undef_attr(obj, slice(a, b, v)))
        elif op == NEG:
            stack[sp - 1] = -stack[sp - 1]
        elif op == POS:
            stack[sp - 1] = +stack[sp - 1]
        elif op == BUILD_LIST:
            v = stack[sp - arg:sp]
            sp -= arg
            sp = _push(stack, sp, v)
        elif op == BUILD_TUPLE:
            v = tuple(stack[sp - arg:sp])
            sp -= arg
            sp = _push(stack, sp, v)
        elif op == BUILD_DICT:
            a = stack[sp - 2 * arg:sp]
            sp -= 2 * arg
            v = {}
            for i in range(0, 2 * arg, 2):
                v[a[i]] = a[i + 1]
            sp = _push(stack, sp, v)
        elif op == UNPACK:
            sp -= 1
            v = stack[sp]
            if type(v) is not tuple and type(v) is not list:
                if isinstance(v, str) and PyUnicode_GET_LENGTH(v) > arg:
                    v = v[:arg + 1]  # too many values either way; no tuple of every char
                _check_items(st, v)
                v = tuple(v)
            k = len(v)
            if k > arg:
                if _UNPACK_SAYS_GOT:
                    raise ValueError(f"too many values to unpack (expected {arg}, got {k})")
                raise ValueError(f"too many values to unpack (expected {arg})")
            if k < arg:
                raise ValueError(f"not enough values to unpack (expected {arg}, got {k})")
            for i in range(arg - 1, -1, -1):
                sp = _push(stack, sp, v[i])
        elif op == FOR_BREAK:
            loops.pop()
        elif op == CAPTURE:
            out = []
            st.buffers.append(out)
        elif op == CAPTURE_END:
            st.buffers.pop()
            v = "".join(out)  # its pieces were charged to the output limit
            out = st.buffers[len(st.buffers) - 1]
            sp = _push(stack, sp, v)
        elif op == SET_ATTR:
            sp -= 1
            v = stack[sp]
            sp -= 1
            a = stack[sp]
            if type(a) is not TemplateNamespace:
                raise FrontendError("cannot assign attribute on non-namespace object")
            _check_ns_name(consts[arg])
            (<TemplateNamespace>a).attrs[consts[arg]] = v
        elif op == MAKE_MACRO:
            spec = consts[arg]
            m = Macro.__new__(Macro)
            m.render = st
            m.name = spec[0]
            m.entry = spec[1]
            m.param_slots = spec[2]
            m.param_names = tuple([p.slot_names[s] for s in spec[2]])
            m.num_defaults = spec[3]
            m.owned = spec[4]
            m.varargs_slot = spec[5]
            m.kwargs_slot = spec[6]
            m.caller_slot = spec[7]
            sp = _push(stack, sp, m)
        elif op == SKIP_IF_UNBOUND:
            if slots[arg] is MISSING:
                pc += 1
        elif op == RETURN or op == HALT:
            st.fuel = fuel
            return 0
        elif op == MARK:
            k = len(out)
            while st.counted_pieces < k:
                st.counted_bytes += _utf8_len(out[st.counted_pieces])
                st.counted_pieces += 1
            st.marks.append(st.counted_bytes)
        elif op == MARK_VALUE:
            sp -= 1
            v = stack[sp]
            if type(v) is not int or v < 0:
                raise FrontendError(f"{{% mark %}} segment count must be a nonnegative int, got {v!r}")
            st.marks.append(v)
        elif op == POP:
            sp -= 1
        elif op == DUP:
            sp = _push(stack, sp, stack[sp - 1])
        elif op == LIST_APPEND:
            sp -= 1
            (<list>slots[arg]).append(stack[sp])
        elif op == LOAD_UNDEFINED:
            sp = _push(stack, sp, _undef_hint(consts[arg]))
        elif op == CHAIN_ADD:
            v = stack[sp - 1]
            if chain == 0:
                a = stack[sp - 2]
                if type(a) is str and type(v) is str:
                    chain = 2
                else:
                    sp -= 1
                    stack[sp - 1] = _binary(st, 0, a, v)
                    chain = -1
            elif chain > 0:
                if type(v) is str:
                    chain += 1
                else:
                    a = stack[sp - 1 - chain:sp - 1]
                    _check_join(st, "", a)
                    a = "".join(a)
                    sp -= chain
                    stack[sp - 1] = _binary(st, 0, a, v)
                    fuel -= _work(stack[sp - 1])
                    chain = -1
            else:
                a = stack[sp - 2]
                sp -= 1
                stack[sp - 1] = _binary(st, 0, a, v)
                fuel -= _work(stack[sp - 1])
        elif op == EMIT_CHAIN:
            if chain > 0:
                for k in range(sp - chain, sp):
                    v = stack[k]
                    out.append(v)
                    _count_output(st, v)
                sp -= chain
            else:
                sp -= 1
                v = stack[sp]
                if type(v) is not str:
                    v = "" if type(v) is Undefined else _str(st, v)
                out.append(v)
                _count_output(st, v)
            chain = 0
        elif op == RAISE:
            raise FrontendError(consts[arg])
        elif op == NOP:
            pass
        else:
            raise FrontendError(f"bad opcode {op}")
