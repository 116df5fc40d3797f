"""Execution budgets: hostile templates fail fast, in bounded memory, without holding
the GIL, and every render of one request shares one deadline."""

from __future__ import annotations

import json
import threading
import time
import tracemalloc
from pathlib import Path

import pytest

from flare import fixtures
from flare.core.gguf_tokenizer import convert_gguf_file
from flare.errors import FrontendError
from flare.frontend.annotations import PATH_DIFFERENTIAL, sha256_hex
from flare.frontend.frontend import AssetFingerprints, Frontend, TokenSettings
from flare.frontend.template import (
    RenderBudget,
    TemplateBudgetError,
    TemplateLimitError,
    TemplateLimits,
    compile_template,
)

MAX_SECONDS = 1.5
MAX_PEAK_BYTES = 64 << 20
MAX_LATENESS_S = 0.050

# A render that stays just under the default fuel (20M instructions): ~0.1 s each.
NEAR_FUEL = "{% for i in range(40000) %}{% for j in range(120) %}{% endfor %}{% endfor %}"
BIG = "{% set big = 'ab ' * 5000000 %}"  # 15 MB: under max_string_bytes

HOSTILE = {
    # integers
    "chained_pow": "{{ 9 ** 9 ** 9 ** 9 ** 9 ** 9 ** 9 }}",  # left-associative, as in jinja2
    "right_nested_pow": "{{ 9 ** (9 ** (9 ** 9)) }}",
    "pow_of_big": "{{ (2 ** 100000) ** 100000 }}",
    "pow_huge_exponent": "{{ 3 ** (10 ** 12) }}",
    "multiply_loop": "{% set ns = namespace(x=3) %}{% for i in range(100) %}{% set ns.x = ns.x * ns.x %}{% endfor %}",
    "round_precision": "{{ 5 | round(-10 ** 8, 'floor') }}",
    # strings
    "string_repeat": "{{ 'x' * 10 ** 10 }}",
    "string_repeat_big": "{{ ('x' * 1000000) * 100 }}",
    "markup_repeat": "{{ ('x' | safe) * 10 ** 9 }}",
    "concat_loop": "{% set ns = namespace(s='xx') %}{% for i in range(64) %}"
                   "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | length }}",
    "plus_loop": "{% set ns = namespace(s='xx') %}{% for i in range(64) %}"
                 "{% set ns.s = ns.s + ns.s %}{% endfor %}",
    "percent_width": "{{ '%0999999999d' % 1 }}",
    "percent_precision": "{{ '%.999999999f' % 1.0 }}",
    "format_width": "{{ '{:>999999999}'.format(1) }}",
    "format_repeats_argument": "{% set s = 'x' * 10000000 %}{{ '{0}{0}{0}{0}'.format(s) }}",
    "center": "{{ 'x' | center(10 ** 9) }}",
    "ljust": "{{ 'x'.ljust(10 ** 9) }}",
    "indent_many_lines": "{{ ('x\\n' * 5000000) | indent(100) }}",
    "replace_empty_needle": "{{ ('a' * 100000) | replace('', 'x' * 1000) }}",
    "expandtabs": "{{ ('\\t' * 1000000).expandtabs(1000) }}",
    "output_flood": "{% set s = 'x' * 10000000 %}{% for i in range(100) %}{{ s }}{% endfor %}",
    # collections
    "list_repeat_of_large_strings": "{{ (['x' * 1000000] * 1000) | join }}",
    "list_of_large_strings": "{% set ns = namespace(l=[]) %}{% for i in range(10000) %}"
                             "{% set ns.l = ns.l + ['x' * 1000000 ~ i] %}{% endfor %}{{ ns.l | join }}",
    "dict_of_large_strings": "{% set ns = namespace(d={}) %}{% for i in range(10000) %}"
                             "{% set ns.d = dict((ns.d.items() | list) + [(i, 'x' * 1000000 ~ i)]) %}{% endfor %}",
    "tojson_of_shared_strings": "{% set l = ['x' * 4000000] * 4 %}{{ l | tojson }}",
    "repr_of_shared_strings": "{% set l = ['x' * 4000000] * 4 %}{{ l }}",
    "split_into_pieces": BIG + "{{ big.split(' ') | length }}",
    "split_on_whitespace": BIG + "{{ big.split() | length }}",
    "iterate_characters": BIG + "{% for c in big %}{% endfor %}",
    "join_characters": BIG + "{{ big | join(',') }}",
    "slice_count": "{{ [1, 2] | slice(10 ** 9) | list }}",
    "batch_fill": "{{ [1] | batch(10 ** 9, 0) | list }}",
    "regex_filter_input": BIG + "{{ big | title }}",
    # time
    "near_fuel_twice": NEAR_FUEL + NEAR_FUEL,
    "big_compares": "{% set a = range(100000) | list %}{% set b = range(100000) | list %}"
                    "{% for i in range(100000) %}{% if a == b %}{% endif %}{% endfor %}",
}


