"""Chat-template compiler: Jinja source to bytecode for the Cython VM.

``compile_template(source)`` lexes (:mod:`.lexer`), parses (:mod:`.parser`, AST in
:mod:`.nodes`) and generates bytecode (:mod:`.codegen`, instruction set in
:mod:`.opcodes`) once at load; :class:`CompiledTemplate` renders it with
``flare._fast.jinja_vm`` and :func:`disassemble` lists it. :class:`TemplateLimits`
(:mod:`.limits`) is its execution budget; a :class:`RenderBudget` is one request's
deadline, shared by every render done for that request.
"""

from flare._fast.jinja_vm import RenderBudget, TemplateBudgetError, TemplateLimitError
from flare.frontend.template.compiled import CompiledTemplate, compile_template
from flare.frontend.template.disasm import disassemble
from flare.frontend.template.limits import TemplateLimits

__all__ = ["CompiledTemplate", "RenderBudget", "TemplateBudgetError", "TemplateLimitError", "TemplateLimits",
           "compile_template", "disassemble"]
