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
(fuel), a macro recursion bound, and size caps on strings it builds.
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
    "wordwrap", "striptags", "filesizeformat", "urlencode",
)
cdef enum Flt:
    F_ABS, F_ATTR, F_BATCH, F_CAPITALIZE, F_CENTER, F_DEFAULT, F_DICTSORT, F_ESCAPE
    F_FIRST, F_FLOAT, F_FORCEESCAPE, F_FORMAT, F_INDENT, F_INT, F_ITEMS, F_JOIN, F_LAST
    F_LENGTH, F_LIST, F_LOWER, F_MAP, F_MAX, F_MIN, F_REJECT, F_REJECTATTR, F_REPLACE
    F_REVERSE, F_ROUND, F_SAFE, F_SELECT, F_SELECTATTR, F_SORT, F_STRING, F_SUM, F_TITLE
    F_TOJSON, F_TRIM, F_UNIQUE, F_UPPER, F_WORDCOUNT, F_GROUPBY, F_SLICE, F_TRUNCATE
    F_WORDWRAP, F_STRIPTAGS, F_FILESIZEFORMAT, F_URLENCODE

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

# Sandbox limits.
DEFAULT_FUEL = 20_000_000      # instructions per render
DEFAULT_MAX_DEPTH = 200        # nested macro calls
MAX_RANGE = 100_000            # jinja2's sandbox limit for range()
cdef Py_ssize_t MAX_STRING = 64 * 1024 * 1024   # characters in one built string
cdef Py_ssize_t MAX_OUTPUT = 256 * 1024 * 1024  # characters of output per render

cdef object MISSING = object()   # an unset slot

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


# ============================================================== runtime value types

cdef str _type_repr(object obj):
    """jinja2's object_type_repr: how error messages name a value's type."""
    if obj is None:
        return "None"
    if obj is Ellipsis:
        return "Ellipsis"
    cls = type(obj)
    if cls is TemplateNamespace:
        return "transformers.utils.chat_template_utils.TemplateNamespace object"
    if cls is LoopContext:
        return "jinja2.runtime.LoopContext object"
    if cls is Macro:
        return "jinja2.runtime.Macro object"
    if cls is Undefined:
        return "jinja2.runtime.Undefined object"
    if cls.__module__ == "builtins":
        return f"{cls.__name__} object"
    return f"{cls.__module__}.{cls.__name__} object"


cdef class Undefined:
    """A missing value, with jinja2's default-Undefined semantics.

    Prints as '', is falsy, iterates as empty and has length 0; any other use
    (arithmetic, attribute access, calling, ordering) raises FrontendError with the
    message jinja2 would raise.
    """
    cdef readonly object hint
    cdef readonly object obj
    cdef readonly object name

    cpdef str message(self):
        if self.hint is not None:
            return self.hint
        if self.obj is MISSING:
            return f"{self.name!r} is undefined"
        if not isinstance(self.name, str):
            return f"{_type_repr(self.obj)} has no element {self.name!r}"
        return f"{_type_repr(self.obj)!r} has no attribute {self.name!r}"

    cdef fail(self):
        raise FrontendError(self.message())

    def __str__(self):
        return ""

    def __repr__(self):
        return "Undefined"

    def __bool__(self):
        return False

    def __len__(self):
        return 0

    def __iter__(self):
        return iter(())

    def __eq__(self, other):
        return type(other) is Undefined

    def __ne__(self, other):
        return type(other) is not Undefined

    def __hash__(self):
        return id(Undefined)

    def __lt__(self, other): self.fail()
    def __le__(self, other): self.fail()
    def __gt__(self, other): self.fail()
    def __ge__(self, other): self.fail()
    def __add__(self, other): self.fail()
    def __radd__(self, other): self.fail()
    def __sub__(self, other): self.fail()
    def __rsub__(self, other): self.fail()
    def __mul__(self, other): self.fail()
    def __rmul__(self, other): self.fail()
    def __truediv__(self, other): self.fail()
    def __rtruediv__(self, other): self.fail()
    def __floordiv__(self, other): self.fail()
    def __rfloordiv__(self, other): self.fail()
    def __mod__(self, other): self.fail()
    def __rmod__(self, other): self.fail()
    def __pow__(self, other, mod): self.fail()
    def __rpow__(self, other, mod): self.fail()
    def __neg__(self): self.fail()
    def __pos__(self): self.fail()
    def __abs__(self): self.fail()
    def __int__(self): self.fail()
    def __float__(self): self.fail()
    def __index__(self): self.fail()
    def __getitem__(self, key): self.fail()
    def __call__(self, *args, **kwargs): self.fail()


cdef inline Undefined _new_undefined(object hint, object obj, object name):
    cdef Undefined u = Undefined.__new__(Undefined)
    u.hint = hint
    u.obj = obj
    u.name = name
    return u


cdef inline Undefined _undef_name(str name):
    return _new_undefined(None, MISSING, name)


cdef inline Undefined _undef_attr(object obj, object name):
    return _new_undefined(None, obj, name)


cdef inline Undefined _undef_hint(str hint):
    return _new_undefined(hint, MISSING, None)


cdef class TemplateNamespace:
    """``namespace(...)``: the one mutable object templates can assign attributes on."""
    cdef dict attrs

    def __repr__(self):
        return f"<Namespace {self.attrs!r}>"


cdef object _check_ns_name(object name):
    if isinstance(name, str) and name.startswith("_"):
        raise FrontendError(
            f"Chat templates cannot store underscore-prefixed attributes on a namespace, "
            f"but got {name!r}. Please rename the attribute.")


def _namespace(*args, **kwargs):
    attrs = dict(*args, **kwargs)
    for name in attrs:
        _check_ns_name(name)
    cdef TemplateNamespace ns = TemplateNamespace.__new__(TemplateNamespace)
    ns.attrs = attrs
    return ns


# attr_kind codes of the loop object's attributes (0: not one, 1: dict method).
cdef dict _LOOP_ATTRS = {"index0": 2, "index": 3, "first": 4, "last": 5, "length": 6,
                         "revindex": 7, "revindex0": 8, "previtem": 9, "nextitem": 10,
                         "depth": 11, "depth0": 12, "cycle": 13, "changed": 13}


cdef class LoopContext:
    """The ``loop`` variable of a for loop (also its iteration state)."""
    cdef object seq          # list or tuple being iterated
    cdef Py_ssize_t index0   # -1 before the first item
    cdef Py_ssize_t length
    cdef bint has_else
    cdef object last_changed

    def __repr__(self):
        return f"<LoopContext {self.index0 + 1}/{self.length}>"

    cdef object attr(self, str name):
        cdef int code = _LOOP_ATTRS.get(name, 0)
        return self.attr_code(code, name)

    cdef object attr_code(self, int code, str name):
        cdef Py_ssize_t i = self.index0
        if code == 2:
            return i
        if code == 3:
            return i + 1
        if code == 4:
            return i == 0
        if code == 5:
            return i == self.length - 1
        if code == 6:
            return self.length
        if code == 7:
            return self.length - i
        if code == 8:
            return self.length - i - 1
        if code == 9:
            if i <= 0:
                return _undef_hint("there is no previous item")
            return self.seq[i - 1]
        if code == 10:
            if i + 1 >= self.length:
                return _undef_hint("there is no next item")
            return self.seq[i + 1]
        if code == 11:
            return 1
        if code == 12:
            return 0
        if code == 13:
            return BoundMethod(self, name)
        return _undef_attr(self, name)

    cdef object call(self, str name, tuple args):
        if name == "cycle":
            if not args:
                raise TypeError("no items for cycling given")
            return args[self.index0 % len(args)]
        if name == "changed":
            if args != self.last_changed:
                self.last_changed = args
                return True
            return False
        raise TypeError(f"'{name}' is not callable")


