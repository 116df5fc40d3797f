"""Bytecode instruction set shared by codegen, the disassembler and the Cython VM.

An instruction is two int32 words: ``op, arg``. The numbering is mirrored by the
``cdef enum`` in ``flare/_fast/jinja_vm.pyx``; ``tests/frontend/test_template_compile``
checks that both agree.
"""

from __future__ import annotations

import enum


class Op(enum.IntEnum):
    NOP = 0                # do nothing (patched-out jump targets)
    EMIT_CONST = 1         # append consts[arg] (template text) to the output
    EMIT = 2               # pop a value and append str(value) to the output; undefined prints ''
    LOAD_CONST = 3         # push consts[arg]
    LOAD = 4               # push slot arg, or an undefined named after it when unset
    STORE = 5              # pop into slot arg
    COPY_SLOTS = 6         # per loop iteration: copy each (dst, src) slot pair of consts[arg]
    GETATTR = 7            # pop obj, push the sandboxed attribute consts[arg] (item fallback)
    GETITEM = 8            # pop key and obj, push the sandboxed item (attribute fallback)
    SLICE = 9              # pop step, stop, start, obj; push obj[start:stop:step]
    BINARY = 10            # pop right and left, push left <arg> right (BinaryOp)
    COMPARE = 11           # pop right and left, push the comparison <arg> (CompareOp)
    NOT = 12               # replace top with its negated truth value
    NEG = 13               # replace top with -top
    POS = 14               # replace top with +top
    JUMP = 15              # continue at instruction arg
    JUMP_IF_FALSE = 16     # pop; jump to arg when falsy
    JUMP_IF_TRUE = 17      # pop; jump to arg when truthy
    JUMP_IF_FALSE_KEEP = 18  # `and`: when top is falsy jump to arg keeping it, else pop it
    JUMP_IF_TRUE_KEEP = 19   # `or`: when top is truthy jump to arg keeping it, else pop it
    BUILD_LIST = 20        # pop arg values, push them as a list
    BUILD_TUPLE = 21       # pop arg values, push them as a tuple
    BUILD_DICT = 22        # pop arg key/value pairs, push them as a dict
    UNPACK = 23            # pop an iterable of exactly arg items, push them first-on-top
    FILTER = 24            # apply filter spec arg to the value below its arguments
    TEST = 25              # apply test spec arg to the value below its arguments
    CALL = 26              # call the callee below its arguments with call spec arg
    CALL_METHOD = 27       # call the method named in spec arg on the object below its arguments
    FOR_INIT = 28          # pop an iterable, start a loop (loop object stored in slot arg, -1: none)
    FOR_NEXT = 29          # push the next item of the innermost loop, or end it and jump to arg
    FOR_BREAK = 30         # end the innermost loop early
    CAPTURE = 31           # start collecting output into a fresh buffer
    CAPTURE_END = 32       # finish the innermost capture and push its text
    SET_ATTR = 33          # pop value and namespace, set namespace attribute consts[arg]
    MAKE_MACRO = 34        # push a macro for macro spec arg
    RETURN = 35            # end of a macro body: return the captured output to the caller
    MARK = 36              # record the UTF-8 byte offset of the output
    MARK_VALUE = 37        # pop a nonnegative int segment count and record it
    POP = 38               # discard the top value
    DUP = 39               # push the top value again
    LIST_APPEND = 40       # pop a value and append it to the list in slot arg
    HALT = 41              # end of the template
    SKIP_IF_UNBOUND = 42   # macro prologue: when slot arg has no value, skip the next instruction
    LOAD_UNDEFINED = 43    # push an undefined whose error message is consts[arg]
    RAISE = 44             # fail the render with message consts[arg] (unknown filter in an if)
    CHAIN_ADD = 45         # `+` in an output chain: keep str operands as pieces, else really add
    EMIT_CHAIN = 46        # append the chain's pieces (or its folded value) to the output


class BinaryOp(enum.IntEnum):
    ADD = 0       # +
    SUB = 1       # -
    MUL = 2       # *
    DIV = 3       # /
    FLOORDIV = 4  # //
    MOD = 5       # %
    POW = 6       # **
    CONCAT = 7    # ~ (both sides converted to str, undefined as '')


class CompareOp(enum.IntEnum):
    EQ = 0     # ==
    NE = 1     # !=
    LT = 2     # <
    LE = 3     # <=
    GT = 4     # >
    GE = 5     # >=
    IN = 6     # in
    NOTIN = 7  # not in


BINARY_OPS = {"+": BinaryOp.ADD, "-": BinaryOp.SUB, "*": BinaryOp.MUL, "/": BinaryOp.DIV,
              "//": BinaryOp.FLOORDIV, "%": BinaryOp.MOD, "**": BinaryOp.POW,
              "~": BinaryOp.CONCAT}
COMPARE_OPS = {"==": CompareOp.EQ, "!=": CompareOp.NE, "<": CompareOp.LT, "<=": CompareOp.LE,
               ">": CompareOp.GT, ">=": CompareOp.GE, "in": CompareOp.IN,
               "notin": CompareOp.NOTIN}

# Ops whose argument is an instruction index.
JUMP_OPS = frozenset({Op.JUMP, Op.JUMP_IF_FALSE, Op.JUMP_IF_TRUE, Op.JUMP_IF_FALSE_KEEP,
                      Op.JUMP_IF_TRUE_KEEP, Op.FOR_NEXT})
