"""CompiledTemplate: the immutable result of compiling one chat template."""

from __future__ import annotations

from flare._fast.jinja_vm import DEFAULT_FUEL, DEFAULT_MAX_DEPTH, Program
from flare.errors import FrontendError
from flare.frontend.template.codegen import Code, generate
from flare.frontend.template.lexer import Source
from flare.frontend.template.parser import parse


class CompiledTemplate:
    """A chat template compiled to bytecode; safe to render from many threads at once.

    ``mark_kind`` says how to read the values :meth:`render_marked` returns:
    ``"offset"`` when the template uses ``{% mark %}`` (each value is the UTF-8 byte
    offset of the output where the mark executed), ``"segment"`` when it uses
    ``{% mark expr %}`` (each value is the nonnegative segment count the expression
    evaluated to), ``None`` when it has no marks. One template never mixes the two.
    """

    __slots__ = ("source", "code", "program", "mark_kind")

    def __init__(self, source: str, code: Code, program: Program):
        self.source = source
        self.code = code
        self.program = program
        self.mark_kind = code.mark_kind

    def render(self, context: dict) -> str:
        """Render exactly as Transformers' ``apply_chat_template`` would with ``context``
        (messages, tools, add_generation_prompt, special tokens, template kwargs).

        Raises FrontendError with jinja2's exception message when the template raises.
        """
        if not isinstance(context, dict):
            raise FrontendError("template context must be a dict")
        return self.program.render(context)

    def render_marked(self, context: dict) -> tuple[str, tuple[int, ...]]:
        """Render and also return, in output order, the value of each executed mark."""
        if not isinstance(context, dict):
            raise FrontendError("template context must be a dict")
        return self.program.render(context, True)


def compile_template(source: str, *, fuel: int = DEFAULT_FUEL,
                     max_depth: int = DEFAULT_MAX_DEPTH) -> CompiledTemplate:
    """Compile chat-template ``source`` to bytecode.

    ``fuel`` bounds the instructions one render may execute and ``max_depth`` the
    nesting of macro calls. Raises FrontendError naming line and column for anything
    malformed or unsupported.
    """
    if not isinstance(source, str):
        raise FrontendError("template source must be a str")
    src = Source(source)
    code = generate(parse(src), src)
    program = Program(code.code, code.consts, code.slot_names, code.root_slots,
                      code.mark_kind, fuel, max_depth)
    return CompiledTemplate(source, code, program)
