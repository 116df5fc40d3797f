"""Chat-template compiler: Jinja source to bytecode for the Cython VM.

``compile_template(source)`` lexes (:mod:`.lexer`), parses (:mod:`.parser`, AST in
:mod:`.nodes`) and generates bytecode (:mod:`.codegen`, instruction set in
:mod:`.opcodes`) once at load; :class:`CompiledTemplate` renders it with
``flare._fast.jinja_vm`` and :func:`disassemble` lists it.
"""

from flare.frontend.template.compiled import CompiledTemplate, compile_template
from flare.frontend.template.disasm import disassemble

__all__ = ["CompiledTemplate", "compile_template", "disassemble"]
