# Part of the jinja_vm module (included by jinja_vm.pyx; not compiled on its own).
# Execution budgets: the request deadline and its checkpoint, and the size guards every
# operation that builds an int, a str or a collection runs BEFORE building it.
#
# Sizes are estimates in bytes, the way CPython stores values: a str costs its length
# times its widest character's width (1, 2 or 4 bytes), a collection ITEM_BYTES per
# item plus what its items hold (strings by their size, nested collections
# recursively; a value held twice counts twice, since joining or printing the
# collection would copy it twice). An int costs its bit length. Guards raise
# TemplateLimitError, a FrontendError (a 400 for the request).

from posix.time cimport clock_gettime, timespec, CLOCK_MONOTONIC

cdef extern from "Python.h":
    size_t _PyLong_NumBits(object)


class TemplateLimitError(FrontendError):
    """A render exceeded one of its template's limits (size, fuel, time)."""


class TemplateBudgetError(TemplateLimitError):
    """A render ran out of fuel or of its request's time budget. Unlike other template
    errors it fails the whole request: renders that share the budget cannot succeed."""


cdef Py_ssize_t ITEM_BYTES = 64      # estimated bytes per item of a collection
cdef long CHECK_INTERVAL = 4096      # fuel units between checkpoints
cdef int DEEP_LIMIT = 64             # nesting the estimates descend before giving up


cdef inline double _monotonic() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec + ts.tv_nsec * 1e-9


cdef class RenderBudget:
    """A wall-clock deadline shared by every render done for one request.

    ``RenderBudget(seconds)`` starts the clock; pass the same object to each render
    of the request (the main render and the differential prefix renders).
    """

    def __init__(self, double seconds=DEFAULT_TIME_LIMIT_S):
        if not seconds > 0:
            raise ValueError("a render budget needs a positive number of seconds")
        self.seconds = seconds
        self.deadline = _monotonic() + seconds

    def remaining(self):
        """Seconds left (negative once the deadline passed)."""
        return self.deadline - _monotonic()

    def __repr__(self):
        return f"<RenderBudget {self.seconds} s, {self.remaining():.3f} s left>"


# A function the interpreter runs as bytecode: entering it checks the eval breaker,
# so a pending GIL drop request is honoured there (see _checkpoint).
_yield_point = eval("lambda: None")


cdef int _checkpoint(_Render st, long fuel) except -1:
    """Run every CHECK_INTERVAL units of fuel: let a thread that waits for the GIL
    (the server's event loop) have it, then check fuel and the deadline.

    NOTE: not ``with nogil: pass``. A waiting thread asks for the GIL only after the
    switch interval (5 ms) passed without any switch, and it loses the race to
    re-take a GIL released for an instant; so releasing it often starves the waiter.
    Entering bytecode instead hands the GIL over exactly when a waiter asked, with
    the interpreter's forced switching: another thread waits at most the switch
    interval plus one checkpoint period (tens of microseconds: operations are
    charged fuel by the size of the values they touch)."""
    cdef double now = _monotonic()
    _yield_point()
    st.check_at = fuel - CHECK_INTERVAL if fuel > CHECK_INTERVAL else 0
    if fuel < 0:
        raise TemplateBudgetError(
            f"template exceeded its execution budget ({st.program.fuel} instructions)")
    if now > st.budget.deadline:
        raise TemplateBudgetError(
            f"template exceeded its time budget ({st.budget.seconds:g} s per request)")
    return 0


# ---------------------------------------------------------------- estimates

cdef inline Py_ssize_t _int_bits(object v):
    """Bit length of int ``v`` (of its magnitude)."""
    return <Py_ssize_t>_PyLong_NumBits(v)


cdef inline Py_ssize_t _str_bytes(object s):
    return PyUnicode_GET_LENGTH(s) * PyUnicode_KIND(s)


cdef Py_ssize_t _deep_bytes(object v, Py_ssize_t limit, int depth) except -1:
    """Estimated bytes of ``v`` and what it holds; stops counting once over ``limit``."""
    cdef object t = type(v)
    cdef Py_ssize_t total
    if t is str or isinstance(v, str):
        return ITEM_BYTES + _str_bytes(v)
    if depth > DEEP_LIMIT:
        return ITEM_BYTES
    if t is list or t is tuple or t is _GroupTuple:
        total = ITEM_BYTES
        for x in v:
            total += _deep_bytes(x, limit - total, depth + 1)
            if total > limit:
                return total
        return total
    if t is dict:
        total = ITEM_BYTES
        for key, x in (<dict>v).items():
            total += _deep_bytes(key, limit - total, depth + 1)
            total += _deep_bytes(x, limit - total, depth + 1)
            if total > limit:
                return total
        return total
    if t is TemplateNamespace:
        return ITEM_BYTES + _deep_bytes((<TemplateNamespace>v).attrs, limit, depth + 1)
    return ITEM_BYTES


