# Part of the jinja_vm module (included by jinja_vm.pyx; not compiled on its own).
# Filters and tests.

# ============================================================== filters and tests

def _generator(items):
    """A real generator over ``items`` (jinja2 filters return generators)."""
    for item in items:
        yield item


def _failing_generator(exc):
    """A generator that raises ``exc`` when first iterated (jinja2's lazy errors)."""
    if exc is not None:
        raise exc
    yield None


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


cdef object _indent(_Render st, object s, tuple args, dict kwargs):
    cdef list a = _bind("indent", args, kwargs, ("width", "first", "blank"), (4, False, False))
    width, first, blank = a
    if not isinstance(width, str):
        _check_width(st, " ", width)
    indention = width if isinstance(width, str) else " " * width
    if isinstance(s, str):
        _check_concat(st, s, "\n", 1)
        _check_collection(st, _count_splits(s, None, True) * ITEM_BYTES + _str_bytes(s))
    s = s + "\n"
    lines = s.splitlines()
    # Every line may get the indention (and its newline).
    if isinstance(s, str) and isinstance(indention, str) and lines:
        if PyUnicode_GET_LENGTH(indention) + 1 > st.program.max_string_bytes // len(lines):
            _refuse_str(st, f"{PyUnicode_GET_LENGTH(indention) + 1} * {len(lines)}")
        _check_str(st, (PyUnicode_GET_LENGTH(s) + len(lines) * (PyUnicode_GET_LENGTH(indention) + 1))
                   * max(PyUnicode_KIND(s), PyUnicode_KIND(indention)))
    if blank:
        rv = ("\n" + indention).join(lines)
    else:
        rv = lines.pop(0)
        if lines:
            rv += "\n" + "\n".join([indention + line if line else line for line in lines])
    if first:
        rv = indention + rv
    return _guard_size(st, rv)


def _striptags(str text):
    """jinja2's striptags: drop comments and tags, collapse whitespace, unescape."""
    text = _drop_spans(text, "<!--", "-->")
    text = _drop_spans(text, "<", ">")
    return _html.unescape(" ".join(text.split()))


cdef str _drop_spans(str text, str opening, str closing):
    """What markupsafe's loop computes, in linear time instead of quadratic:

        while (start := text.find(opening)) != -1:
            if (stop := text.find(closing, start)) == -1:
                break
            text = text[:start] + text[stop + len(closing):]

    The text is kept as ``pieces + tail + text[pos:]``. The kept part never holds
    ``opening``, except where a removal joins its end to what follows: so only the
    last ``len(opening) - 1`` kept characters (``tail``) are searched again.
    """
    cdef Py_ssize_t k = len(opening) - 1, pos = 0, j, start, stop, c
    cdef list pieces = []
    cdef str tail = ""
    cdef str probe, head
    while True:
        probe = tail + text[pos:pos + k]
        j = probe.find(opening) if k else -1
        if 0 <= j < len(tail):
            # An opening spans the kept tail and the text: its closing may too.
            head = tail[j:]
            c = (head + text[pos:pos + len(closing) - 1]).find(closing)
            if c != -1:
                stop = pos + c + len(closing) - len(head)
            else:
                c = text.find(closing, pos)
                if c == -1:
                    break
                stop = c + len(closing)
            tail = tail[:j]
            pos = stop
            while len(tail) < k and pieces:
                tail = pieces.pop() + tail
            if len(tail) > k:
                pieces.append(tail[:len(tail) - k])
                tail = tail[len(tail) - k:]
            continue
        start = text.find(opening, pos)
        if start == -1:
            break
        c = text.find(closing, start)
        if c == -1:
            break
        kept = tail + text[pos:start]
        if len(kept) > k:
            pieces.append(kept[:len(kept) - k])
            tail = kept[len(kept) - k:] if k else ""
        else:
            tail = kept
        pos = c + len(closing)
    pieces.append(tail)
    pieces.append(text[pos:])
    return "".join(pieces)


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


# Filters that list or order the items of their value (bounded by _check_items), and
# those whose cost per character is high (regex, pure-Python helpers): their input is
# bounded to 1/SLOW_TEXT_SHARE of max_string_bytes (128K characters by default), so
# one call stays within a few tens of milliseconds.
cdef unsigned long long _ITEM_FILTERS = (
    (1ULL << F_BATCH) | (1ULL << F_DICTSORT) | (1ULL << F_GROUPBY) | (1ULL << F_ITEMS)
    | (1ULL << F_JOIN) | (1ULL << F_LIST) | (1ULL << F_MAP) | (1ULL << F_MAX)
    | (1ULL << F_MIN) | (1ULL << F_REJECT) | (1ULL << F_REJECTATTR) | (1ULL << F_SELECT)
    | (1ULL << F_SELECTATTR) | (1ULL << F_SLICE) | (1ULL << F_SORT) | (1ULL << F_SUM)
    | (1ULL << F_UNIQUE) | (1ULL << F_REVERSE))
cdef unsigned long long _SLOW_FILTERS = (
    (1ULL << F_TITLE) | (1ULL << F_WORDCOUNT) | (1ULL << F_WORDWRAP) | (1ULL << F_STRIPTAGS)
    | (1ULL << F_URLENCODE) | (1ULL << F_PPRINT))
cdef Py_ssize_t SLOW_TEXT_SHARE = 128


