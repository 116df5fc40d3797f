"""CompiledTemplate: the immutable result of compiling one chat template."""

from __future__ import annotations

import dataclasses

from flare._fast.jinja_vm import Program, RenderBudget
from flare.errors import FrontendError
from flare.frontend.template.codegen import Code, generate
from flare.frontend.template.lexer import Source
from flare.frontend.template.limits import TemplateLimits
from flare.frontend.template.parser import parse


class CompiledTemplate:
    """A chat template compiled to bytecode; safe to render from many threads at once.

    ``mark_kind`` says how to read the values :meth:`render_marked` returns:
    ``"offset"`` when the template uses ``{% mark %}`` (each value is the UTF-8 byte
    offset of the output where the mark executed), ``"segment"`` when it uses
    ``{% mark expr %}`` (each value is the nonnegative segment count the expression
    evaluated to), ``None`` when it has no marks. One template never mixes the two.
    """

    __slots__ = ("source", "code", "program", "mark_kind", "limits")

    def __init__(self, source: str, code: Code, program: Program, limits: TemplateLimits):
        self.source = source
        self.code = code
        self.program = program
        self.mark_kind = code.mark_kind
        self.limits = limits

    def budget(self) -> RenderBudget:
        """A fresh deadline (``limits.time_limit_s`` from now) for the renders of one request."""
        return RenderBudget(self.limits.time_limit_s)

    def render(self, context: dict, budget: RenderBudget | None = None) -> str:
        """Render exactly as Transformers' ``apply_chat_template`` would with ``context``
        (messages, tools, add_generation_prompt, special tokens, template kwargs).

        ``budget`` is the request's deadline, shared by all its renders; without one
        this render gets ``limits.time_limit_s`` of its own. Raises FrontendError with
        jinja2's exception message when the template raises, TemplateLimitError (a
        FrontendError) when it exceeds its limits.
        """
        if not isinstance(context, dict):
            raise FrontendError("template context must be a dict")
        return self.program.render(context, False, budget)

    def render_marked(self, context: dict, budget: RenderBudget | None = None) -> tuple[str, tuple[int, ...]]:
        """Render and also return, in output order, the value of each executed mark."""
        if not isinstance(context, dict):
            raise FrontendError("template context must be a dict")
        return self.program.render(context, True, budget)


def compile_template(source: str, limits: TemplateLimits | None = None, **overrides) -> CompiledTemplate:
    """Compile chat-template ``source`` to bytecode.

    ``limits`` (default ``TemplateLimits()``) bound each render; keyword ``overrides``
    replace single fields (``compile_template(src, fuel=500)``). Raises FrontendError
    naming line and column for anything malformed or unsupported.
    """
    if not isinstance(source, str):
        raise FrontendError("template source must be a str")
    limits = dataclasses.replace(limits or TemplateLimits(), **overrides)
    src = Source(source)
    code = generate(parse(src), src)
    program = Program(code.code, code.consts, code.slot_names, code.root_slots, code.mark_kind,
                      limits.fuel, limits.max_depth, limits.max_int_bits, limits.max_string_bytes,
                      limits.max_collection_bytes, limits.max_output_bytes, limits.time_limit_s)
    return CompiledTemplate(source, code, program, limits)
