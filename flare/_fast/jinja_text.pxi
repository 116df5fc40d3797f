# Part of the jinja_vm module (included by jinja_vm.pyx; not compiled on its own).
# Text writers into one UCS4 buffer: the tojson encoder (byte-identical to json.dumps as
# Transformers calls it) and container repr (byte-identical to Python's repr).

# ---------------------------------------------------------------- tojson
#
# Transformers' tojson filter is json.dumps(x, ensure_ascii=False, indent=None,
# separators=None, sort_keys=False). This encoder produces the same bytes (same
# separators, indentation, key conversion, float/int repr, string escapes, error
# messages) without building a JSONEncoder per call, and appends clean strings
# without copying them.


cdef int _JSON_MAX_DEPTH = 900
cdef const char* _HEX = b"0123456789abcdef"


cdef class _TextWriter:
    """A growable UCS4 buffer, turned into one str at the end (no list of pieces)."""
    cdef Py_UCS4* buf
    cdef Py_ssize_t n
    cdef Py_ssize_t cap
    cdef Py_ssize_t limit   # characters the text may reach (set by whoever creates it)

    def __dealloc__(self):
        free(self.buf)

    cdef int reserve(self, Py_ssize_t extra) except -1:
        cdef Py_ssize_t cap
        cdef Py_UCS4* grown
        if self.n + extra <= self.cap:
            return 0
        if self.n + extra > self.limit:
            raise TemplateLimitError(
                f"template would build a text of more than {self.limit} characters "
                f"({4 * self.limit} bytes of buffer)")
        cap = min(max(self.cap * 2, self.n + extra, 256), self.limit)
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

    cdef int text(self, object s) except -1:
        """Copy ``s`` verbatim."""
        cdef Py_ssize_t i, m = PyUnicode_GET_LENGTH(s)
        cdef int kind = PyUnicode_KIND(s)
        cdef void* data = PyUnicode_DATA(s)
        self.reserve(m)
        for i in range(m):
            self.buf[self.n + i] = PyUnicode_READ(kind, data, i)
        self.n += m
        return 0

    cdef int hex(self, unsigned int c, int digits) except -1:
        cdef int shift
        for shift in range(4 * (digits - 1), -4, -4):
            self.put(<unsigned char>_HEX[(c >> shift) & 15])
        return 0

    cdef object result(self):
        return PyUnicode_FromKindAndData(4, self.buf, self.n)


cdef class _JsonEncoder(_TextWriter):
    """Writes JSON the way json.dumps does."""
    cdef bint ensure_ascii
    cdef object indent      # None or the indent unit string
    cdef str item_sep
    cdef str key_sep
    cdef bint sort_keys

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

    cdef int string(self, object s) except -1:
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


cdef object _tojson(_Render st, object v, tuple args, dict kwargs):
    cdef list a
    cdef _JsonEncoder enc = _JsonEncoder.__new__(_JsonEncoder)
    enc.limit = st.program.max_string_bytes // 2
    if args or kwargs:
        a = _bind("tojson", args, kwargs,
                  ("ensure_ascii", "indent", "separators", "sort_keys"),
                  (False, None, None, False))
    else:
        a = [False, None, None, False]
    indent = a[1]
    if indent is not None and not isinstance(indent, str):
        _check_width(st, " ", indent)
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
    enc.value(v, 0)
    return enc.result()


# ---------------------------------------------------------------- repr
#
# Printing a list/dict/tuple ({{ message.content }} with content parts) is Python's
# repr. This writer produces the same text for the acyclic JSON-like trees templates
# see, in one buffer, with CPython's str repr rules (quote choice, escapes,
# printable characters kept).

cdef class _ReprWriter(_TextWriter):

    cdef int string(self, object s) except -1:
        cdef Py_ssize_t i, m = PyUnicode_GET_LENGTH(s)
        cdef int kind = PyUnicode_KIND(s)
        cdef void* data = PyUnicode_DATA(s)
        cdef unsigned int c, quote = 0x27
        cdef bint squote = False, dquote = False
        for i in range(m):
            c = PyUnicode_READ(kind, data, i)
            if c == 0x27:
                squote = True
            elif c == 0x22:
                dquote = True
        if squote and not dquote:
            quote = 0x22
        self.reserve(m + 2)
        self.buf[self.n] = quote
        self.n += 1
        for i in range(m):
            c = PyUnicode_READ(kind, data, i)
            if c == quote or c == 0x5c:
                self.put(0x5c)
                self.put(c)
            elif c == 0x09:
                self.put(0x5c)
                self.put(116)
            elif c == 0x0a:
                self.put(0x5c)
                self.put(110)
            elif c == 0x0d:
                self.put(0x5c)
                self.put(114)
            elif c < 0x20 or c == 0x7f:
                self.put(0x5c)
                self.put(120)
                self.hex(c, 2)
            elif c < 0x7f or Py_UNICODE_ISPRINTABLE(c):
                self.put(c)
            elif c <= 0xff:
                self.put(0x5c)
                self.put(120)
                self.hex(c, 2)
            elif c <= 0xffff:
                self.put(0x5c)
                self.put(117)
                self.hex(c, 4)
            else:
                self.put(0x5c)
                self.put(85)
                self.hex(c, 8)
        self.put(quote)
        return 0

    cdef int value(self, object v, int depth) except -1:
        cdef object t = type(v)
        cdef bint first = True
        cdef Py_ssize_t pos = 0
        cdef PyObject* pkey
        cdef PyObject* pitem
        if t is str:
            self.string(v)
        elif depth > 64 or (t is not list and t is not dict and t is not tuple):
            if t is not int and t is not float and t is not bool and v is not None and \
                    _text_bound(v, self.limit, 1) > self.limit:
                raise TemplateLimitError(
                    f"template would build a text of more than {self.limit} characters")
            self.text(repr(v))
        elif t is dict:
            self.put(123)
            while PyDict_Next(v, &pos, &pkey, &pitem):
                if not first:
                    self.text(", ")
                first = False
                self.value(<object>pkey, depth + 1)
                self.text(": ")
                self.value(<object>pitem, depth + 1)
            self.put(125)
        else:
            self.put(91 if t is list else 40)
            for item in v:
                if not first:
                    self.text(", ")
                first = False
                self.value(item, depth + 1)
            if t is tuple and len(v) == 1:
                self.put(44)
            self.put(93 if t is list else 41)
        return 0


cdef object _container_repr(object v, Py_ssize_t limit):
    """Python's repr of list/dict/tuple ``v``, refused past ``limit`` characters."""
    cdef _ReprWriter w = _ReprWriter.__new__(_ReprWriter)
    w.limit = limit
    w.value(v, 0)
    return w.result()
