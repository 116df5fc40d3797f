"""Codegen: AST to bytecode, with lexical scopes resolved to numbered slots.

Scoping follows jinja2 as Transformers runs it:

- the template root, each ``for`` body, each macro body and each call-block body is a
  scope; ``if``, ``set`` blocks and filter blocks are not;
- a name assigned anywhere in a ``for`` body gets a slot of that loop, re-initialised
  from the enclosing scope at the start of every iteration (assignments never leak out
  of a loop, nor from one iteration into the next);
- a macro reads free names from the scope it is defined in, at call time;
- names never assigned are context variables or globals, looked up once per render.

Every slot belongs to one render; a macro saves and restores the slots it owns around
each call so recursion is safe.
"""

from __future__ import annotations

from dataclasses import dataclass

from flare._fast.jinja_vm import FILTER_NAMES, TEST_NAMES
from flare.frontend.template import nodes as n
from flare.frontend.template.lexer import Source
from flare.frontend.template.opcodes import BINARY_OPS, COMPARE_OPS, Op

_FILTER_IDS = {name: i for i, name in enumerate(FILTER_NAMES)}
_TEST_IDS = {name: i for i, name in enumerate(TEST_NAMES)}
# jinja2's aliases.
_FILTER_IDS.update({"d": _FILTER_IDS["default"], "e": _FILTER_IDS["escape"],
                    "count": _FILTER_IDS["length"]})
_TEST_IDS.update({"==": _TEST_IDS["eq"], "equalto": _TEST_IDS["eq"], "!=": _TEST_IDS["ne"],
                  "<": _TEST_IDS["lt"], "lessthan": _TEST_IDS["lt"], "<=": _TEST_IDS["le"],
                  ">": _TEST_IDS["gt"], "greaterthan": _TEST_IDS["gt"], ">=": _TEST_IDS["ge"]})


@dataclass(frozen=True)
class Code:
    """Codegen output: everything the VM's Program is built from."""

    code: tuple        # flat (op, arg) int pairs
    consts: tuple      # constants: text, literals, specs
    slot_names: tuple  # name of each slot (for undefined messages)
    root_slots: tuple  # (slot, name) pairs filled from context/globals at render start
    mark_kind: str | None
    lines: tuple       # source line of each instruction, for the disassembler


class _Scope:
    def __init__(self, parent: "_Scope | None", kind: str):
        self.parent = parent
        self.kind = kind  # root, loop, macro
        self.names: dict[str, int] = {}
        self.owned: list[int] = []  # this scope's slots and its nested loop scopes'


def _assigned_names(body: list, out: set) -> set:
    """Names a statement list assigns in its own scope (nested loops/macros excluded)."""
    for node in body:
        if isinstance(node, n.Set):
            if isinstance(node.target, n.Name):
                out.add(node.target.name)
            elif isinstance(node.target, n.TupleLit):
                out.update(item.name for item in node.target.items)
        elif isinstance(node, n.SetBlock):
            out.add(node.target.name)
        elif isinstance(node, n.Macro):
            out.add(node.name)
        elif isinstance(node, n.If):
            _assigned_names(node.body, out)
            _assigned_names(node.otherwise, out)
        elif isinstance(node, n.For):
            _assigned_names(node.otherwise, out)
    return out


def _expr_loads(node, load) -> None:
    """Call ``load(name)`` for every name an expression reads."""
    if isinstance(node, n.Name):
        load(node.name)
    elif isinstance(node, (list, tuple)):
        for item in node:
            _expr_loads(item, load)
    elif isinstance(node, n.Node):
        for slot in node.__slots__:
            if slot != "pos":
                _expr_loads(getattr(node, slot), load)