cdef class Macro:
    """A macro (or the ``caller`` of a call block) bound to one render."""
    cdef _Render render
    cdef readonly str name
    cdef int entry
    cdef tuple param_slots
    cdef tuple param_names
    cdef int num_defaults
    cdef tuple owned
    cdef int varargs_slot
    cdef int kwargs_slot
    cdef int caller_slot

    def __repr__(self):
        return f"<Macro {self.name!r}>"

    def __call__(self, *args, **kwargs):
        return _call_macro(self.render, self, args, kwargs)


cdef class BoundMethod:
    """A whitelisted method of a template value, produced by attribute access."""
    cdef object obj
    cdef str name

    def __cinit__(self, obj, str name):
        self.obj = obj
        self.name = name

    def __repr__(self):
        return f"<built-in method {self.name} of {type(self.obj).__name__} object>"


cdef class Joiner:
    """jinja2's ``joiner(sep)``: '' on the first call, then ``sep``."""
    cdef object sep
    cdef bint used

    def __repr__(self):
        return "<Joiner>"


cdef class Cycler:
    """jinja2's ``cycler(*items)``."""
    cdef tuple items
    cdef Py_ssize_t pos


class Markup(str):
    """Text marked safe (``|safe``, ``|escape``), as markupsafe's Markup behaves in
    jinja2: ``+`` HTML-escapes a plain-str operand. Printing it is plain text."""

    __slots__ = ()

    def __add__(self, other):
        if isinstance(other, str):
            return Markup(str.__add__(self, _escape(other)))
        return NotImplemented

    def __radd__(self, other):
        if isinstance(other, str):
            return Markup(str.__add__(_escape(other), self))
        return NotImplemented

    def __repr__(self):
        return f"Markup({str.__repr__(self)})"


class _GroupTuple(tuple):
    """One ``groupby`` group: ``(grouper, list)``, printed as a plain tuple."""

    __slots__ = ()

    @property
    def grouper(self):
        return self[0]

    @property
    def list(self):
        return self[1]


# ---------------------------------------------------------------- globals

def _raise_exception(message):
    raise FrontendError(message)


def _strftime_now(format):
    return datetime.now().strftime(format)


def _range(*args):
    rng = range(*args)
    if len(rng) > MAX_RANGE:
        raise OverflowError(
            "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).")
    return rng


def _dict(*args, **kwargs):
    return dict(*args, **kwargs)


def _joiner(sep=", "):
    cdef Joiner j = Joiner.__new__(Joiner)
    j.sep = sep
    j.used = False
    return j


def _cycler(*items):
    if not items:
        raise RuntimeError("at least one item has to be provided")
    cdef Cycler c = Cycler.__new__(Cycler)
    c.items = items
    c.pos = 0
    return c


# Globals of Transformers' chat-template environment (jinja2's defaults, with its
# dict and namespace replaced, plus raise_exception and strftime_now).
GLOBALS = {
    "range": _range,
    "dict": _dict,
    "namespace": _namespace,
    "raise_exception": _raise_exception,
    "strftime_now": _strftime_now,
    "joiner": _joiner,
    "cycler": _cycler,
}
cdef frozenset _GLOBAL_FUNCS = frozenset(GLOBALS.values())


# ============================================================== helpers

cdef inline object _str(object v):
    """str() as jinja2 prints: undefined is ''."""
    cdef list pieces
    if type(v) is str:
        return v
    if type(v) is list or type(v) is dict or type(v) is tuple:
        pieces = []
        _repr_into(v, pieces, 0)
        return "".join(pieces)
    return str(v)


cdef int _repr_into(object v, list out, int depth) except -1:
    """Append repr(v) to ``out`` as pieces; equal to Python's repr for the acyclic
    list/dict/tuple trees templates see (no per-container writer or Py_ReprEnter).
    Deep nesting defers to Python's own repr."""
    cdef object t = type(v)
    cdef bint first = True
    cdef Py_ssize_t pos = 0
    cdef PyObject* pkey
    cdef PyObject* pitem
    if t is str:
        out.append(repr(v))
    elif depth > 64 or (t is not list and t is not dict and t is not tuple):
        out.append(repr(v))
    elif t is dict:
        out.append("{")
        while PyDict_Next(v, &pos, &pkey, &pitem):
            if not first:
                out.append(", ")
            first = False
            _repr_into(<object>pkey, out, depth + 1)
            out.append(": ")
            _repr_into(<object>pitem, out, depth + 1)
        out.append("}")
    else:
        out.append("[" if t is list else "(")
        for item in v:
            if not first:
                out.append(", ")
            first = False
            _repr_into(item, out, depth + 1)
        if t is tuple and len(v) == 1:
            out.append(",")
        out.append("]" if t is list else ")")
    return 0


cdef Py_ssize_t _utf8_len(str s):
    cdef Py_ssize_t n = PyUnicode_GET_LENGTH(s), i, total
    cdef int kind
    cdef void* data
    cdef Py_UCS4 c
    if PyUnicode_IS_ASCII(s):
        return n
    kind = PyUnicode_KIND(s)
    data = PyUnicode_DATA(s)
    total = 0
    for i in range(n):
        c = PyUnicode_READ(kind, data, i)
        if c < 0x80:
            total += 1
        elif c < 0x800:
            total += 2
        elif c < 0x10000:
            total += 3
        else:
            total += 4
    return total


cdef object _guard_size(object v):
    if (type(v) is str or type(v) is list or type(v) is tuple) and len(v) > MAX_STRING:
        raise FrontendError(f"template built a value longer than {MAX_STRING} items")
    return v


cdef object _ignore_case(object v):
    if isinstance(v, str):
        return v.lower()
    return v


cdef list _attr_parts(object attribute):
    if attribute is None:
        return []
    if isinstance(attribute, str):
        return [int(x) if x.isdigit() else x for x in attribute.split(".")]
    return [attribute]


cdef object _attrget(list parts, object item, object default, bint lower):
    for part in parts:
        item = _getitem(item, part)
        if default is not None and type(item) is Undefined:
            item = default
    if lower:
        item = _ignore_case(item)
    return item


# ============================================================== sandboxed access

cdef object _unsafe(object obj, str name):
    return _undef_hint(f"access to attribute {name!r} of {type(obj).__name__!r} object is unsafe.")