cdef Py_ssize_t _text_bound(object v, Py_ssize_t limit, int depth) except -1:
    """An upper bound on the characters of str(v) (repr for what a container holds);
    stops counting once over ``limit``. Used before Python itself converts a value
    (``%``, str.format, pprint, escaping), whose output no writer of ours bounds."""
    cdef object t = type(v)
    cdef Py_ssize_t total, n
    cdef int kind
    if t is str or isinstance(v, str):
        n = PyUnicode_GET_LENGTH(v)
        if depth == 0:
            return n
        kind = PyUnicode_KIND(v)
        # repr escapes: \xNN, \uNNNN, \UNNNNNNNN
        return 2 + n * (4 if kind == 1 else 6 if kind == 2 else 10)
    if t is int:
        return _int_bits(v) // 3 + 2
    if t is float or t is bool or v is None:
        return 32
    if depth > DEEP_LIMIT:
        return limit + 1
    if t is list or t is tuple or t is _GroupTuple or t is set or t is frozenset:
        total = 16
        for x in v:
            total += 2 + _text_bound(x, limit - total, depth + 1)
            if total > limit:
                return total
        return total
    if t is dict:
        total = 16
        for key, x in (<dict>v).items():
            total += 4 + _text_bound(key, limit - total, depth + 1)
            total += _text_bound(x, limit - total, depth + 1)
            if total > limit:
                return total
        return total
    if t is TemplateNamespace:
        return 16 + _text_bound((<TemplateNamespace>v).attrs, limit, depth + 1)
    return 256


# ---------------------------------------------------------------- guards

cdef int _refuse_str(_Render st, object nbytes) except -1:
    raise TemplateLimitError(f"template would build a string of {nbytes} bytes "
                             f"(the limit is {st.program.max_string_bytes})")


cdef inline int _check_str(_Render st, Py_ssize_t nbytes) except -1:
    """Refuse a str of ``nbytes`` before it is built."""
    if nbytes > st.program.max_string_bytes or nbytes < 0:
        _refuse_str(st, nbytes)
    return 0


cdef inline int _check_collection(_Render st, Py_ssize_t nbytes) except -1:
    """Refuse a list/tuple/dict estimated at ``nbytes`` before it is built."""
    if nbytes > st.program.max_collection_bytes or nbytes < 0:
        _refuse_collection(st, nbytes)
    return 0


cdef int _check_items(_Render st, object v) except -1:
    """Refuse to run a filter over more items than a collection may hold (sorting,
    grouping or listing a huge input costs time and memory in one step)."""
    cdef object t = type(v)
    cdef Py_ssize_t n
    if t is str or t is list or t is tuple or t is dict or isinstance(v, str):
        n = len(v)
        if n > st.program.max_collection_bytes // ITEM_BYTES:
            _check_collection(st, n * ITEM_BYTES)
    return 0


cdef int _check_text(_Render st, object v) except -1:
    """Refuse to let Python convert ``v`` to text when the text could exceed the limit."""
    cdef Py_ssize_t bound = _text_bound(v, st.program.max_string_bytes, 0)
    if bound > st.program.max_string_bytes:
        _refuse_str(st, f"up to {bound}")
    return 0


cdef int _refuse_collection(_Render st, object nbytes) except -1:
    raise TemplateLimitError(f"template would build a collection of about {nbytes} bytes "
                             f"(the limit is {st.program.max_collection_bytes})")


cdef int _check_repeat(_Render st, object seq, object n) except -1:
    """``seq * n`` (str, list or tuple repeated): refuse before repeating."""
    cdef Py_ssize_t unit, limit
    cdef bint is_str = isinstance(seq, str)
    if n <= 0:
        return 0
    if is_str:
        unit = _str_bytes(seq)
        limit = st.program.max_string_bytes
    else:
        # Each copy repeats what the items hold, not the container's own header.
        limit = st.program.max_collection_bytes
        unit = _deep_bytes(seq, limit, 0) - ITEM_BYTES
    if unit > 0 and n > limit // unit:
        if is_str:
            _refuse_str(st, f"{unit} * {n}")
        _refuse_collection(st, f"{unit} * {n}")
    return 0


cdef int _refuse_int(_Render st, object bits) except -1:
    raise TemplateLimitError(f"template would build an integer of {bits} bits "
                             f"(the limit is {st.program.max_int_bits})")


