# Part of the jinja_vm module (included by jinja_vm.pyx; not compiled on its own).
# Sandboxed attribute/item access, calls (methods, globals, macros) and operators.

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
    if t is str or t is Markup:
        if name in _STR_METHODS or (t is Markup and name in _MARKUP_METHODS):
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
    if obj is _dict and name == "fromkeys":
        # Transformers' `dict` global is a callable object with a fromkeys method.
        return _dict_fromkeys
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
    elif t is list or t is tuple or t is str or t is Markup:
        try:
            return obj[key]
        except (TypeError, LookupError):
            pass
    if isinstance(key, str):
        key = str.__str__(key)
        if key.startswith("_"):
            if key.startswith("__"):
                raise FrontendError(f"access to attribute {key!r} is unsafe")
            return _undef_attr(obj, key)
        v = _getattr(obj, key)
        return v
    return _undef_attr(obj, key)


cdef frozenset _MARKUP_METHODS = frozenset(("unescape", "striptags"))


cdef int _check_format(str fmt) except -1:
    # str.format can reach attributes ("{0.__class__}"); jinja2's sandbox routes those
    # through its getattr, we allow only plain and numbered fields.
    for _, field, spec, _ in _formatter.parse(fmt):
        if field is not None and ("." in field or "[" in field):
            raise FrontendError(f"access to attributes in format fields is unsafe: {field!r}")
        if spec and "{" in spec and ("." in spec or "[" in spec):
            raise FrontendError("nested format fields with attributes are unsafe")
    return 0


cdef object _format_string(_Render st, str fmt, tuple args, dict kwargs):
    _check_format(fmt)
    _check_str_format(st, fmt, args, kwargs)
    return fmt.format(*args, **kwargs)


cdef object _call_method(_Render st, object obj, str name, tuple args, dict kwargs):
    """``obj.name(*args, **kwargs)`` under the sandbox's rules."""
    cdef object t = type(obj)
    if t is str:
        if name in _STR_METHODS:
            if name == "format":
                return _guard_size(st, _format_string(st, obj, args, kwargs or {}))
            args = _check_str_method(st, obj, name, args, kwargs)
            if kwargs:
                return _guard_size(st, getattr(obj, name)(*args, **kwargs))
            return _guard_size(st, getattr(obj, name)(*args))
    elif t is Markup:
        if name in _STR_METHODS or name in _MARKUP_METHODS:
            if name == "format":
                _check_format(str.__str__(obj))
                _check_str_format(st, str.__str__(obj), args, kwargs)
            else:
                args = _check_str_method(st, obj, name, args, kwargs)
                _check_text(st, args)  # arguments Markup escapes
            return _guard_size(st, getattr(obj, name)(*args, **(kwargs or {})))
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
        if func is _dict or func is _namespace or func is _dict_fromkeys:
            # Each call may merge what it is given into a new mapping: bound the
            # result (a loop of dict(d, k=v) would otherwise hoard strings).
            if func is _dict_fromkeys and args:
                _check_items(st, args[0])
            r = func(*args, **kwargs) if kwargs else func(*args)
            _check_collection(st, _deep_bytes(r, st.program.max_collection_bytes, 0))
            return r
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

cdef object _binary(_Render st, int op, object a, object b):
    """A binary operator; what it would build is checked against the limits first."""
    cdef object ta = type(a), tb = type(b)
    if op == 0:
        if isinstance(a, str) and isinstance(b, str):
            # Markup escapes the other operand: at most 5 characters for one.
            _check_concat(st, a, b, 5 if ta is Markup or tb is Markup else 1)
        elif (ta is list and tb is list) or (ta is tuple and tb is tuple):
            _check_collection(st, _deep_bytes(a, st.program.max_collection_bytes, 0)
                              + _deep_bytes(b, st.program.max_collection_bytes, 0))
        return a + b
    if op == 1:
        return a - b
    if op == 2:
        if ta is int and tb is int:
            _check_int_product(st, a, b)
        elif (ta is int or ta is bool) and (isinstance(b, str) or tb is list or tb is tuple):
            _check_repeat(st, b, a)
        elif (tb is int or tb is bool) and (isinstance(a, str) or ta is list or ta is tuple):
            _check_repeat(st, a, b)
        return a * b
    if op == 3:
        return a / b
    if op == 4:
        return a // b
    if op == 5:
        if isinstance(a, str):
            _check_percent(st, a, b)
            return _guard_size(st, a % b)
        return a % b
    if op == 6:
        if (ta is int or ta is bool) and (tb is int or tb is bool):
            _check_int_power(st, a, b)
        return a ** b
    # CONCAT
    a = _plain(st, a)
    b = _plain(st, b)
    _check_concat(st, a, b, 1)
    return a + b


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