cdef object _getattr(object obj, str name):
    """jinja2 sandbox getattr: attribute first, then item; unsafe attributes undefined."""
    cdef object t = type(obj)
    cdef PyObject* p
    if t is dict:
        if name in _DICT_METHODS:
            return BoundMethod(obj, name)
        if name in _DICT_MUTATORS:
            return _unsafe(obj, name)
        p = PyDict_GetItem(obj, name)
        if p != NULL:
            return <object>p
        return _undef_attr(obj, name)
    if t is Undefined:
        (<Undefined>obj).fail()
    if t is LoopContext:
        return (<LoopContext>obj).attr(name)
    if t is TemplateNamespace:
        p = PyDict_GetItem((<TemplateNamespace>obj).attrs, name)
        if p != NULL:
            return <object>p
        return _undef_attr(obj, name)
    if name.startswith("_"):
        return _undef_attr(obj, name)
    if t is str:
        if name in _STR_METHODS:
            return BoundMethod(obj, name)
        return _undef_attr(obj, name)
    if t is list:
        if name in _LIST_METHODS:
            return BoundMethod(obj, name)
        if name in _LIST_MUTATORS:
            return _unsafe(obj, name)
        return _undef_attr(obj, name)
    if t is tuple:
        if name in _TUPLE_METHODS:
            return BoundMethod(obj, name)
        return _undef_attr(obj, name)
    if t is int or t is float or t is bool:
        if name in _NUMBER_METHODS and hasattr(obj, name):
            v = getattr(obj, name)
            if callable(v):
                return BoundMethod(obj, name)
            return v
        return _undef_attr(obj, name)
    if t is Cycler:
        if name == "current":
            return (<Cycler>obj).items[(<Cycler>obj).pos]
        if name == "next" or name == "reset":
            return BoundMethod(obj, name)
    if t is Macro and name == "name":
        return (<Macro>obj).name
    if t is _GroupTuple and (name == "grouper" or name == "list"):
        return obj[0] if name == "grouper" else obj[1]
    return _undef_attr(obj, name)


cdef object _getitem(object obj, object key):
    """jinja2 sandbox getitem: item first, then (for str keys) attribute."""
    cdef PyObject* p
    cdef object t = type(obj)
    if t is dict:
        try:
            p = PyDict_GetItem(obj, key)
        except TypeError:
            p = NULL
        if p != NULL:
            return <object>p
    elif t is Undefined:
        (<Undefined>obj).fail()
    elif t is list or t is tuple or t is str:
        try:
            return obj[key]
        except (TypeError, LookupError):
            pass
    if isinstance(key, str):
        if key.startswith("_"):
            if key.startswith("__"):
                raise FrontendError(f"access to attribute {key!r} is unsafe")
            return _undef_attr(obj, key)
        v = _getattr(obj, key)
        return v
    return _undef_attr(obj, key)


cdef object _format_string(str fmt, tuple args, dict kwargs):
    # str.format can reach attributes ("{0.__class__}"); jinja2's sandbox routes those
    # through its getattr, we allow only plain and numbered fields.
    for _, field, spec, _ in _formatter.parse(fmt):
        if field is not None and ("." in field or "[" in field):
            raise FrontendError(f"access to attributes in format fields is unsafe: {field!r}")
        if spec and ("." in spec and "{" in spec):
            raise FrontendError("nested format fields with attributes are unsafe")
    return fmt.format(*args, **kwargs)


cdef object _call_method(_Render st, object obj, str name, tuple args, dict kwargs):
    """``obj.name(*args, **kwargs)`` under the sandbox's rules."""
    cdef object t = type(obj)
    if t is str:
        if name in _STR_METHODS:
            if name == "format":
                return _guard_size(_format_string(obj, args, kwargs or {}))
            if kwargs:
                return _guard_size(getattr(obj, name)(*args, **kwargs))
            return _guard_size(getattr(obj, name)(*args))
    elif t is dict:
        if name == "get":
            if kwargs:
                return (<dict>obj).get(*args, **kwargs)
            if len(args) == 1:
                key = args[0]
                try:
                    p = PyDict_GetItem(obj, key)
                except TypeError:
                    return (<dict>obj).get(key)
                return <object>p if p != NULL else None
            return (<dict>obj).get(*args)
        if name == "items":
            if args or kwargs:
                raise TypeError(f"dict.items() takes no arguments ({len(args)} given)")
            return list(PyDict_Items(obj))
        if name in _DICT_METHODS:
            return getattr(obj, name)(*args, **(kwargs or {}))
    elif t is list:
        if name in _LIST_METHODS:
            return getattr(obj, name)(*args, **(kwargs or {}))
    elif t is tuple:
        if name in _TUPLE_METHODS:
            return getattr(obj, name)(*args, **(kwargs or {}))
    elif t is LoopContext:
        if name == "cycle" or name == "changed":
            return (<LoopContext>obj).call(name, args)
    elif t is Cycler:
        if name == "next":
            c = <Cycler>obj
            v = c.items[c.pos]
            c.pos = (c.pos + 1) % len(c.items)
            return v
        if name == "reset":
            (<Cycler>obj).pos = 0
            return None
    elif t is Undefined:
        (<Undefined>obj).fail()
    elif (t is int or t is float or t is bool) and name in _NUMBER_METHODS:
        return getattr(obj, name)(*args, **(kwargs or {}))
    return _call(st, _getattr(obj, name), args, kwargs)


cdef object _call(_Render st, object func, tuple args, dict kwargs):
    """Call a template value; only macros, globals and whitelisted methods are callable."""
    cdef object t = type(func)
    if t is Macro:
        return _call_macro(st, <Macro>func, args, kwargs)
    if t is BoundMethod:
        return _call_method(st, (<BoundMethod>func).obj, (<BoundMethod>func).name, args, kwargs)
    if t is Undefined:
        (<Undefined>func).fail()
    if func in _GLOBAL_FUNCS:
        if kwargs:
            return func(*args, **kwargs)
        return func(*args)
    if t is Joiner:
        j = <Joiner>func
        if not j.used:
            j.used = True
            return ""
        return j.sep
    raise TypeError(f"'{t.__name__}' object is not callable")


cdef object _call_macro(_Render st, Macro m, tuple args, dict kwargs):
    cdef list slots = st.slots
    cdef Py_ssize_t nparams = len(m.param_slots), nargs = len(args), i
    cdef Py_ssize_t first_default = nparams - m.num_defaults
    cdef list saved
    cdef list buf
    if nargs > nparams and m.varargs_slot < 0:
        raise TypeError(f"macro {m.name!r} takes not more than {nparams} argument(s)")
    if kwargs is None:
        kwargs = {}
    else:
        kwargs = dict(kwargs)
    caller = kwargs.pop("caller", MISSING)
    if caller is not MISSING and m.caller_slot < 0:
        raise TypeError(f"macro {m.name!r} was invoked with two values for the special "
                        "caller argument. This is most likely a bug.")
    if st.depth >= st.program.max_depth:
        raise FrontendError(
            f"template recursion too deep: more than {st.program.max_depth} nested macro calls")
    saved = [slots[s] for s in m.owned]
    for s in m.owned:
        slots[s] = MISSING
    for i in range(nparams):
        name = m.param_names[i]
        if i < nargs:
            slots[m.param_slots[i]] = args[i]
        elif name in kwargs:
            slots[m.param_slots[i]] = kwargs.pop(name)
        elif i < first_default:
            slots[m.param_slots[i]] = _undef_hint(f"parameter {name!r} was not provided")
    if m.varargs_slot >= 0:
        slots[m.varargs_slot] = tuple(args[nparams:])
    if m.kwargs_slot >= 0:
        slots[m.kwargs_slot] = kwargs
    elif kwargs:
        raise TypeError(f"macro {m.name!r} takes no keyword argument {next(iter(kwargs))!r}")
    if m.caller_slot >= 0:
        slots[m.caller_slot] = caller if caller is not MISSING else _undef_name("caller")
    buf = []
    st.buffers.append(buf)
    st.depth += 1
    try:
        _run(st, m.entry)
    finally:
        st.depth -= 1
        st.buffers.pop()
        for i in range(len(m.owned)):
            slots[m.owned[i]] = saved[i]
    return "".join(buf)