def _render(source: str, **limits):
    return compile_template(source, **limits).render({"messages": []})


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_template_fails_fast_in_bounded_memory(name):
    tpl = compile_template(HOSTILE[name])
    tracemalloc.start()
    try:
        start = time.perf_counter()
        with pytest.raises(TemplateLimitError):
            tpl.render({"messages": []})
        elapsed = time.perf_counter() - start
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert elapsed < MAX_SECONDS, f"{name}: {elapsed:.2f} s"
    assert peak < MAX_PEAK_BYTES, f"{name}: {peak / 2**20:.1f} MiB"
    assert isinstance(TemplateLimitError("x"), FrontendError)  # a 400 for the request


def test_limits_allow_what_real_templates_need():
    assert _render("{{ 2 ** 4000 > 0 }}{{ (2 ** 60) * (2 ** 60) }}") == "True1329227995784915872903807060280344576"
    assert len(_render("{{ 'x' * 4000000 }}")) == 4_000_000
    assert len(_render("{{ ['ab' * 1000000, 'c'] | join(', ') }}")) == 2_000_003
    assert _render("{{ '%5.2f|%-4s|' % (3.14159, 'a') }}{{ '{:>6}'.format('b') }}") == " 3.14|a   |     b"
    assert _render("{{ 'a\\nb' | indent(2, true) }}|{{ 'x y'.split() }}") == "  a\n  b|['x', 'y']"
    assert _render("{{ [[1], [2, 3]] | sum(start=[]) }}") == "[1, 2, 3]"
    with pytest.raises(FrontendError, match="can only concatenate list"):
        _render("{{ [[1], (2,)] | sum(start=[]) }}")


@pytest.mark.parametrize("field, source", [
    ("max_int_bits", "{{ 2 ** 100 }}"),
    ("max_string_bytes", "{{ 'x' * 1000 }}"),
    ("max_collection_bytes", "{{ [1] * 1000 }}"),
    ("max_output_bytes", "{% for i in range(100) %}{{ 'xxxxxxxxxx' }}{% endfor %}"),
])
def test_each_limit_is_configurable(field, source):
    assert _render(source)
    with pytest.raises(TemplateLimitError):
        _render(source, **{field: 64})


def test_striptags_is_linear_and_exact():
    # Removing a span can join text into a new opening: markupsafe's loop finds it.
    cases = ["<!<!--x-->--y-->z", "a<!-->b", "<<a>b>c", "<!--a--><!--b", "x<y", "<!-<!--a-->-->q"]
    expected = []
    for text in cases:
        while (start := text.find("<!--")) != -1:
            if (stop := text.find("-->", start)) == -1:
                break
            text = text[:start] + text[stop + 3:]
        while (start := text.find("<")) != -1:
            if (stop := text.find(">", start)) == -1:
                break
            text = text[:start] + text[stop + 1:]
        expected.append(" ".join(text.split()))
    got = compile_template("{% for c in cases %}{{ c | striptags }}|{% endfor %}").render({"cases": cases})
    assert got == "".join(e + "|" for e in expected)
    start = time.perf_counter()
    assert _render("{{ ('<a>b' * 30000) | striptags | length }}") == "30000"
    assert time.perf_counter() - start < 0.5


