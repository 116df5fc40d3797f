"""{% mark %} and {% mark expr %}: positions, kinds, placement rules, whitespace."""

from __future__ import annotations

import re

import pytest
from template_reference import reference_compile

from flare.errors import FrontendError
from flare.frontend.template import compile_template

MSGS = [{"role": "system", "content": "Sé brief 😀"}, {"role": "user", "content": "héllo"},
        {"role": "assistant", "content": "ok"}]


def _unmarked(source: str) -> str:
    """The same template with every mark replaced by an empty if-block carrying the
    same whitespace modifiers, so jinja2 can render the expected text."""
    return re.sub(r"\{%([-+]?)\s*mark\b[^%]*?([-+]?)%\}",
                  r"{%\1 if false %}{% endif \2%}", source)


def test_offset_marks_are_utf8_byte_positions():
    src = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}</s>{% mark %}{% endfor %}"
           "{% if add_generation_prompt %}<assistant>{% endif %}")
    tpl = compile_template(src)
    assert tpl.mark_kind == "offset"
    text, marks = tpl.render_marked({"messages": MSGS, "add_generation_prompt": True})
    data = text.encode("utf-8")
    assert len(marks) == 3
    for mark in marks:
        assert data[:mark].endswith(b"</s>")
    assert data[marks[0]:marks[1]].decode() == "<user>héllo</s>"
    assert tpl.render({"messages": MSGS, "add_generation_prompt": True}) == text


def test_marks_follow_whitespace_control():
    src = ("{%- for m in messages %}\n    {{- m.role }}: {{ m.content }}\n"
           "    {%- mark %}\n{% endfor %}\n  {% mark -%}   \ntail")
    ctx = {"messages": MSGS}
    text, marks = compile_template(src).render_marked(ctx)
    assert text == reference_compile(_unmarked(src)).render(**ctx)
    data = text.encode()
    # The last mark's lstrip and `-%}` remove the whitespace around it.
    assert [data[:m].decode()[-3:] for m in marks] == ["f 😀", "llo", " ok", " ok"]
    assert marks[-1] == len(data) - len("tail")


def test_mark_after_macro_call_at_root():
    src = ("{% macro block(m) %}[{{ m.content }}]{% endmacro %}"
           "{% for m in messages %}{{ block(m) }}{% mark %}{% endfor %}")
    text, marks = compile_template(src).render_marked({"messages": MSGS})
    assert [text.encode()[:m].decode() for m in marks] == [
        "[Sé brief 😀]", "[Sé brief 😀][héllo]", "[Sé brief 😀][héllo][ok]"]


def test_marks_count_markup_output():
    text, marks = compile_template("{{ 'é<' | safe }}{% mark %}{{ 'ü' | e }}{% mark %}").render_marked({})
    assert text == "é<ü" and marks == (3, 5)


def test_segment_marks_record_counts():
    src = ("{% set ns = namespace(n=0) %}{% mark ns.n %}{% for m in messages %}"
           "{{ m.content }}{% set ns.n = ns.n + 1 %}{% mark ns.n %}{% endfor %}")
    tpl = compile_template(src)
    assert tpl.mark_kind == "segment"
    text, marks = tpl.render_marked({"messages": MSGS})
    assert marks == (0, 1, 2, 3)
    assert text == "Sé brief 😀héllook"


def test_unmarked_template_has_no_kind():
    tpl = compile_template("plain")
    assert tpl.mark_kind is None
    assert tpl.render_marked({}) == ("plain", ())


@pytest.mark.parametrize("value", ["-1", "'x'", "1.5", "none"])
def test_segment_count_must_be_nonnegative_int(value):
    with pytest.raises(FrontendError, match="segment count"):
        compile_template("{% mark " + value + " %}").render_marked({})


@pytest.mark.parametrize("source", [
    "{% macro m() %}{% mark %}{% endmacro %}",
    "{% set x %}{% mark %}{% endset %}",
    "{% filter upper %}{% mark %}{% endfilter %}",
    "{% macro w() %}{{ caller() }}{% endmacro %}{% call w() %}{% mark %}{% endcall %}",
    "{% mark %}{% mark 1 %}",
    "{% macro m() %}{% for x in y %}{% mark %}{% endfor %}{% endmacro %}",
])
def test_marks_rejected_where_forbidden(source):
    with pytest.raises(FrontendError, match=r"line 1, column \d+"):
        compile_template(source)