# ============================================================== operators

cdef object _binary(int op, object a, object b):
    cdef object r
    if op == 0:
        r = a + b
        if type(r) is str or type(r) is list:
            _guard_size(r)
        return r
    if op == 1:
        return a - b
    if op == 2:
        if (type(a) is int and type(b) in (str, list, tuple)) or \
                (type(b) is int and type(a) in (str, list, tuple)):
            n = a if type(a) is int else b
            s = b if type(a) is int else a
            if n > 0 and len(s) * n > MAX_STRING:
                raise FrontendError(f"template built a value longer than {MAX_STRING} items")
        return a * b
    if op == 3:
        return a / b
    if op == 4:
        return a // b
    if op == 5:
        return a % b
    if op == 6:
        if type(a) is int and type(b) is int and b > 4096 and a not in (0, 1, -1):
            raise FrontendError("exponent too large")
        return a ** b
    # CONCAT
    r = _str(a) + _str(b)
    if PyUnicode_GET_LENGTH(r) > MAX_STRING:
        raise FrontendError(f"template built a value longer than {MAX_STRING} items")
    return r


cdef int _str_contains(str hay, str needle):
    """``needle in hay`` for Latin-1 strings via memchr + memcmp; -1 when the caller
    should use CPython's search instead (other string kinds, or a needle whose first
    character is so frequent that candidate checks would dominate)."""
    cdef Py_ssize_t n = PyUnicode_GET_LENGTH(hay), m = PyUnicode_GET_LENGTH(needle)
    cdef const char* h
    cdef const char* nd
    cdef const char* p
    cdef const char* end
    cdef Py_ssize_t candidates = 0
    if PyUnicode_KIND(hay) != 1 or PyUnicode_KIND(needle) != 1:
        return -1
    if m == 0:
        return 1
    if m > n:
        return 0
    h = <const char*>PyUnicode_DATA(hay)
    nd = <const char*>PyUnicode_DATA(needle)
    p = h
    end = h + (n - m + 1)
    while p < end:
        p = <const char*>memchr(p, nd[0], end - p)
        if p == NULL:
            return 0
        if memcmp(p, nd, m) == 0:
            return 1
        p += 1
        candidates += 1
        if candidates > 64 and candidates * 32 > p - h:
            return -1
    return 0


cdef inline bint _contains(object container, object item) except -1:
    """Python's ``item in container``, with a faster search for str in str."""
    cdef int found
    if type(container) is str and type(item) is str:
        found = _str_contains(<str>container, <str>item)
        if found >= 0:
            return found
    return PySequence_Contains(container, item) == 1


cdef object _compare(int op, object a, object b):
    if op == 0:
        return PyObject_RichCompare(a, b, Py_EQ)
    if op == 1:
        return PyObject_RichCompare(a, b, Py_NE)
    if op == 2:
        return PyObject_RichCompare(a, b, Py_LT)
    if op == 3:
        return PyObject_RichCompare(a, b, Py_LE)
    if op == 4:
        return PyObject_RichCompare(a, b, Py_GT)
    if op == 5:
        return PyObject_RichCompare(a, b, Py_GE)
    if op == 6:
        return _contains(b, a)
    return not _contains(b, a)


# ============================================================== filters and tests

def _generator(items):
    """A real generator over ``items`` (jinja2 filters return generators)."""
    for item in items:
        yield item


def _failing_generator(exc):
    raise exc
    yield


cdef list _bind(str fname, tuple args, dict kwargs, tuple names, tuple defaults):
    """Bind filter arguments (after the value) like a Python signature would."""
    cdef Py_ssize_t n = len(names), i
    if len(args) > n:
        raise TypeError(f"{fname}() takes at most {n + 1} positional arguments "
                        f"({len(args) + 1} given)")
    cdef list out = list(args) + list(defaults[len(args):])
    if kwargs:
        for k, v in kwargs.items():
            try:
                i = names.index(k)
            except ValueError:
                raise TypeError(f"{fname}() got an unexpected keyword argument {k!r}")
            if i < len(args):
                raise TypeError(f"{fname}() got multiple values for argument {k!r}")
            out[i] = v
    return out


cdef object _escape(object v):
    """markupsafe.escape: Markup passes through, anything else is HTML-escaped."""
    if isinstance(v, Markup):
        return v
    s = str(v)
    return Markup(s.replace("&", "&amp;").replace(">", "&gt;").replace("<", "&lt;")
                  .replace("'", "&#39;").replace('"', "&#34;"))


# ---------------------------------------------------------------- tojson
#
# Transformers' tojson filter is json.dumps(x, ensure_ascii=False, indent=None,
# separators=None, sort_keys=False). This encoder produces the same bytes (same
# separators, indentation, key conversion, float/int repr, string escapes, error
# messages) without building a JSONEncoder per call, and appends clean strings
# without copying them.


cdef int _JSON_MAX_DEPTH = 900
cdef const char* _HEX = b"0123456789abcdef"