cdef int _check_int_product(_Render st, object a, object b) except -1:
    """``a * b`` on ints: bits(a*b) <= bits(a) + bits(b)."""
    cdef Py_ssize_t bits = _int_bits(a) + _int_bits(b)
    if bits > st.program.max_int_bits:
        _refuse_int(st, bits)
    return 0


cdef int _check_int_power(_Render st, object a, object b) except -1:
    """``a ** b`` on ints: bits(a**b) = b * log2|a|, refused before computing (so
    ``9 ** 9 ** 9`` fails on its inner power)."""
    cdef Py_ssize_t limit = st.program.max_int_bits
    if b < 0 or a == 0 or a == 1 or a == -1:
        return 0  # a float, or a result of one bit: pow walks b's bits only
    if b > limit:  # |a| >= 2: at least b bits
        _refuse_int(st, f"more than {b}")
    bits = b * math.log2(abs(a))
    if bits > limit:
        _refuse_int(st, f"about {int(bits)}")
    return 0


cdef int _check_join(_Render st, object sep, list parts) except -1:
    """``sep.join(parts)`` (parts all str): refuse before joining."""
    cdef Py_ssize_t total = 0, n = len(parts), kind = PyUnicode_KIND(sep), k
    cdef Py_ssize_t limit = st.program.max_string_bytes
    cdef Py_ssize_t sep_len = PyUnicode_GET_LENGTH(sep)
    if n > 1 and sep_len:
        if sep_len * (n - 1) > limit:
            _refuse_str(st, f"{sep_len} * {n - 1}")
        total = sep_len * (n - 1)
    for x in parts:
        if not isinstance(x, str):
            return 0  # str.join raises TypeError for it
        total += PyUnicode_GET_LENGTH(x)
        k = PyUnicode_KIND(x)
        if k > kind:
            kind = k
        if total > limit:
            _refuse_str(st, f"more than {total}")
    _check_str(st, total * kind)
    return 0


cdef int _check_concat(_Render st, object a, object b, Py_ssize_t factor) except -1:
    """``a + b`` on str values (``factor`` 5 when Markup escapes one)."""
    cdef Py_ssize_t n = PyUnicode_GET_LENGTH(a) + PyUnicode_GET_LENGTH(b)
    cdef int kind = max(PyUnicode_KIND(a), PyUnicode_KIND(b))
    _check_str(st, n * kind * factor)
    return 0


cdef int _check_width(_Render st, object s, object width) except -1:
    """center/ljust/rjust/zfill and ``indent(width)``: ``width`` characters."""
    if type(width) is int and width > 0:
        if width > st.program.max_string_bytes:
            _refuse_str(st, width)
        _check_str(st, <Py_ssize_t>width * PyUnicode_KIND(s))
    return 0


cdef int _check_replace(_Render st, object s, object old, object new, object count) except -1:
    cdef Py_ssize_t n, grow
    if not isinstance(s, str) or not isinstance(old, str) or not isinstance(new, str):
        return 0
    grow = PyUnicode_GET_LENGTH(new) - PyUnicode_GET_LENGTH(old)
    if grow <= 0:
        return 0
    n = s.count(old)  # '' occurs len(s) + 1 times
    if type(count) is int and 0 <= count < n:
        n = count
    if n and grow > st.program.max_string_bytes // n:
        _refuse_str(st, f"{grow} * {n}")
    _check_str(st, (PyUnicode_GET_LENGTH(s) + grow * n)
               * max(PyUnicode_KIND(s), PyUnicode_KIND(new)))
    return 0


cdef Py_ssize_t _count_splits(object s, object sep, bint lines) except -1:
    """An upper bound on the pieces ``s.split(sep)`` / ``s.splitlines()`` gives."""
    cdef Py_ssize_t i, n = PyUnicode_GET_LENGTH(s), count = 1
    cdef int kind = PyUnicode_KIND(s)
    cdef void* data = PyUnicode_DATA(s)
    cdef Py_UCS4 c
    cdef bint prev_space = True
    if not lines and sep is not None:
        if not isinstance(sep, str) or not PyUnicode_GET_LENGTH(sep):
            return 1  # Python raises for it
        return s.count(sep) + 1
    for i in range(n):
        c = PyUnicode_READ(kind, data, i)
        if lines:
            if c == 10 or c == 13 or c == 11 or c == 12 or 28 <= c <= 30 or c == 0x85 \
                    or c == 0x2028 or c == 0x2029:
                count += 1
        elif Py_UNICODE_ISSPACE(c):
            prev_space = True
        elif prev_space:
            prev_space = False
            count += 1
    return count


