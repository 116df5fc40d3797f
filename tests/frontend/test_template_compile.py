"""Compiler contract: opcode numbering, load errors with line and column, golden
bytecode listings, and concurrent rendering of one CompiledTemplate."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from flare._fast import jinja_vm
from flare.errors import FrontendError
from flare.frontend.template import CompiledTemplate, compile_template, disassemble
from flare.frontend.template.opcodes import Op

GOLDEN = Path(__file__).parent / "golden"


def test_opcode_numbering_matches_vm():
    assert jinja_vm.OPCODES == {op.name: int(op) for op in Op}
    assert jinja_vm.OPCODE_COUNT == len(Op)


def test_every_opcode_documented():
    source = (Path(__file__).resolve().parents[2] / "flare/frontend/template/opcodes.py").read_text()
    for op in Op:
        line = next(text for text in source.splitlines() if text.strip().startswith(f"{op.name} ="))
        assert "#" in line and len(line.split("#", 1)[1].strip()) > 5, op.name


@pytest.mark.parametrize("source, where, fragment", [
    ("{% if x %}", "line 1, column 11", "unexpected end of template"),
    ("a\nb {% endfor %}", "line 2, column 6", "unexpected 'endfor'"),
    ("x\n\n  {% include 'a' %}", "line 3, column 6", "unsupported tag 'include'"),
    ("{{ x | nosuchfilter }}", "line 1, column 6", "no filter named 'nosuchfilter'"),
    ("{{ x is nosuchtest }}", "line 1, column 6", "no test named 'nosuchtest'"),
    ("{% break %}", "line 1, column 4", "'break' outside of a for loop"),
    ("{{ 'abc }}", "line 1, column 4", "unexpected character"),
    ("{{ (1 }}", "line 1, column 7", "unexpected '}', expected ')'"),
    ("{{ 1 + }}", "line 1, column 8", "unexpected end of print statement"),
    ("{% for x in y %}{% endif %}", "line 1, column 20", "unexpected 'endif'"),
    ("{% set 1 = 2 %}", "line 1, column 8", "can't assign"),
    ("{# open comment", "line 1, column 1", "missing end of comment"),
    ("{% raw %}never closed", "line 1, column 1", "missing end of raw"),
    ("{% macro m(a=1, b) %}{% endmacro %}", "line 1, column 17", "non-default argument"),
    ("{{ x }\n}", "line 1, column 6", "unexpected '}'"),
])
def test_load_errors_name_line_and_column(source, where, fragment):
    with pytest.raises(FrontendError) as info:
        compile_template(source)
    message = str(info.value)
    assert where in message and fragment in message, message


def test_unknown_filter_inside_if_fails_only_when_reached():
    tpl = compile_template("{% if flag %}{{ x | from_json }}{% endif %}ok")
    assert tpl.render({"flag": False}) == "ok"
    with pytest.raises(FrontendError, match="No filter named 'from_json' found."):
        tpl.render({"flag": True, "x": "{}"})


def test_non_str_source_rejected():
    with pytest.raises(FrontendError):
        compile_template(b"bytes")  # type: ignore[arg-type]


GOLDEN_TEMPLATES = {
    "loop_namespace": (
        "{%- set ns = namespace(found=false) %}\n"
        "{%- for message in messages if message.role != 'system' %}\n"
        "    {%- if loop.first %}{% set ns.found = true %}{% endif %}\n"
        "    {{- '<|' ~ message.role ~ '|>' + message.content | trim }}\n"
        "{%- else %}empty{% endfor %}\n"
        "{%- if add_generation_prompt %}<|assistant|>{% mark %}{% endif %}"),
    "macro_call": (
        "{% macro render(m, sep='\\n') %}{{ m.content }}{{ sep }}{% endmacro %}"
        "{% for m in messages %}{{ render(m) }}{% if loop.last %}{% break %}{% endif %}{% endfor %}"
        "{{ tools | tojson(indent=2) if tools else '' }}"),
}


@pytest.mark.parametrize("name", sorted(GOLDEN_TEMPLATES))
def test_golden_disassembly(name):
    listing = disassemble(compile_template(GOLDEN_TEMPLATES[name]))
    path = GOLDEN / f"{name}.txt"
    if os.environ.get("FLARE_UPDATE_GOLDEN"):
        path.write_text(listing)
    assert listing == path.read_text(), f"bytecode changed; FLARE_UPDATE_GOLDEN=1 rewrites {path}"


def test_golden_templates_render():
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": " u "}]
    tpl = compile_template(GOLDEN_TEMPLATES["loop_namespace"])
    assert tpl.render_marked({"messages": msgs, "add_generation_prompt": True}) == \
        ("<|user|>u<|assistant|>", (len("<|user|>u<|assistant|>"),))


def test_concurrent_renders_share_one_template():
    source = (Path(__file__).parent / "golden" / "concurrency.jinja").read_text() \
        if (GOLDEN / "concurrency.jinja").exists() else (
        "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
        "{{ m.role }}:{{ m.content }}|{{ ns.n }}{% mark %}{% endfor %}")
    tpl: CompiledTemplate = compile_template(source)
    contexts = [{"messages": [{"role": f"r{t}", "content": str(i)} for i in range(50 + t)]}
                for t in range(4)]
    expected = [tpl.render_marked(c) for c in contexts]
    failures = []

    def worker(t):
        for _ in range(200):
            if tpl.render_marked(contexts[t]) != expected[t]:
                failures.append(t)
                return

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not failures