cdef class _JsonEncoder:
    """Writes JSON into a growable UCS4 buffer, turned into one str at the end."""
    cdef Py_UCS4* buf
    cdef Py_ssize_t n
    cdef Py_ssize_t cap
    cdef bint ensure_ascii
    cdef object indent      # None or the indent unit string
    cdef str item_sep
    cdef str key_sep
    cdef bint sort_keys

    def __dealloc__(self):
        free(self.buf)

    cdef int reserve(self, Py_ssize_t extra) except -1:
        cdef Py_ssize_t cap
        cdef Py_UCS4* grown
        if self.n + extra <= self.cap:
            return 0
        cap = max(self.cap * 2, self.n + extra, 256)
        if cap > MAX_STRING + 64:
            raise FrontendError(f"template built a value longer than {MAX_STRING} items")
        grown = <Py_UCS4*>realloc(self.buf, cap * sizeof(Py_UCS4))
        if grown == NULL:
            raise MemoryError()
        self.buf = grown
        self.cap = cap
        return 0

    cdef inline int put(self, Py_UCS4 c) except -1:
        if self.n == self.cap:
            self.reserve(1)
        self.buf[self.n] = c
        self.n += 1
        return 0

    cdef int text(self, str s) except -1:
        """Copy ``s`` verbatim."""
        cdef Py_ssize_t i, m = PyUnicode_GET_LENGTH(s)
        cdef int kind = PyUnicode_KIND(s)
        cdef void* data = PyUnicode_DATA(s)
        self.reserve(m)
        for i in range(m):
            self.buf[self.n + i] = PyUnicode_READ(kind, data, i)
        self.n += m
        return 0

    cdef int escaped(self, unsigned int c) except -1:
        self.put(92)  # backslash
        if c == 0x22 or c == 0x5c:
            self.put(c)
        elif c == 0x0a:
            self.put(110)  # n
        elif c == 0x0d:
            self.put(114)  # r
        elif c == 0x09:
            self.put(116)  # t
        elif c == 0x08:
            self.put(98)   # b
        elif c == 0x0c:
            self.put(102)  # f
        else:
            self.put(117)  # u
            self.put(<unsigned char>_HEX[(c >> 12) & 15])
            self.put(<unsigned char>_HEX[(c >> 8) & 15])
            self.put(<unsigned char>_HEX[(c >> 4) & 15])
            self.put(<unsigned char>_HEX[c & 15])
        return 0

    cdef int string(self, str s) except -1:
        """``s`` as a JSON string literal, escaped exactly as json.dumps escapes it
        (control characters, quote and backslash; with ensure_ascii also everything
        outside ' '..'~', astral characters as surrogate pairs)."""
        cdef Py_ssize_t i, m = PyUnicode_GET_LENGTH(s)
        cdef int kind = PyUnicode_KIND(s)
        cdef void* data = PyUnicode_DATA(s)
        cdef const unsigned char* latin1
        cdef Py_UCS4* dst
        cdef unsigned int c
        self.reserve(m + 2)
        self.buf[self.n] = 34
        self.n += 1
        if kind == 1 and not self.ensure_ascii:
            # Latin-1 text (the common case): one pass, escapes are rare.
            latin1 = <const unsigned char*>data
            for i in range(m):
                c = latin1[i]
                if c >= 0x20 and c != 0x22 and c != 0x5c:
                    if self.n == self.cap:
                        self.reserve(m - i + 1)
                    self.buf[self.n] = c
                    self.n += 1
                else:
                    self.escaped(c)
        else:
            for i in range(m):
                c = PyUnicode_READ(kind, data, i)
                if c >= 0x20 and c != 0x22 and c != 0x5c and (c < 0x7f or not self.ensure_ascii):
                    if self.n == self.cap:
                        self.reserve(m - i + 1)
                    self.buf[self.n] = c
                    self.n += 1
                elif c > 0xffff:
                    c -= 0x10000
                    self.escaped(0xd800 | ((c >> 10) & 0x3ff))
                    self.escaped(0xdc00 | (c & 0x3ff))
                else:
                    self.escaped(c)
        self.put(34)
        return 0

    cdef int value(self, object o, int level) except -1:
        cdef object t = type(o)
        if t is str:
            self.string(o)
        elif t is dict:
            self.mapping(o, level)
        elif o is None:
            self.text("null")
        elif o is True:
            self.text("true")
        elif o is False:
            self.text("false")
        elif isinstance(o, str):
            self.string(o)
        elif isinstance(o, int):
            self.text(int.__repr__(o))
        elif isinstance(o, float):
            self.text(_json_float(o))
        elif isinstance(o, (list, tuple)):
            self.array(o, level)
        elif isinstance(o, dict):
            self.mapping(o, level)
        else:
            raise TypeError(f"Object of type {o.__class__.__name__} is not JSON serializable")
        return 0

    cdef int open(self, Py_UCS4 bracket, int level) except -1:
        if level >= _JSON_MAX_DEPTH:
            raise RecursionError("maximum recursion depth exceeded while encoding a JSON object")
        self.put(bracket)
        if self.indent is not None:
            self.newline(level + 1)
        return 0

    cdef int newline(self, int level) except -1:
        cdef int i
        self.put(10)
        for i in range(level):
            self.text(self.indent)
        return 0

    cdef int separator(self, int level) except -1:
        self.text(self.item_sep)
        if self.indent is not None:
            self.newline(level + 1)
        return 0

    cdef int close(self, Py_UCS4 bracket, int level) except -1:
        if self.indent is not None:
            self.newline(level)
        self.put(bracket)
        return 0

    cdef int array(self, object seq, int level) except -1:
        cdef bint first = True
        if not seq:
            self.text("[]")
            return 0
        self.open(91, level)
        for item in seq:
            if not first:
                self.separator(level)
            first = False
            self.value(item, level + 1)
        self.close(93, level)
        return 0

    cdef int mapping(self, dict d, int level) except -1:
        cdef bint first = True
        cdef Py_ssize_t pos = 0
        cdef PyObject* pkey
        cdef PyObject* pitem
        if not d:
            self.text("{}")
            return 0
        self.open(123, level)
        if self.sort_keys:
            for key, item in sorted(d.items()):
                self.member(key, item, level, first)
                first = False
        else:
            # PyDict_Next: no (key, value) tuple per member.
            while PyDict_Next(d, &pos, &pkey, &pitem):
                self.member(<object>pkey, <object>pitem, level, first)
                first = False
        self.close(125, level)
        return 0

    cdef int member(self, object key, object item, int level, bint first) except -1:
        if type(key) is not str:
            if isinstance(key, str):
                pass
            elif isinstance(key, float):
                key = _json_float(key)
            elif key is True:
                key = "true"
            elif key is False:
                key = "false"
            elif key is None:
                key = "null"
            elif isinstance(key, int):
                key = int.__repr__(key)
            else:
                raise TypeError(f"keys must be str, int, float, bool or None, "
                                f"not {key.__class__.__name__}")
        if not first:
            self.separator(level)
        self.string(key)
        self.text(self.key_sep)
        self.value(item, level + 1)
        return 0


cdef str _json_float(object o):
    if o != o:
        return "NaN"
    if o == float("inf"):
        return "Infinity"
    if o == float("-inf"):
        return "-Infinity"
    return float.__repr__(o)


cdef object _tojson(object v, tuple args, dict kwargs):
    cdef list a
    cdef _JsonEncoder enc = _JsonEncoder.__new__(_JsonEncoder)
    if args or kwargs:
        a = _bind("tojson", args, kwargs,
                  ("ensure_ascii", "indent", "separators", "sort_keys"),
                  (False, None, None, False))
    else:
        a = [False, None, None, False]
    indent = a[1]
    if indent is not None and not isinstance(indent, str):
        indent = " " * indent
    enc.ensure_ascii = bool(a[0])
    enc.indent = indent
    if a[2] is not None:
        enc.item_sep, enc.key_sep = a[2]
    elif indent is not None:
        enc.item_sep, enc.key_sep = ",", ": "
    else:
        enc.item_sep, enc.key_sep = ", ", ": "
    enc.sort_keys = bool(a[3])
    enc.buf = NULL
    enc.n = 0
    enc.cap = 0
    enc.value(v, 0)
    return PyUnicode_FromKindAndData(4, enc.buf, enc.n)