# ---------------------------------------------------------------- time budget

def test_time_limit_bounds_one_render():
    tpl = compile_template(NEAR_FUEL * 20, fuel=10 ** 9, time_limit_s=0.3)
    start = time.perf_counter()
    with pytest.raises(TemplateBudgetError, match="time budget"):
        tpl.render({})
    assert time.perf_counter() - start < 0.6


def test_renders_of_one_request_share_the_budget():
    tpl = compile_template(NEAR_FUEL)
    budget = RenderBudget(0.5)
    start = time.perf_counter()
    with pytest.raises(TemplateBudgetError, match="time budget"):
        for _ in range(100):
            tpl.render({}, budget)
    assert time.perf_counter() - start < 1.0
    # A spent budget fails at once, even for a template that does no work.
    with pytest.raises(TemplateBudgetError):
        compile_template("x").render({}, budget)
    assert compile_template("x").render({}) == "x"


@pytest.fixture(scope="module")
def smollm2(fixture_root: Path):
    converted = convert_gguf_file(fixtures.smollm2_gguf(fixture_root))
    return converted, json.dumps(converted.tokenizer_json).encode()


def _frontend(smollm2, template: str, limits: TemplateLimits | None = None) -> Frontend:
    converted, tokenizer_json = smollm2
    data = template.encode()
    settings = TokenSettings.from_tokenizer_config(converted.tokenizer_config, converted.eos_token_ids)
    return Frontend.load(tokenizer_json, data, AssetFingerprints(sha256_hex(tokenizer_json), sha256_hex(data)),
                         settings, limits=limits)


def test_differential_renders_share_the_request_budget(smollm2):
    # Without marks, a request renders the template once per message prefix (up to 65
    # times); each render is under its fuel, together they would take many seconds.
    slow = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}" + NEAR_FUEL
    frontend = _frontend(smollm2, slow, TemplateLimits(time_limit_s=0.5))
    assert frontend.endpoint_path == PATH_DIFFERENTIAL
    chat = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}"} for i in range(40)]
    start = time.perf_counter()
    with pytest.raises(TemplateBudgetError, match="time budget"):
        frontend.render_chat(chat)
    assert time.perf_counter() - start < 1.0
    fast = _frontend(smollm2, "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}")
    assert fast.render_chat(chat).message_endpoints  # ordinary templates are unaffected


# ---------------------------------------------------------------- GIL

def _worst_lateness(fn, period_s: float = 0.005) -> float:
    """Worst delay past its wake-up time of a thread sleeping ``period_s`` at a time,
    while ``fn`` runs on this thread."""
    stop = threading.Event()
    lateness: list[float] = []

    def ticker():
        while not stop.is_set():
            t = time.perf_counter()
            time.sleep(period_s)
            lateness.append(time.perf_counter() - t - period_s)

    thread = threading.Thread(target=ticker)
    thread.start()
    time.sleep(0.02)
    try:
        fn()
    finally:
        stop.set()
        thread.join()
    return max(lateness)


@pytest.mark.parametrize("name", ["near_fuel_twice", "big_compares", "concat_loop", "tojson_of_shared_strings",
                                  "list_of_large_strings", "split_into_pieces"])
def test_hostile_render_does_not_hold_the_gil(name):
    tpl = compile_template(HOSTILE[name])

    def render():
        with pytest.raises(TemplateLimitError):
            tpl.render({"messages": []})

    # Best of three: a loaded machine can stall the ticker now and then (the OS
    # scheduler), while a render that held the GIL would delay it every time.
    worst = []
    for _ in range(3):
        worst.append(_worst_lateness(render))
        if worst[-1] < MAX_LATENESS_S:
            break
    assert min(worst) < MAX_LATENESS_S, f"{name}: worst lateness {[round(w * 1e3, 1) for w in worst]} ms"