cdef int _check_split(_Render st, object s, str name, tuple args, dict kwargs) except -1:
    """split/rsplit/splitlines/partition: refuse a list of too many pieces."""
    cdef Py_ssize_t pieces
    if name == "partition" or name == "rpartition":
        return 0
    if name == "splitlines":
        pieces = _count_splits(s, None, True)
    else:
        sep = args[0] if args else (kwargs or {}).get("sep")
        pieces = _count_splits(s, sep, False)
        maxsplit = args[1] if len(args) > 1 else (kwargs or {}).get("maxsplit", -1)
        if type(maxsplit) is int and 0 <= maxsplit < pieces:
            pieces = maxsplit + 1
    _check_collection(st, pieces * ITEM_BYTES + _str_bytes(s))
    return 0


# %-conversions: flags, width (digits or *), precision (digits or *).
_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d+))?")


cdef int _check_percent(_Render st, object fmt, object values) except -1:
    """``fmt % values``: the widths and precisions in ``fmt`` plus the converted
    values' text bound the result."""
    cdef Py_ssize_t limit = st.program.max_string_bytes
    cdef Py_ssize_t total = PyUnicode_GET_LENGTH(fmt)
    cdef bint star = False
    for width, precision in _PERCENT_SPEC.findall(fmt):
        for number in (width, precision):
            if number == "*":
                star = True
            elif number:
                if len(number) > 12:
                    _refuse_str(st, f"a field of {number} characters")
                total += int(number)
    items = values if type(values) is tuple else (values,)
    for x in items:
        if star and type(x) is int:
            total += abs(x) if abs(x) < limit else limit + 1
        total += _text_bound(x, limit, 1 if type(values) is dict else 0)
        if total > limit:
            break
    if total > limit:
        _refuse_str(st, f"up to {total}")
    return 0


cdef int _check_str_format(_Render st, str fmt, tuple args, dict kwargs) except -1:
    """``fmt.format(*args, **kwargs)``: every field may repeat the largest argument,
    padded to the widths the format specs name."""
    cdef Py_ssize_t limit = st.program.max_string_bytes
    cdef Py_ssize_t total = 0, largest = 0, fields = 0
    cdef bint nested = False
    for literal, field, spec, _ in _formatter.parse(fmt):
        total += len(literal)
        if field is None:
            continue
        fields += 1
        if spec:
            if "{" in spec:
                nested = True
            for number in re.findall(r"\d+", spec):
                if len(number) > 12:
                    _refuse_str(st, f"a field of {number} characters")
                total += int(number)
    for x in list(args) + list((kwargs or {}).values()):
        if nested and type(x) is int:
            total += abs(x) if abs(x) < limit else limit + 1
        largest = max(largest, _text_bound(x, limit, 0))
    if fields and largest > (limit - total) // fields:
        _refuse_str(st, f"up to {total + fields * largest}")
    if total > limit:
        _refuse_str(st, f"up to {total}")
    return 0


cdef tuple _check_str_method(_Render st, object s, str name, tuple args, dict kwargs):
    """Size guards for the whitelisted str methods that can build more than they read;
    returns ``args`` (join's iterable made a list, so it is read once)."""
    cdef Py_ssize_t tabs
    if name == "center" or name == "ljust" or name == "rjust" or name == "zfill":
        if args:
            _check_width(st, s, args[0])
    elif name == "replace":
        if len(args) >= 2:
            _check_replace(st, s, args[0], args[1], args[2] if len(args) > 2 else -1)
    elif name == "join":
        if len(args) == 1:
            items = args[0]
            if type(items) is not list:
                _check_items(st, items)
                items = list(items)
                args = (items,)
            if type(s) is Markup:
                # Markup.join escapes each item: at most 5 characters for one.
                bound = _text_bound(items, st.program.max_string_bytes, 0) * 5
                if bound > st.program.max_string_bytes:
                    _refuse_str(st, f"up to {bound}")
            else:
                _check_join(st, s, items)
    elif name == "expandtabs":
        size = args[0] if args else (kwargs or {}).get("tabsize", 8)
        if type(size) is int and size > 0:
            tabs = s.count("\t")
            if tabs and size > st.program.max_string_bytes // tabs:
                _refuse_str(st, f"{size} * {tabs}")
            _check_str(st, (PyUnicode_GET_LENGTH(s) + size * tabs) * PyUnicode_KIND(s))
    elif name == "split" or name == "rsplit" or name == "splitlines":
        _check_split(st, s, name, args, kwargs)
    return args
