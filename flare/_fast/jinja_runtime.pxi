# Part of the jinja_vm module (included by jinja_vm.pyx; not compiled on its own).
# Runtime value types (Undefined, Markup, namespaces, loops, macros), the globals of Transformers' environment, and value helpers.

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
    """Text marked safe (``|safe``, ``|escape``), behaving as markupsafe's Markup does
    in jinja2: operators and methods HTML-escape plain-str arguments and keep the
    result marked; printing it is plain text."""

    __slots__ = ()

    def __add__(self, other):
        if isinstance(other, str):
            return Markup(str.__add__(self, _escape(other)))
        return NotImplemented

    def __radd__(self, other):
        if isinstance(other, str):
            return _escape(other).__add__(self)
        return NotImplemented

    def __mul__(self, n):
        return Markup(str.__mul__(self, n))

    __rmul__ = __mul__

    def __mod__(self, value):
        if isinstance(value, tuple):
            value = tuple([_EscapeArg(x) for x in value])
        elif hasattr(type(value), "__getitem__") and not isinstance(value, str):
            value = _EscapeArg(value)
        else:
            value = (_EscapeArg(value),)
        return Markup(str.__mod__(self, value))

    def __getitem__(self, key):
        return Markup(str.__getitem__(self, key))

    def __repr__(self):
        return f"Markup({str.__repr__(self)})"

    def join(self, iterable):
        return Markup(str.join(self, [_escape(x) for x in iterable]))

    def split(self, sep=None, maxsplit=-1):
        return [Markup(x) for x in str.split(self, sep, maxsplit)]

    def rsplit(self, sep=None, maxsplit=-1):
        return [Markup(x) for x in str.rsplit(self, sep, maxsplit)]

    def splitlines(self, keepends=False):
        return [Markup(x) for x in str.splitlines(self, keepends)]

    def replace(self, old, new, count=-1):
        return Markup(str.replace(self, old, _escape(new), count))

    def ljust(self, width, fillchar=" "):
        return Markup(str.ljust(self, width, _escape(fillchar)))

    def rjust(self, width, fillchar=" "):
        return Markup(str.rjust(self, width, _escape(fillchar)))

    def center(self, width, fillchar=" "):
        return Markup(str.center(self, width, _escape(fillchar)))

    def partition(self, sep):
        return tuple([Markup(x) for x in str.partition(self, sep)])

    def rpartition(self, sep):
        return tuple([Markup(x) for x in str.rpartition(self, sep)])

    def format(self, *args, **kwargs):
        return Markup(_MarkupFormatter().vformat(self, args, kwargs))

    def unescape(self):
        return _html.unescape(str(self))

    def striptags(self):
        return _striptags(str(self))


def _markup_wrapper(name):
    method = getattr(str, name)

    def wrapped(self, *args):
        return Markup(method(self, *args))

    wrapped.__name__ = name
    return wrapped


for _name in ("capitalize", "title", "lower", "upper", "lstrip", "rstrip", "strip",
              "expandtabs", "swapcase", "zfill", "casefold", "removeprefix",
              "removesuffix", "translate"):
    setattr(Markup, _name, _markup_wrapper(_name))


class _EscapeArg:
    """An argument of ``Markup % args``: escaped when converted to text."""

    __slots__ = ("obj",)

    def __init__(self, obj):
        self.obj = obj

    def __getitem__(self, key):
        return _EscapeArg(self.obj[key])

    def __str__(self):
        return str(_escape(self.obj))

    def __repr__(self):
        return str(_escape(repr(self.obj)))

    def __int__(self):
        return int(self.obj)

    def __float__(self):
        return float(self.obj)


class _MarkupFormatter(_string.Formatter):
    """``Markup.format``: every replacement field is escaped."""

    def format_field(self, value, format_spec):
        if isinstance(value, Markup):
            if format_spec:
                raise ValueError(f"Format specifier {format_spec} given, but {type(value)} "
                                 "does not define __html_format__.")
            rv = str(value)
        else:
            rv = _string.Formatter.format_field(self, value, str(format_spec))
        return str(_escape(rv))


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


def _dict_fromkeys(*args, **kwargs):
    return dict.fromkeys(*args, **kwargs)


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
cdef frozenset _GLOBAL_FUNCS = frozenset(list(GLOBALS.values()) + [_dict_fromkeys])


# ============================================================== helpers

cdef inline object _str(_Render st, object v):
    """jinja2's soft_str: strings (Markup included) as they are, anything else str();
    undefined is ''. Containers print through our bounded writer; other values
    Python converts only once their text is known to fit the limit."""
    cdef object t
    if isinstance(v, str):
        return v
    t = type(v)
    if t is list or t is dict or t is tuple:
        return _container_repr(v, st.program.max_string_bytes // 2)
    if t is not int and t is not float and t is not bool and v is not None:
        _check_text(st, v)
    return str(v)


cdef inline object _plain(_Render st, object v):
    """str(v) as an exact str (Markup loses its mark), as jinja2's `~` and the
    non-autoescape join/replace filters convert."""
    if type(v) is str:
        return v
    if isinstance(v, str):
        return str.__str__(v)
    return _str(st, v)


cdef Py_ssize_t _utf8_len(object s):
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


cdef object _guard_size(_Render st, object v):
    """The after-the-fact check, for results whose size no guard could predict
    exactly (each such operation is bounded by a guard before it too)."""
    if isinstance(v, str):
        _check_str(st, _str_bytes(v))
    elif type(v) is list or type(v) is tuple:
        _check_collection(st, len(v) * 8)
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