cdef object _indent(object s, tuple args, dict kwargs):
    cdef list a = _bind("indent", args, kwargs, ("width", "first", "blank"), (4, False, False))
    width, first, blank = a
    indention = width if isinstance(width, str) else " " * width
    s = s + "\n"
    if blank:
        rv = ("\n" + indention).join(s.splitlines())
    else:
        lines = s.splitlines()
        rv = lines.pop(0)
        if lines:
            rv += "\n" + "\n".join([indention + line if line else line for line in lines])
    if first:
        rv = indention + rv
    return _guard_size(rv)


cdef str _url_quote(object obj, bint for_qs):
    if not isinstance(obj, bytes):
        obj = str(obj).encode("utf-8")
    rv = _quote_from_bytes(obj, b"" if for_qs else b"/")
    return rv.replace("%20", "+") if for_qs else rv


cdef object _select(_Render st, object value, tuple args, dict kwargs, bint lookup_attr,
                    bint want):
    cdef list parts = None
    cdef Py_ssize_t off = 0
    cdef list out = []
    cdef int tid = -1
    if lookup_attr:
        parts = _attr_parts(args[0])
        off = 1
    test_args = ()
    if len(args) > off:
        name = args[off]
        test_args = tuple(args[off + 1:])
        try:
            tid = TEST_NAMES.index(_TEST_ALIASES.get(name, name))
        except ValueError:
            raise FrontendError(f"No test named {name!r}.")
    if not value:
        return out
    for item in value:
        x = _attrget(parts, item, None, False) if lookup_attr else item
        if tid >= 0:
            ok = _test(st, tid, x, test_args, kwargs)
        else:
            ok = PyObject_IsTrue(x) == 1
        if ok == want:
            out.append(item)
    return out


_TEST_ALIASES = {"==": "eq", "equalto": "eq", "!=": "ne", "<": "lt", "lessthan": "lt",
                 "<=": "le", ">": "gt", "greaterthan": "gt", ">=": "ge"}
_FILTER_ALIASES = {"d": "default", "e": "escape", "count": "length"}


cdef object _map(_Render st, object value, tuple args, dict kwargs):
    cdef list out = []
    cdef list parts
    if not args and kwargs and "attribute" in kwargs:
        kwargs = dict(kwargs)
        parts = _attr_parts(kwargs.pop("attribute"))
        default = kwargs.pop("default", None)
        if kwargs:
            raise FrontendError(f"Unexpected keyword argument {next(iter(kwargs))!r}")
        if value:
            for item in value:
                out.append(_attrget(parts, item, default, False))
        return out
    if not args:
        raise FrontendError("map requires a filter argument")
    name = args[0]
    try:
        fid = FILTER_NAMES.index(_FILTER_ALIASES.get(name, name))
    except ValueError:
        raise FrontendError(f"No filter named {name!r}.")
    rest = tuple(args[1:])
    if value:
        for item in value:
            out.append(_filter(st, fid, item, rest, kwargs))
    return out


cdef object _min_max(object value, tuple args, dict kwargs, bint is_max):
    cdef list a = _bind("max" if is_max else "min", args, kwargs,
                        ("case_sensitive", "attribute"), (False, None))
    items = list(value)
    if not items:
        return _undef_hint("No aggregated item, sequence was empty.")
    parts = _attr_parts(a[1])
    lower = not a[0]
    key = lambda item: _attrget(parts, item, None, lower)
    return max(items, key=key) if is_max else min(items, key=key)


cdef object _sort(object value, tuple args, dict kwargs):
    cdef list a = _bind("sort", args, kwargs,
                        ("reverse", "case_sensitive", "attribute"), (False, False, None))
    reverse, case_sensitive, attribute = a
    lower = not case_sensitive
    if attribute is None:
        key = _ignore_case if lower else None
        return sorted(value, key=(lambda x: _ignore_case(x)) if lower else None,
                      reverse=reverse)
    if isinstance(attribute, str):
        multi = [_attr_parts(x) for x in attribute.split(",")]
    else:
        multi = [_attr_parts(attribute)]
    def key(item):
        return [_attrget(p, item, None, lower) for p in multi]
    return sorted(value, key=key, reverse=reverse)


