"""Disassembler: a stable, human-readable listing of compiled bytecode (golden files)."""

from __future__ import annotations

from flare.frontend.template.compiled import CompiledTemplate
from flare.frontend.template.opcodes import JUMP_OPS, BinaryOp, CompareOp, Op

_CONST_OPS = {Op.EMIT_CONST, Op.LOAD_CONST, Op.GETATTR, Op.SET_ATTR, Op.LOAD_UNDEFINED,
              Op.COPY_SLOTS, Op.RAISE}
_SLOT_OPS = {Op.LOAD, Op.STORE, Op.LIST_APPEND, Op.SKIP_IF_UNBOUND}
_SPEC_OPS = {Op.FILTER, Op.TEST, Op.CALL, Op.CALL_METHOD}


def _describe(compiled: CompiledTemplate, op: Op, arg: int) -> str:
    from flare._fast.jinja_vm import FILTER_NAMES, TEST_NAMES
    code = compiled.code
    if op in JUMP_OPS:
        return f"-> {arg}"
    if op in _SLOT_OPS:
        return f"{arg} ({code.slot_names[arg]})"
    if op in _CONST_OPS:
        return f"{arg} ({code.consts[arg]!r})"
    if op == Op.BINARY:
        return BinaryOp(arg).name
    if op == Op.COMPARE:
        return CompareOp(arg).name
    if op in _SPEC_OPS:
        head, nargs, kwnames = code.consts[arg]
        if op == Op.FILTER:
            head = FILTER_NAMES[head]
        elif op == Op.TEST:
            head = TEST_NAMES[head]
        kw = f" kw={','.join(kwnames)}" if kwnames else ""
        return f"{head or ''} args={nargs}{kw}".strip()
    if op == Op.FOR_INIT:
        slot = (arg >> 1) - 1
        loop = f"loop={slot} ({code.slot_names[slot]})" if slot >= 0 else "loop=-"
        return loop + (" else" if arg & 1 else "")
    if op == Op.MAKE_MACRO:
        name, entry, params, num_defaults = code.consts[arg][:4]
        return f"{name} entry={entry} params={len(params)} defaults={num_defaults}"
    if op in (Op.BUILD_LIST, Op.BUILD_TUPLE, Op.BUILD_DICT, Op.UNPACK):
        return str(arg)
    return ""


def disassemble(compiled: CompiledTemplate) -> str:
    """One line per instruction: index, source position, opcode, decoded argument."""
    code = compiled.code
    lines = []
    for i in range(0, len(code.code), 2):
        op = Op(code.code[i])
        arg = code.code[i + 1]
        detail = _describe(compiled, op, arg)
        where = code.lines[i // 2].replace("line ", "L").replace(", column ", ":")
        lines.append(f"{i // 2:5d} {where:>9} {op.name:<18} {detail}".rstrip())
    return "\n".join(lines) + "\n"