cdef object _filter(_Render st, int fid, object v, tuple args, dict kwargs):
    cdef list a
    cdef Py_ssize_t bound
    if (_ITEM_FILTERS >> fid) & 1:
        _check_items(st, v)
    elif (_SLOW_FILTERS >> fid) & 1:
        bound = _text_bound(v, st.program.max_string_bytes, 0)
        if bound > st.program.max_string_bytes // SLOW_TEXT_SHARE:
            raise TemplateLimitError(
                f"filter {FILTER_NAMES[fid]!r} takes at most "
                f"{st.program.max_string_bytes // SLOW_TEXT_SHARE} characters")
    if fid == F_LENGTH:
        return len(v)
    if fid == F_TRIM:
        if not args and not kwargs:
            return _str(st, v).strip()
        a = _bind("trim", args, kwargs, ("chars",), (None,))
        return _str(st, v).strip(a[0])
    if fid == F_TOJSON:
        return _tojson(st, v, args, kwargs)
    if fid == F_STRING:
        return _str(st, v)
    if fid == F_SAFE:
        return v if isinstance(v, Markup) else Markup(_str(st, v))
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
            sep = _plain(st, args[0] if args else "")
        else:
            a = _bind("join", args, kwargs, ("d", "attribute"), ("", None))
            if a[1] is not None:
                parts = _attr_parts(a[1])
                v = [_attrget(parts, x, None, False) for x in v]
            sep = _plain(st, a[0])
        items = [_plain(st, x) for x in v]
        _check_join(st, sep, items)
        return sep.join(items)
    if fid == F_UPPER:
        return _str(st, v).upper()
    if fid == F_LOWER:
        return _str(st, v).lower()
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
        s = _plain(st, v)
        old = _plain(st, a[0])
        new = _plain(st, a[1])
        count = -1 if a[2] is None else a[2]
        _check_replace(st, s, old, new, count)
        return _guard_size(st, s.replace(old, new, count))
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
        return _indent(st, v, args, kwargs)
    if fid == F_TITLE:
        return "".join([item[0].upper() + item[1:].lower()
                        for item in _word_beginning_split_re.split(_str(st, v)) if item])
    if fid == F_CAPITALIZE:
        return _str(st, v).capitalize()
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
        if type(a[0]) is int and abs(a[0]) * 10 > st.program.max_int_bits * 3:
            # 10 ** precision: digits * log2(10) bits
            _refuse_int(st, abs(a[0]) * 10 // 3)
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
        return _getattr(v, _plain(st, a[0]))
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
        if type(a[1]) is list or type(a[1]) is tuple:
            return _sum_sequences(st, a[1], list(v))
        return sum(v, a[1])
    if fid == F_BATCH:
        a = _bind("batch", args, kwargs, ("linecount", "fill_with"), (None, None))
        linecount = a[0]
        if a[1] is not None and type(linecount) is int:
            _check_collection(st, linecount * 8)  # the fill of the last batch
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
        return len(_word_re.findall(_str(st, v)))
    if fid == F_CENTER:
        a = _bind("center", args, kwargs, ("width",), (80,))
        v = _str(st, v)
        _check_width(st, v, a[0])
        return _guard_size(st, v.center(a[0]))
    if fid == F_ESCAPE:
        if not isinstance(v, str):
            _check_text(st, v)
        return _guard_size(st, _escape(v))
    if fid == F_FORCEESCAPE:
        _check_text(st, v)
        return _guard_size(st, _escape(str(v)))
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
        if type(a[0]) is int:
            _check_collection(st, a[0] * ITEM_BYTES)  # one list per slice
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
        return _striptags(str(v))
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
    if fid == F_PPRINT:
        return _guard_size(st, _pprint.pformat(v))
    if fid == F_URLENCODE:
        if isinstance(v, str) or not isinstance(v, _abc.Iterable):
            return _url_quote(v, False)
        items = v.items() if isinstance(v, dict) else v
        return "&".join([f"{_url_quote(k, True)}={_url_quote(x, True)}" for k, x in items])
    if fid == F_FORMAT:
        if args and kwargs:
            raise FrontendError("can't handle positional and keyword arguments at the same time")
        v = _str(st, v)
        _check_percent(st, v, kwargs or args)
        return _guard_size(st, v % (kwargs or args))
    raise FrontendError(f"filter {FILTER_NAMES[fid]!r} is not implemented")


cdef object _sum_sequences(_Render st, object start, list items):
    """``sum(items, start)`` for a list or tuple ``start`` in linear time (Python's
    sum concatenates pair by pair: quadratic). Same result and same TypeError."""
    cdef Py_ssize_t n = 0, i
    cdef object t = type(start)
    cdef Py_ssize_t limit = st.program.max_collection_bytes
    total = _deep_bytes(start, limit, 0)
    for i in range(len(items)):
        if type(items[i]) is not t:
            break
        total += _deep_bytes(items[i], limit, 0)
        _check_collection(st, total)
        n += 1
    out = list(start)
    for i in range(n):
        out.extend(items[i])
    result = out if t is list else tuple(out)
    if n < len(items):
        return sum(items[n:], result)  # the same error Python's sum raises
    return result


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
        return _str(st, v).islower()
    if tid == T_UPPER:
        return _str(st, v).isupper()
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
