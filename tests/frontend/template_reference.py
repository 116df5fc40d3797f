"""The reference renderer: jinja2 configured exactly as Transformers renders chat
templates (its own compile helper when importable)."""

from __future__ import annotations

from flare.errors import FrontendError


def reference_compile(source: str):
    """Compile with Transformers' chat-template environment."""
    from transformers.utils.chat_template_utils import _compile_jinja_template
    return _compile_jinja_template(source)


def reference_outcome(source: str, context: dict) -> tuple[str, str]:
    """('ok', text) or ('error', message) from the reference."""
    try:
        tpl = reference_compile(source)
    except Exception as exc:  # noqa: BLE001 - any jinja2 error is an outcome
        return ("compile_error", str(exc))
    try:
        return ("ok", tpl.render(**context))
    except Exception as exc:  # noqa: BLE001
        return ("error", str(exc))


def our_outcome(source: str, context: dict) -> tuple[str, str]:
    """('ok', text) or ('error', message) from flare's compiler and VM."""
    from flare.frontend.template import compile_template
    try:
        tpl = compile_template(source)
    except FrontendError as exc:
        return ("compile_error", str(exc))
    try:
        return ("ok", tpl.render(context))
    except FrontendError as exc:
        return ("error", str(exc))