cdef object _filter(_Render st, int fid, object v, tuple args, dict kwargs):
    cdef list a
    if fid == F_LENGTH:
        return len(v)
    if fid == F_TRIM:
        if not args and not kwargs:
            return _str(v).strip()
        a = _bind("trim", args, kwargs, ("chars",), (None,))
        return _str(v).strip(a[0])
    if fid == F_TOJSON:
        return _tojson(v, args, kwargs)
    if fid == F_STRING:
        return _str(v)
    if fid == F_SAFE:
        return v if isinstance(v, Markup) else Markup(_str(v))
    if fid == F_DEFAULT:
        a = _bind("default", args, kwargs, ("default_value", "boolean"), ("", False))
        if type(v) is Undefined or (a[1] and not v):
            return a[0]
        return v
    if fid == F_ITEMS:
        # jinja2's do_items is a generator: a non-mapping fails only when iterated.
        if type(v) is Undefined:
            return _generator(())
        if not isinstance(v, _abc.Mapping):
            return _failing_generator(TypeError("Can only get item pairs from a mapping."))
        return _generator(list(v.items()))
    if fid == F_JOIN:
        if not kwargs and len(args) <= 1 and (not args or type(args[0]) is str):
            return _guard_size((args[0] if args else "").join([_str(x) for x in v]))
        a = _bind("join", args, kwargs, ("d", "attribute"), ("", None))
        if a[1] is not None:
            parts = _attr_parts(a[1])
            v = [_attrget(parts, x, None, False) for x in v]
        return _guard_size(_str(a[0]).join([_str(x) for x in v]))
    if fid == F_UPPER:
        return _str(v).upper()
    if fid == F_LOWER:
        return _str(v).lower()
    if fid == F_LIST:
        return list(v)
    if fid == F_FIRST:
        for x in v:
            return x
        return _undef_hint("No first item, sequence was empty.")
    if fid == F_LAST:
        if type(v) is Undefined:
            return _undef_hint("No last item, sequence was empty.")
        for x in reversed(v):
            return x
        return _undef_hint("No last item, sequence was empty.")
    if fid == F_REPLACE:
        a = _bind("replace", args, kwargs, ("old", "new", "count"), (None, None, None))
        s = _str(v)
        old = _str(a[0])
        new = _str(a[1])
        count = -1 if a[2] is None else a[2]
        if len(new) > len(old) and old and s.count(old) * (len(new) - len(old)) > MAX_STRING:
            raise FrontendError(f"template built a value longer than {MAX_STRING} items")
        return _guard_size(s.replace(old, new, count))
    if fid == F_DICTSORT:
        a = _bind("dictsort", args, kwargs, ("case_sensitive", "by", "reverse"),
                  (False, "key", False))
        if a[1] == "key":
            pos = 0
        elif a[1] == "value":
            pos = 1
        else:
            raise FrontendError('You can only sort by either "key" or "value"')
        cs = a[0]
        return sorted(v.items(), key=lambda item: item[pos] if cs else _ignore_case(item[pos]),
                      reverse=a[2])
    # jinja2 returns generators from these (so e.g. `|tojson` on them fails the same
    # way); we compute eagerly and wrap the result.
    if fid == F_SELECTATTR:
        return _generator(_select(st, v, args, kwargs, True, True))
    if fid == F_REJECTATTR:
        return _generator(_select(st, v, args, kwargs, True, False))
    if fid == F_SELECT:
        return _generator(_select(st, v, args, kwargs, False, True))
    if fid == F_REJECT:
        return _generator(_select(st, v, args, kwargs, False, False))
    if fid == F_MAP:
        return _generator(_map(st, v, args, kwargs))
    if fid == F_INDENT:
        return _indent(v, args, kwargs)
    if fid == F_TITLE:
        return "".join([item[0].upper() + item[1:].lower()
                        for item in _word_beginning_split_re.split(_str(v)) if item])
    if fid == F_CAPITALIZE:
        return _str(v).capitalize()
    if fid == F_INT:
        a = _bind("int", args, kwargs, ("default", "base"), (0, 10))
        try:
            if isinstance(v, str):
                return int(v, a[1])
            return int(v)
        except (TypeError, ValueError):
            try:
                return int(float(v))
            except (TypeError, ValueError):
                return a[0]
    if fid == F_FLOAT:
        a = _bind("float", args, kwargs, ("default",), (0.0,))
        try:
            return float(v)
        except (TypeError, ValueError):
            return a[0]
    if fid == F_ROUND:
        a = _bind("round", args, kwargs, ("precision", "method"), (0, "common"))
        if a[1] not in ("common", "ceil", "floor"):
            raise FrontendError("method must be common, ceil or floor")
        if a[1] == "common":
            return round(v, a[0])
        func = math.ceil if a[1] == "ceil" else math.floor
        return func(v * (10 ** a[0])) / (10 ** a[0])
    if fid == F_ABS:
        return abs(v)
    if fid == F_ATTR:
        a = _bind("attr", args, kwargs, ("name",), (None,))
        if not isinstance(a[0], str):
            return _undef_attr(v, a[0])
        if a[0].startswith("__"):
            raise FrontendError(f"access to attribute {a[0]!r} is unsafe")
        return _getattr(v, a[0])
    if fid == F_UNIQUE:
        a = _bind("unique", args, kwargs, ("case_sensitive", "attribute"), (False, None))
        parts = _attr_parts(a[1])
        seen = set()
        out = []
        for item in v:
            key = _attrget(parts, item, None, not a[0])
            if key not in seen:
                seen.add(key)
                out.append(item)
        return _generator(out)
    if fid == F_SORT:
        return _sort(v, args, kwargs)
    if fid == F_REVERSE:
        if isinstance(v, str):
            return v[::-1]
        try:
            return reversed(v)
        except TypeError:
            out = list(v)
            out.reverse()
            return out
    if fid == F_MIN:
        return _min_max(v, args, kwargs, False)
    if fid == F_MAX:
        return _min_max(v, args, kwargs, True)
    if fid == F_SUM:
        a = _bind("sum", args, kwargs, ("attribute", "start"), (None, 0))
        if a[0] is not None:
            parts = _attr_parts(a[0])
            v = [_attrget(parts, x, None, False) for x in v]
        return sum(v, a[1])
    if fid == F_BATCH:
        a = _bind("batch", args, kwargs, ("linecount", "fill_with"), (None, None))
        linecount = a[0]
        out = []
        tmp = []
        for item in v:
            if len(tmp) == linecount:
                out.append(tmp)
                tmp = []
            tmp.append(item)
        if tmp:
            if a[1] is not None and len(tmp) < linecount:
                tmp += [a[1]] * (linecount - len(tmp))
            out.append(tmp)
        return _generator(out)
    if fid == F_WORDCOUNT:
        return len(_word_re.findall(_str(v)))
    if fid == F_CENTER:
        a = _bind("center", args, kwargs, ("width",), (80,))
        return _guard_size(_str(v).center(a[0]))
    if fid == F_ESCAPE:
        return _escape(v)
    if fid == F_FORCEESCAPE:
        return _escape(str(v))
    if fid == F_GROUPBY:
        a = _bind("groupby", args, kwargs, ("attribute", "default", "case_sensitive"),
                  (MISSING, None, False))
        if a[0] is MISSING:
            raise TypeError("groupby() missing required argument 'attribute'")
        parts = _attr_parts(a[0])
        lower = not a[2]
        key = lambda item: _attrget(parts, item, a[1], lower)
        out = [_GroupTuple((k, list(vals))) for k, vals in
               _itertools.groupby(sorted(v, key=key), key)]
        if lower:
            # The group's key is the first member's real value, not the folded one.
            out = [_GroupTuple((_attrget(parts, g[1][0], a[1], False), g[1])) for g in out]
        return out
    if fid == F_SLICE:
        a = _bind("slice", args, kwargs, ("slices", "fill_with"), (MISSING, None))
        if a[0] is MISSING:
            raise TypeError("slice() missing required argument 'slices'")
        seq = list(v)
        per, extra = divmod(len(seq), a[0])
        out = []
        offset = 0
        for k in range(a[0]):
            start = offset + k * per
            if k < extra:
                offset += 1
            tmp = seq[start:offset + (k + 1) * per]
            if a[1] is not None and k >= extra:
                tmp.append(a[1])
            out.append(tmp)
        return _generator(out)
    if fid == F_TRUNCATE:
        a = _bind("truncate", args, kwargs, ("length", "killwords", "end", "leeway"),
                  (255, False, "...", 5))
        length, killwords, end, leeway = a
        if length < len(end):
            raise FrontendError(f"expected length >= {len(end)}, got {length}")
        if leeway < 0:
            raise FrontendError(f"expected leeway >= 0, got {leeway}")
        if len(v) <= length + leeway:
            return v
        if killwords:
            return v[:length - len(end)] + end
        return v[:length - len(end)].rsplit(" ", 1)[0] + end
    if fid == F_WORDWRAP:
        a = _bind("wordwrap", args, kwargs,
                  ("width", "break_long_words", "wrapstring", "break_on_hyphens"),
                  (79, True, None, True))
        wrap = "\n" if a[2] is None else a[2]
        return wrap.join([wrap.join(_textwrap.wrap(
            line, width=a[0], expand_tabs=False, replace_whitespace=False,
            break_long_words=a[1], break_on_hyphens=a[3])) for line in v.splitlines()])
    if fid == F_STRIPTAGS:
        text = str(v)
        while (start := text.find("<!--")) != -1:
            if (stop := text.find("-->", start)) == -1:
                break
            text = text[:start] + text[stop + 3:]
        while (start := text.find("<")) != -1:
            if (stop := text.find(">", start)) == -1:
                break
            text = text[:start] + text[stop + 1:]
        return _html.unescape(" ".join(text.split()))
    if fid == F_FILESIZEFORMAT:
        a = _bind("filesizeformat", args, kwargs, ("binary",), (False,))
        size = float(v)
        base = 1024 if a[0] else 1000
        prefixes = (("KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB") if a[0]
                    else ("kB", "MB", "GB", "TB", "PB", "EB", "ZB", "YB"))
        if size == 1:
            return "1 Byte"
        if size < base:
            return f"{int(size)} Bytes"
        for k, prefix in enumerate(prefixes):
            unit = base ** (k + 2)
            if size < unit:
                return f"{base * size / unit:.1f} {prefix}"
        return f"{base * size / unit:.1f} {prefix}"
    if fid == F_URLENCODE:
        if isinstance(v, str) or not isinstance(v, _abc.Iterable):
            return _url_quote(v, False)
        items = v.items() if isinstance(v, dict) else v
        return "&".join([f"{_url_quote(k, True)}={_url_quote(x, True)}" for k, x in items])
    if fid == F_FORMAT:
        if args and kwargs:
            raise FrontendError("can't handle positional and keyword arguments at the same time")
        return _guard_size(_str(v) % (kwargs or args))
    raise FrontendError(f"filter {FILTER_NAMES[fid]!r} is not implemented")


