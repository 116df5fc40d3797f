"""Hostile templates fail fast with FrontendError and leave the process healthy."""

from __future__ import annotations

import time

import pytest

from flare.errors import FrontendError
from flare.frontend.template import compile_template

HOSTILE_AT_LOAD = [
    "{{ ''.__class__ }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ messages.__class__ }}",
    "{{ raise_exception.__globals__ }}",
    "{{ namespace.__init__ }}",
    "{{ loop.__class__ }}",
    "{{ cycler.__init__.__globals__.os }}",
    "{% include 'x.html' %}",
    "{% import 'x' as y %}",
    "{% extends 'base' %}",
    "{% for x in xs recursive %}{{ loop(x) }}{% endfor %}",
    "{{ f(*args) }}",
]

HOSTILE_AT_RENDER = {
    "recursion": "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}",
    "mutual_recursion": "{% macro a() %}{{ b() }}{% endmacro %}{% macro b() %}{{ a() }}{% endmacro %}{{ a() }}",
    "caller_recursion": "{% macro w() %}{% call w() %}x{% endcall %}{% endmacro %}{{ w() }}",
    "huge_range": "{{ range(10 ** 9) | length }}",
    "nested_loops": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "item_probe": "{{ ''['__class__'] }}",
    "attr_filter_probe": "{{ messages | attr('__class__') }}",
    "format_probe": "{{ '{0.__class__}'.format(messages) }}",
    "format_index_probe": "{{ '{0[0]}'.format(messages) }}",
    "string_doubling": "{% set ns = namespace(s='xx') %}{% for i in range(64) %}"
                       "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | length }}",
    "string_multiply": "{{ 'x' * 10 ** 10 }}",
    "list_multiply": "{{ ([1] * 100000) * 100000 }}",
    "power": "{{ 7 ** 100000000 }}",
    "replace_blowup": "{% set s = 'a' * 1000000 %}{{ s | replace('a', s) | length }}",
    "join_blowup": "{% set s = 'a' * 30000000 %}{{ [s, s, s] | join }}",
    "output_flood": "{% set s = 'x' * 50000000 %}{% for i in range(100) %}{{ s }}{% endfor %}",
    "unsafe_method": "{{ messages.append(1) }}",
    "repeated_big_filter": "{% set big = 'x' * 2000000 %}{% for i in range(100000) %}"
                           "{% set y = big | tojson %}{% endfor %}",
    "repeated_big_search": "{% set big = 'x' * 5000000 %}{% for i in range(100000) %}"
                           "{% if 'y' in big %}{% endif %}{% endfor %}",
    "repeated_big_split": "{% set big = 'a,' * 1000000 %}{% for i in range(100000) %}"
                          "{% set parts = big.split(',') %}{% endfor %}",
    "deep_input_json": "{{ deep | tojson }}",
    "deep_input_print": "{{ deep }}",
    "callable_value": "{{ messages[0].content() }}",
}


@pytest.mark.parametrize("source", HOSTILE_AT_LOAD)
def test_rejected_at_load(source):
    with pytest.raises(FrontendError, match=r"line \d+, column \d+"):
        compile_template(source)


@pytest.mark.parametrize("name", sorted(HOSTILE_AT_RENDER))
def test_fails_fast_at_render(name):
    tpl = compile_template(HOSTILE_AT_RENDER[name])
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    ctx = {"messages": [{"role": "user", "content": "hi"}], "deep": deep}
    start = time.perf_counter()
    with pytest.raises(FrontendError):
        tpl.render(ctx)
    assert time.perf_counter() - start < 10.0
    # The template stays usable and the process healthy after the failure.
    assert compile_template("{{ 1 + 1 }}").render({}) == "2"


@pytest.mark.parametrize("source", [
    "{{ " + "(" * 5000 + "1" + ")" * 5000 + " }}",
    "{% if x %}" * 3000 + "{% endif %}" * 3000,
    "{{ x" + ".a" * 20000 + " }}",
])
def test_deep_nesting_in_source_fails_at_load(source):
    with pytest.raises(FrontendError, match=r"nested too deeply at line 1, column \d+"):
        compile_template(source)


def test_fuel_is_configurable():
    tpl = compile_template("{% for i in range(1000) %}{{ i }}{% endfor %}", fuel=500)
    with pytest.raises(FrontendError, match="execution budget"):
        tpl.render({})
    assert compile_template("{% for i in range(10) %}{{ i }}{% endfor %}", fuel=500).render({}) \
        == "0123456789"


def test_recursion_bound_is_configurable():
    src = "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{% endif %}x{% endmacro %}{{ f(depth) }}"
    tpl = compile_template(src, max_depth=10)
    assert tpl.render({"depth": 5}) == "x" * 6
    with pytest.raises(FrontendError, match="recursion"):
        tpl.render({"depth": 50})


def test_inputs_are_not_mutated():
    messages = [{"role": "user", "content": "a"}]
    tpl = compile_template("{% set ns = namespace(m=messages) %}{% set x = messages.pop() %}"
                           "{{ messages | length }}")
    with pytest.raises(FrontendError, match="unsafe"):
        tpl.render({"messages": messages})
    assert messages == [{"role": "user", "content": "a"}]


def test_non_dict_context_is_rejected():
    with pytest.raises(FrontendError):
        compile_template("x").render(["not", "a", "dict"])
