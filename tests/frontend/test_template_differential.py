"""Differential test: every real chat template (70 llama.cpp fixtures + 50 from
../shared/templates) crossed with the conversation corpus must render byte-identically
to jinja2 as Transformers configures it, or fail with the same message."""

from __future__ import annotations

from pathlib import Path

import pytest

from flare.errors import FrontendError
from flare.frontend.template import compile_template
from template_corpus import contexts
from template_reference import reference_compile

CONTEXTS = list(contexts())


def _template_files(template_dir: Path, shared_template_dir: Path | None) -> list[Path]:
    files = sorted(template_dir.glob("*.jinja"))
    if shared_template_dir is not None:
        files += sorted(shared_template_dir.glob("*.jinja"))
    return files


def pytest_generate_tests(metafunc):
    if "template_path" in metafunc.fixturenames:
        from flare import fixtures
        root = fixtures.ensure_fixtures()
        shared = Path(__file__).resolve().parents[3] / "shared" / "templates"
        files = _template_files(root / "templates", shared if shared.is_dir() else None)
        metafunc.parametrize("template_path", files,
                             ids=[f"{p.parent.name}/{p.name}" for p in files])


def _outcome(render, ctx):
    try:
        return ("ok", render(ctx))
    except FrontendError as exc:
        return ("error", str(exc))


def test_template_matches_jinja2(template_path: Path):
    source = template_path.read_text(encoding="utf-8")
    reference = reference_compile(source)
    ours = compile_template(source)

    def ref_render(ctx):
        try:
            return reference.render(**ctx)
        except Exception as exc:  # noqa: BLE001 - jinja2's exception message is the outcome
            raise FrontendError(str(exc)) from exc

    mismatches = []
    for name, ctx in CONTEXTS:
        expected = _outcome(ref_render, ctx)
        got = _outcome(ours.render, ctx)
        if got != expected:
            mismatches.append((name, expected[0], expected[1][:200], got[0], got[1][:200]))
    assert not mismatches, f"{len(mismatches)}/{len(CONTEXTS)} cases differ: {mismatches[:3]}"


def test_corpus_covers_the_brief():
    names = {name.split("/")[0] for name, _ in CONTEXTS}
    assert {"tools_object_args", "tools_string_args", "reasoning", "multimodal",
            "unicode_emoji", "empty_strings", "history_200", "system_multi_turn"} <= names
    options = {(c.get("add_generation_prompt"), c.get("enable_thinking", "absent"))
               for _, c in CONTEXTS}
    assert {(True, True), (False, False), (True, "absent")} <= options
    long = dict(CONTEXTS)["history_200"]
    assert len(long["messages"]) > 200