cdef bint _test(_Render st, int tid, object v, tuple args, dict kwargs) except -1:
    cdef object t = type(v)
    cdef list a
    if tid == T_DEFINED:
        return t is not Undefined
    if tid == T_UNDEFINED:
        return t is Undefined
    if tid == T_NONE:
        return v is None
    if tid == T_STRING:
        return isinstance(v, str)
    if tid == T_MAPPING:
        return isinstance(v, _abc.Mapping)
    if tid == T_BOOLEAN:
        return v is True or v is False
    if tid == T_FALSE:
        return v is False
    if tid == T_TRUE:
        return v is True
    if tid == T_INTEGER:
        return isinstance(v, int) and v is not True and v is not False
    if tid == T_FLOAT:
        return isinstance(v, float)
    if tid == T_NUMBER:
        return isinstance(v, _Number)
    if tid == T_ITERABLE:
        try:
            iter(v)
        except TypeError:
            return False
        return True
    if tid == T_SEQUENCE:
        if t is Undefined:
            return True
        try:
            len(v)
            v.__getitem__
        except Exception:
            return False
        return True
    if tid == T_CALLABLE:
        return t is Macro or t is BoundMethod or t is Joiner or v in _GLOBAL_FUNCS
    if tid == T_LOWER:
        return _str(v).islower()
    if tid == T_UPPER:
        return _str(v).isupper()
    if tid == T_ESCAPED:
        return False
    if tid == T_FILTER:
        return v in FILTER_NAMES or v in _FILTER_ALIASES
    if tid == T_TEST:
        return v in TEST_NAMES or v in _TEST_ALIASES
    if tid == T_ODD:
        return v % 2 == 1
    if tid == T_EVEN:
        return v % 2 == 0
    a = _bind(TEST_NAMES[tid], args, kwargs, ("other",), (MISSING,))
    other = a[0]
    if other is MISSING:
        raise TypeError(f"test {TEST_NAMES[tid]!r} takes exactly one argument")
    if tid == T_SAMEAS:
        return v is other
    if tid == T_EQ:
        return PyObject_IsTrue(v == other) == 1
    if tid == T_NE:
        return PyObject_IsTrue(v != other) == 1
    if tid == T_LT:
        return PyObject_IsTrue(v < other) == 1
    if tid == T_LE:
        return PyObject_IsTrue(v <= other) == 1
    if tid == T_GT:
        return PyObject_IsTrue(v > other) == 1
    if tid == T_GE:
        return PyObject_IsTrue(v >= other) == 1
    if tid == T_IN:
        return _contains(other, v)
    if tid == T_DIVISIBLEBY:
        return v % other == 0
    raise FrontendError(f"test {TEST_NAMES[tid]!r} is not implemented")


# ============================================================== the program

cdef class Program:
    """One compiled template: immutable bytecode and constants, shared by renders."""

    def __cinit__(self):
        self.code = NULL
        self.spec_id = NULL
        self.spec_nargs = NULL
        self.attr_kind = NULL

    def __init__(self, tuple code, tuple consts, tuple slot_names, tuple root_slots,
                 mark_kind=None, long fuel=DEFAULT_FUEL, int max_depth=DEFAULT_MAX_DEPTH):
        cdef Py_ssize_t i, n = len(code), nc = len(consts)
        if n % 2:
            raise ValueError("code must hold (op, arg) pairs")
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

    def render(self, dict context, bint marked=False):
        """Render with ``context``; returns the text, or (text, marks) when ``marked``."""
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
        for slot, name in self.root_slots:
            p = PyDict_GetItem(context, name)
            if p == NULL:
                p = PyDict_GetItem(GLOBALS, name)
            if p != NULL:
                slots[slot] = <object>p
        try:
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
    method calls and `in` over long strings or lists): one unit per 64 characters
    (copying text is cheap) or per item (each item is an object), so loops over big
    inputs exhaust the budget instead of hanging."""
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
        if fuel < 0:
            st.fuel = fuel
            raise FrontendError("template exceeded its execution budget "
                                f"({p.fuel} instructions)")
        if op == EMIT_CONST:
            v = consts[arg]
            out.append(v)
            st.out_chars += PyUnicode_GET_LENGTH(v)
            if st.out_chars > MAX_OUTPUT:
                raise FrontendError(f"template output exceeded {MAX_OUTPUT} characters")
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
                v = _str(v)
            out.append(v)
            st.out_chars += PyUnicode_GET_LENGTH(v)
            if st.out_chars > MAX_OUTPUT:
                raise FrontendError(f"template output exceeded {MAX_OUTPUT} characters")
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
            if arg >= 6:
                fuel -= _work(b)  # `in` scans the container
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
                lc.seq = list(v)
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
            sp = _push(stack, sp, _binary(arg, a, b))
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
                sp = _push(stack, sp, obj[a:b:v])
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
                v = tuple(v)
            k = len(v)
            if k > arg:
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
            v = "".join(out)
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
                    stack[sp - 1] = _binary(0, a, v)
                    chain = -1
            elif chain > 0:
                if type(v) is str:
                    chain += 1
                else:
                    a = "".join(stack[sp - 1 - chain:sp - 1])
                    sp -= chain
                    stack[sp - 1] = _binary(0, a, v)
                    chain = -1
            else:
                a = stack[sp - 2]
                sp -= 1
                stack[sp - 1] = _binary(0, a, v)
        elif op == EMIT_CHAIN:
            if chain > 0:
                for k in range(sp - chain, sp):
                    v = stack[k]
                    out.append(v)
                    st.out_chars += PyUnicode_GET_LENGTH(v)
                sp -= chain
            else:
                sp -= 1
                v = stack[sp]
                if type(v) is not str:
                    v = "" if type(v) is Undefined else _str(v)
                out.append(v)
                st.out_chars += PyUnicode_GET_LENGTH(v)
            chain = 0
            if st.out_chars > MAX_OUTPUT:
                raise FrontendError(f"template output exceeded {MAX_OUTPUT} characters")
        elif op == RAISE:
            raise FrontendError(consts[arg])
        elif op == NOP:
            pass
        else:
            raise FrontendError(f"bad opcode {op}")