def _store_first_names(body: list) -> set:
    """Root names whose first reference in jinja2's symbol analysis of the root frame
    is an assignment: jinja2 starts those undefined instead of resolving them from the
    context, which a macro or loop reading them before the assignment can observe.

    Mirrors jinja2's idtracking: statements in order, an assignment's value before its
    target, bodies of loops/macros/captures not visited (their own frames), and names
    first assigned inside an if branch resolved from the context.
    """
    refs: dict[str, str] = {}
    stores: set[str] = set()

    def load(name: str) -> None:
        refs.setdefault(name, "resolve")

    def store(name: str) -> None:
        stores.add(name)
        refs.setdefault(name, "undefined")

    def visit(nodes: list) -> None:
        nonlocal refs, stores
        for node in nodes:
            if isinstance(node, n.Output):
                _expr_loads([x for x in node.nodes if not isinstance(x, str)], load)
            elif isinstance(node, n.Set):
                _expr_loads(node.value, load)
                target = node.target
                if isinstance(target, n.Getattr):
                    load(target.obj.name)
                else:
                    for item in (target.items if isinstance(target, n.TupleLit) else [target]):
                        store(item.name)
            elif isinstance(node, n.SetBlock):
                store(node.target.name)
            elif isinstance(node, n.Macro):
                store(node.name)
            elif isinstance(node, n.For):
                _expr_loads(node.iter, load)
            elif isinstance(node, n.CallBlock):
                _expr_loads(node.call, load)
            elif isinstance(node, n.FilterBlock):
                _expr_loads(node.filters, load)
            elif isinstance(node, n.With):
                _expr_loads(node.values, load)
            elif isinstance(node, n.Mark):
                _expr_loads(node.expr, load)
            elif isinstance(node, n.If):
                _expr_loads(node.test, load)
                before_refs, before_stores = refs, stores
                branch_refs, branch_stores = {}, set()
                for branch in (node.body, node.otherwise):
                    refs, stores = dict(before_refs), set(before_stores)
                    visit(branch)
                    branch_refs.update(refs)
                    branch_stores |= stores
                refs, stores = before_refs, before_stores
                new = branch_stores - stores
                for name, kind in branch_refs.items():
                    refs.setdefault(name, kind)
                stores |= branch_stores
                for name in new:
                    refs[name] = "resolve"

    visit(body)
    return {name for name, kind in refs.items() if kind == "undefined"}


def _uses_name(node, name: str) -> bool:
    """Whether ``name`` is read anywhere below ``node`` (conservative: any scope)."""
    if isinstance(node, n.Name):
        return node.name == name
    if isinstance(node, (list, tuple)):
        return any(_uses_name(item, name) for item in node)
    if isinstance(node, n.Node):
        return any(_uses_name(getattr(node, slot), name) for slot in node.__slots__
                   if slot != "pos")
    return False


def _spine(node: n.BinOp) -> list:
    """Operands of a left-nested chain of one operator (a + b + c), in evaluation order."""
    op = node.op
    operands = []
    while isinstance(node, n.BinOp) and node.op == op:
        operands.append(node.right)
        node = node.left
    operands.append(node)
    operands.reverse()
    return operands


class CodeGen:
    def __init__(self, source: Source):
        self.source = source
        self.code: list[list[int]] = []
        self.lines: list[int] = []
        self.consts: list = []
        self._const_index: dict = {}
        self.slot_names: list[str] = []
        self.root = _Scope(None, "root")
        self.scope = self.root
        self.root_slots: dict[str, int] = {}
        self.loops: list[tuple[list, list]] = []  # (continue patches, break patches)
        self.capture_depth = 0  # >0 inside macros, captured sets, filter and call blocks
        # jinja2 defers "no such filter/test" to run time inside if statements and
        # conditional expressions (a "soft" frame); elsewhere it is a load error.
        self.soft = False
        self.store_first: set[str] = set()
        self.mark_kind: str | None = None
        self.cur_pos = 0

    # ------------------------------------------------------------ helpers

    def fail(self, message: str, pos: int):
        raise self.source.error(message, pos)

    def emit(self, op: Op, arg: int = 0) -> int:
        self.code.append([int(op), arg])
        self.lines.append(self.cur_pos)
        return len(self.code) - 1

    def here(self) -> int:
        return len(self.code)

    def patch(self, index: int, target: int | None = None) -> None:
        self.code[index][1] = self.here() if target is None else target

    def const(self, value) -> int:
        key = (type(value), value) if isinstance(value, (str, int, float, bool, type(None))) \
            else ("id", id(value))
        idx = self._const_index.get(key)
        if idx is None:
            idx = len(self.consts)
            self.consts.append(value)
            self._const_index[key] = idx
        return idx

    def new_slot(self, scope: _Scope, name: str) -> int:
        slot = len(self.slot_names)
        self.slot_names.append(name)
        scope.names[name] = slot
        s = scope
        while s is not None:
            s.owned.append(slot)
            if s.kind == "macro":
                break
            s = s.parent
        return slot

    def resolve(self, name: str, scope: _Scope | None = None) -> int:
        s = scope or self.scope
        while s is not None:
            slot = s.names.get(name)
            if slot is not None:
                return slot
            s = s.parent
        # A free name: context variable or global, looked up at render start (unless
        # the root assigns it before any root-level read: then it starts undefined).
        slot = len(self.slot_names)
        self.slot_names.append(name)
        self.root.names[name] = slot
        if name not in self.store_first:
            self.root_slots[name] = slot
        return slot

    def store_slot(self, name: str) -> int:
        slot = self.scope.names.get(name)
        if slot is None:
            slot = self.new_slot(self.scope, name)
            if self.scope is self.root and name not in self.store_first:
                self.root_slots[name] = slot
        return slot

    # ------------------------------------------------------------ statements

    def template(self, tpl: n.Template) -> Code:
        self.store_first = _store_first_names(tpl.body)
        self.body(tpl.body)
        self.emit(Op.HALT)
        flat = tuple(x for pair in self.code for x in pair)
        lines = tuple(self.source.where(p) for p in self.lines)
        return Code(flat, tuple(self.consts), tuple(self.slot_names),
                    tuple(sorted((slot, name) for name, slot in self.root_slots.items())),
                    self.mark_kind, lines)

    def body(self, nodes: list) -> None:
        for node in nodes:
            self.cur_pos = node.pos
            getattr(self, "stmt_" + type(node).__name__)(node)

    def stmt_Output(self, node: n.Output) -> None:
        text: list[str] = []

        def flush():
            if text:
                self.emit(Op.EMIT_CONST, self.const("".join(text)))
                text.clear()

        def foldable(item) -> bool:
            return isinstance(item, n.Const) and type(item.value) in (str, int, bool, type(None))

        for item in node.nodes:
            if isinstance(item, str):
                text.append(item)
            elif foldable(item):
                text.append(str(item.value))  # {{ 'literal' }}: folded into the text
            elif isinstance(item, n.BinOp) and item.op in ("+", "~"):
                operands = _spine(item)
                if item.op == "~":
                    # str(a) ~ str(b) printed equals printing each operand in turn.
                    for operand in operands:
                        if foldable(operand):
                            text.append(str(operand.value))
                        else:
                            flush()
                            self.expr(operand)
                            self.emit(Op.EMIT)
                else:
                    # `+` chains keep string operands as separate output pieces; the
                    # VM folds them with real `+` as soon as one operand is not a str.
                    flush()
                    self.expr(operands[0])
                    for operand in operands[1:]:
                        self.expr(operand)
                        self.emit(Op.CHAIN_ADD)
                    self.emit(Op.EMIT_CHAIN)
            else:
                flush()
                self.expr(item)
                self.emit(Op.EMIT)
        flush()

    def stmt_If(self, node: n.If) -> None:
        saved, self.soft = self.soft, True
        try:
            self._if(node)
        finally:
            self.soft = saved

    def _if(self, node: n.If) -> None:
        self.expr(node.test)
        jf = self.emit(Op.JUMP_IF_FALSE)
        self.body(node.body)
        if node.otherwise:
            j = self.emit(Op.JUMP)
            self.patch(jf)
            self.body(node.otherwise)
            self.patch(j)
        else:
            self.patch(jf)

    def _store_target(self, target: n.Node) -> None:
        if isinstance(target, n.Name):
            self.emit(Op.STORE, self.store_slot(target.name))
        else:
            self.emit(Op.UNPACK, len(target.items))
            for item in target.items:
                self.emit(Op.STORE, self.store_slot(item.name))

    def stmt_For(self, node: n.For) -> None:
        saved, self.soft = self.soft, False
        try:
            self._for(node)
        finally:
            self.soft = saved

    def _for(self, node: n.For) -> None:
        outer = self.scope
        scope = _Scope(outer, "loop")
        # Create the loop's slots up front so `owned` bookkeeping covers them.
        targets = node.target.items if isinstance(node.target, n.TupleLit) else [node.target]
        target_names = {t.name for t in targets}
        for name in target_names:
            self.new_slot(scope, name)
        uses_loop = _uses_name(node.body, "loop") or _uses_name(node.otherwise, "loop")
        loop_slot = self.new_slot(scope, "loop") if uses_loop else -1
        copies = []
        for name in sorted(_assigned_names(node.body, set()) - target_names - {"loop"}):
            src = self.resolve(name, outer)
            copies.append((self.new_slot(scope, name), src))

        if node.cond is not None:
            # Filtered loop: materialise the matching items first, so loop.length and
            # loop.last count only those (jinja2 does the same).
            tmp = self.new_slot(scope, "(filtered)")
            self.emit(Op.BUILD_LIST, 0)
            self.emit(Op.STORE, tmp)
            self.expr(node.iter)
            self.emit(Op.FOR_INIT, 0)
            top = self.here()
            exit_ = self.emit(Op.FOR_NEXT)
            self.emit(Op.DUP)
            self.scope = scope
            self._store_target(node.target)
            self.expr(node.cond)
            self.scope = outer
            drop = self.emit(Op.JUMP_IF_FALSE)
            self.emit(Op.LIST_APPEND, tmp)
            self.emit(Op.JUMP, top)
            self.patch(drop)
            self.emit(Op.POP)
            self.emit(Op.JUMP, top)
            self.patch(exit_)
            self.emit(Op.LOAD, tmp)
        else:
            self.expr(node.iter)

        has_else = 1 if node.otherwise else 0
        self.emit(Op.FOR_INIT, (loop_slot + 1) * 2 + has_else)
        top = self.here()
        exit_ = self.emit(Op.FOR_NEXT)
        self.scope = scope
        self._store_target(node.target)
        if copies:
            self.emit(Op.COPY_SLOTS, self.const(tuple(x for pair in copies for x in pair)))
        self.loops.append(([], []))
        self.body(node.body)
        continues, breaks = self.loops.pop()
        self.emit(Op.JUMP, top)
        for c in continues:
            self.patch(c, top)
        self.patch(exit_)
        if has_else:
            skip = self.emit(Op.JUMP_IF_FALSE)
            self.body(node.otherwise)
            self.patch(skip)
        for b in breaks:
            self.patch(b)
        self.scope = outer

    def stmt_With(self, node: n.With) -> None:
        # Values are evaluated in the enclosing scope; the body is a scope of its own
        # (jinja2: `{% with a = 1, b = a %}` binds b to the outer a).
        for value in node.values:
            self.expr(value)
        outer = self.scope
        scope = _Scope(outer, "loop")
        names = [t.name for t in node.targets]
        slots = [self.new_slot(scope, name) if name not in scope.names else scope.names[name]
                 for name in names]
        copies = []
        for name in sorted(_assigned_names(node.body, set()) - set(names)):
            copies.append((self.new_slot(scope, name), self.resolve(name, outer)))
        if copies:
            self.emit(Op.COPY_SLOTS, self.const(tuple(x for pair in copies for x in pair)))
        for slot in reversed(slots):
            self.emit(Op.STORE, slot)
        self.scope = scope
        self.body(node.body)
        self.scope = outer

    def stmt_Loopctl(self, node: n.Loopctl) -> None:
        continues, breaks = self.loops[-1]
        if node.kind == "break":
            self.emit(Op.FOR_BREAK)
            breaks.append(self.emit(Op.JUMP))
        else:
            continues.append(self.emit(Op.JUMP))

    def stmt_Set(self, node: n.Set) -> None:
        if isinstance(node.target, n.Getattr):
            self.expr(node.target.obj)
            self.expr(node.value)
            self.emit(Op.SET_ATTR, self.const(node.target.attr))
            return
        self.expr(node.value)
        self._store_target(node.target)

    def _captured(self, body: list) -> None:
        """Render ``body`` into a string on the stack. Like jinja2, a captured body is
        a scope of its own: names it assigns start from the enclosing value and do
        not leak out."""
        self.capture_depth += 1
        outer = self.scope
        scope = _Scope(outer, "loop")
        copies = [(self.new_slot(scope, name), self.resolve(name, outer))
                  for name in sorted(_assigned_names(body, set()))]
        self.emit(Op.CAPTURE)
        if copies:
            self.emit(Op.COPY_SLOTS, self.const(tuple(x for pair in copies for x in pair)))
        self.scope = scope
        self.body(body)
        self.scope = outer
        self.emit(Op.CAPTURE_END)
        self.capture_depth -= 1

    def stmt_SetBlock(self, node: n.SetBlock) -> None:
        self._captured(node.body)
        for f in node.filters:
            self.filter(f)
        self._store_target(node.target)

    def stmt_FilterBlock(self, node: n.FilterBlock) -> None:
        self._captured(node.body)
        for f in node.filters:
            self.filter(f)
        self.emit(Op.EMIT)

    def _function(self, name: str, params: list, defaults: list, body: list,
                  pos: int) -> int:
        """Emit a macro or caller body inline (jumped over); return its spec const."""
        skip = self.emit(Op.JUMP)
        entry = self.here()
        outer, saved_loops, saved_soft = self.scope, self.loops, self.soft
        self.soft = False
        scope = _Scope(outer, "macro")
        self.scope, self.loops = scope, []
        self.capture_depth += 1
        param_slots = [self.new_slot(scope, p) for p in params]
        special = []
        for extra in ("varargs", "kwargs", "caller"):
            special.append(self.new_slot(scope, extra)
                           if extra not in params and _uses_name(body, extra) else -1)
        first_default = len(params) - len(defaults)
        for i, default in enumerate(defaults):
            slot = param_slots[first_default + i]
            self.emit(Op.SKIP_IF_UNBOUND, slot)
            j = self.emit(Op.JUMP)
            self.expr(default)
            self.emit(Op.STORE, slot)
            self.patch(j)
        # Like a loop body, a macro's assigned names start from the enclosing value.
        copies = []
        for local in sorted(_assigned_names(body, set()) - set(params)):
            if local not in scope.names:
                copies.append((self.new_slot(scope, local), self.resolve(local, outer)))
        if copies:
            self.emit(Op.COPY_SLOTS, self.const(tuple(x for pair in copies for x in pair)))
        self.body(body)
        self.emit(Op.RETURN)
        self.capture_depth -= 1
        self.scope, self.loops, self.soft = outer, saved_loops, saved_soft
        self.patch(skip)
        spec = (name, entry, tuple(param_slots), len(defaults), tuple(scope.owned),
                special[0], special[1], special[2])
        return self.const(spec)

    def stmt_Macro(self, node: n.Macro) -> None:
        slot = self.store_slot(node.name)
        spec = self._function(node.name, node.params, node.defaults, node.body, node.pos)
        self.emit(Op.MAKE_MACRO, spec)
        self.emit(Op.STORE, slot)

    def stmt_CallBlock(self, node: n.CallBlock) -> None:
        spec = self._function("caller", node.params, node.defaults, node.body, node.pos)
        call = node.call
        kwargs = list(call.kwargs) + [("caller", None)]
        self._call(call, kwargs, caller_spec=spec)
        self.emit(Op.EMIT)

    def stmt_Mark(self, node: n.Mark) -> None:
        if self.capture_depth:
            self.fail("{% mark %} is not allowed inside macros, captured assignments, "
                      "filter blocks or call blocks", node.pos)
        kind = "offset" if node.expr is None else "segment"
        if self.mark_kind not in (None, kind):
            self.fail("a template cannot mix {% mark %} and {% mark expr %}", node.pos)
        self.mark_kind = kind
        if node.expr is None:
            self.emit(Op.MARK)
        else:
            self.expr(node.expr)
            self.emit(Op.MARK_VALUE)

    # ------------------------------------------------------------ expressions

    def expr(self, node: n.Node) -> None:
        getattr(self, "expr_" + type(node).__name__)(node)

    def expr_Const(self, node: n.Const) -> None:
        self.emit(Op.LOAD_CONST, self.const(node.value))

    def expr_Name(self, node: n.Name) -> None:
        self.emit(Op.LOAD, self.resolve(node.name))

    def expr_Getattr(self, node: n.Getattr) -> None:
        self.expr(node.obj)
        self.emit(Op.GETATTR, self.const(node.attr))

    def expr_Getitem(self, node: n.Getitem) -> None:
        self.expr(node.obj)
        self.expr(node.key)
        self.emit(Op.GETITEM)

    def expr_Slice(self, node: n.Slice) -> None:
        self.expr(node.obj)
        for part in (node.start, node.stop, node.step):
            if part is None:
                self.emit(Op.LOAD_CONST, self.const(None))
            else:
                self.expr(part)
        self.emit(Op.SLICE)

    def _args(self, args: list, kwargs: list) -> tuple:
        for a in args:
            self.expr(a)
        for _, v in kwargs:
            if v is not None:
                self.expr(v)
        return tuple(k for k, _ in kwargs)

    def _call(self, node: n.Call, kwargs: list, caller_spec: int = -1) -> None:
        func = node.func
        if isinstance(func, n.Getattr):
            self.expr(func.obj)
            kwnames = self._args(node.args, kwargs)
            if caller_spec >= 0:
                self.emit(Op.MAKE_MACRO, caller_spec)
            self.emit(Op.CALL_METHOD, self.const((func.attr, len(node.args), kwnames)))
        else:
            self.expr(func)
            kwnames = self._args(node.args, kwargs)
            if caller_spec >= 0:
                self.emit(Op.MAKE_MACRO, caller_spec)
            self.emit(Op.CALL, self.const((None, len(node.args), kwnames)))

    def expr_Call(self, node: n.Call) -> None:
        self.cur_pos = node.pos
        self._call(node, node.kwargs)

    def filter(self, node: n.Filter) -> None:
        fid = _FILTER_IDS.get(node.name)
        if fid is None and not self.soft:
            self.fail(f"no filter named '{node.name}'", node.pos)
        kwnames = self._args(node.args, node.kwargs)
        if fid is None:
            self.emit(Op.RAISE, self.const(f"No filter named {node.name!r} found."))
            return
        self.emit(Op.FILTER, self.const((fid, len(node.args), kwnames)))

    def expr_Filter(self, node: n.Filter) -> None:
        self.expr(node.value)
        self.filter(node)

    def expr_Test(self, node: n.Test) -> None:
        tid = _TEST_IDS.get(node.name)
        if tid is None and not self.soft:
            self.fail(f"no test named '{node.name}'", node.pos)
        self.expr(node.value)
        kwnames = self._args(node.args, node.kwargs)
        if tid is None:
            self.emit(Op.RAISE, self.const(f"No test named {node.name!r} found."))
            return
        self.emit(Op.TEST, self.const((tid, len(node.args), kwnames)))

    def expr_BinOp(self, node: n.BinOp) -> None:
        self.expr(node.left)
        self.expr(node.right)
        self.emit(Op.BINARY, int(BINARY_OPS[node.op]))

    def expr_Compare(self, node: n.Compare) -> None:
        # Chains (a < b < c) evaluate each middle operand twice; operands are pure.
        jumps = []
        left = node.left
        for i, (op, right) in enumerate(node.ops):
            self.expr(left)
            self.expr(right)
            self.emit(Op.COMPARE, int(COMPARE_OPS[op]))
            if i < len(node.ops) - 1:
                jumps.append(self.emit(Op.JUMP_IF_FALSE_KEEP))
            left = right
        for j in jumps:
            self.patch(j)

    def expr_Unary(self, node: n.Unary) -> None:
        self.expr(node.operand)
        self.emit({"not": Op.NOT, "neg": Op.NEG, "pos": Op.POS}[node.op])

    def expr_And(self, node: n.And) -> None:
        self.expr(node.left)
        j = self.emit(Op.JUMP_IF_FALSE_KEEP)
        self.expr(node.right)
        self.patch(j)

    def expr_Or(self, node: n.Or) -> None:
        self.expr(node.left)
        j = self.emit(Op.JUMP_IF_TRUE_KEEP)
        self.expr(node.right)
        self.patch(j)

    def expr_CondExpr(self, node: n.CondExpr) -> None:
        saved, self.soft = self.soft, True
        try:
            self._condexpr(node)
        finally:
            self.soft = saved

    def _condexpr(self, node: n.CondExpr) -> None:
        self.expr(node.test)
        jf = self.emit(Op.JUMP_IF_FALSE)
        self.expr(node.then)
        j = self.emit(Op.JUMP)
        self.patch(jf)
        if node.otherwise is None:
            line = self.source.where(node.pos).split(",")[0].split()[-1]
            self.emit(Op.LOAD_UNDEFINED, self.const(
                f"the inline if-expression on line {line} evaluated to false and no else "
                "section was defined."))
        else:
            self.expr(node.otherwise)
        self.patch(j)

    def expr_ListLit(self, node: n.ListLit) -> None:
        for item in node.items:
            self.expr(item)
        self.emit(Op.BUILD_LIST, len(node.items))

    def expr_TupleLit(self, node: n.TupleLit) -> None:
        if all(isinstance(i, n.Const) for i in node.items):
            self.emit(Op.LOAD_CONST, self.const(tuple(i.value for i in node.items)))
            return
        for item in node.items:
            self.expr(item)
        self.emit(Op.BUILD_TUPLE, len(node.items))

    def expr_DictLit(self, node: n.DictLit) -> None:
        for k, v in node.items:
            self.expr(k)
            self.expr(v)
        self.emit(Op.BUILD_DICT, len(node.items))


def generate(tpl: n.Template, source: Source) -> Code:
    """Compile a parsed template to :class:`Code`."""
    gen = CodeGen(source)
    try:
        return gen.template(tpl)
    except RecursionError:
        raise source.error("expressions or blocks nested too deeply", gen.cur_pos) from None
