"""Recursive-descent parser: tokens to the AST in :mod:`nodes`.

The grammar and operator precedence are jinja2's (the reference renderer for chat
templates): conditional expressions bind loosest, then ``or``, ``and``, ``not``,
comparisons, ``+ -``, ``~``, ``* / // %``, ``**``, unary minus, then postfix
attribute/item/call and finally filters and tests.
"""

from __future__ import annotations

from flare.frontend.template import nodes as n
from flare.frontend.template.lexer import (
    BLOCK_BEGIN,
    BLOCK_END,
    DATA,
    EOF,
    FLOAT,
    INT,
    NAME,
    OP,
    STRING,
    VAR_BEGIN,
    VAR_END,
    Source,
    Token,
    tokenize,
)

_COMPARE_OPS = ("==", "!=", "<", "<=", ">", ">=")
_TEST_ARG_START = {NAME, STRING, INT, FLOAT}
_SUPPORTED_TAGS = ("for", "if", "set", "macro", "call", "filter", "break", "continue",
                   "generation", "mark", "with")


class Parser:
    """Parses one template; use :func:`parse`."""

    def __init__(self, source: Source):
        self.source = source
        self.tokens = tokenize(source)
        self.i = 0
        self.loop_depth = 0

    # ------------------------------------------------------------ token helpers

    @property
    def cur(self) -> Token:
        return self.tokens[self.i]

    def peek(self, k: int = 1) -> Token:
        return self.tokens[min(self.i + k, len(self.tokens) - 1)]

    def next(self) -> Token:
        tok = self.tokens[self.i]
        self.i += 1
        return tok

    def fail(self, message: str, tok: Token | None = None):
        tok = tok or self.cur
        raise self.source.error(message, tok.pos)

    def is_op(self, op: str) -> bool:
        tok = self.cur
        return tok.kind == OP and tok.value == op

    def is_name(self, name: str) -> bool:
        tok = self.cur
        return tok.kind == NAME and tok.value == name

    def skip_op(self, op: str) -> bool:
        if self.is_op(op):
            self.i += 1
            return True
        return False

    def skip_name(self, name: str) -> bool:
        if self.is_name(name):
            self.i += 1
            return True
        return False

    def expect_op(self, op: str) -> Token:
        if not self.is_op(op):
            self.fail(f"expected '{op}', got {self.describe(self.cur)}")
        return self.next()

    def expect_name(self, name: str | None = None) -> Token:
        tok = self.cur
        if tok.kind != NAME or (name is not None and tok.value != name):
            self.fail(f"expected {repr(name) if name else 'a name'}, got {self.describe(tok)}")
        return self.next()

    def expect_block_end(self) -> None:
        if self.cur.kind != BLOCK_END:
            self.fail(f"expected end of statement block, got {self.describe(self.cur)}")
        self.i += 1

    @staticmethod
    def describe(tok: Token) -> str:
        if tok.kind in (NAME, OP):
            return repr(tok.value)
        if tok.kind == EOF:
            return "end of template"
        return {BLOCK_END: "end of statement block", VAR_END: "end of print statement",
                STRING: "string", INT: "integer", FLOAT: "float"}.get(tok.kind, tok.kind)

    # ------------------------------------------------------------ statements

    def parse_template(self) -> n.Template:
        body = self.subparse(())
        if self.cur.kind != EOF:
            tok = self.peek()
            self.fail(f"unexpected '{tok.value}'", tok)
        return n.Template(0, body)

    def subparse(self, end_names: tuple) -> list:
        body: list = []
        data: list = []
        data_pos = self.cur.pos

        def flush():
            if data:
                body.append(n.Output(data_pos, list(data)))
                data.clear()

        while True:
            tok = self.cur
            if tok.kind == DATA:
                if not data:
                    data_pos = tok.pos
                data.append(tok.value)
                self.i += 1
            elif tok.kind == VAR_BEGIN:
                if not data:
                    data_pos = tok.pos
                self.i += 1
                data.append(self.parse_tuple())
                if self.cur.kind != VAR_END:
                    self.fail(f"expected end of print statement, got {self.describe(self.cur)}")
                self.i += 1
            elif tok.kind == BLOCK_BEGIN:
                flush()
                head = self.peek()
                if head.kind == NAME and head.value in end_names:
                    self.i += 1  # leave the end tag's name as current token
                    return body
                self.i += 1
                body.append(self.parse_statement())
            elif tok.kind == EOF:
                flush()
                if end_names:
                    self.fail("unexpected end of template, expected "
                              + " or ".join(f"'{e}'" for e in end_names))
                return body
            else:
                self.fail(f"unexpected {self.describe(tok)}")

    def parse_body(self, end_names: tuple, drop: bool = True) -> list:
        body = self.subparse(end_names)
        if drop:
            self.i += 1  # the end tag name
            self.expect_block_end()
        return body

    def parse_statement(self):
        tok = self.cur
        if tok.kind != NAME:
            self.fail("tag name expected")
        name = tok.value
        if name not in _SUPPORTED_TAGS:
            if name in ("endfor", "endif", "endset", "endmacro", "endcall", "endfilter", "else",
                        "elif", "endgeneration", "endraw", "endwith"):
                self.fail(f"unexpected '{name}'")
            self.fail(f"unsupported tag '{name}'")
        self.i += 1
        return getattr(self, "parse_" + name)(tok)

    def parse_for(self, tok: Token):
        target = self.parse_assign_target(end_names=("in",))
        self.expect_name("in")
        it = self.parse_tuple(with_condexpr=False, end_names=("recursive",))
        cond = None
        if self.skip_name("if"):
            cond = self.parse_expression()
        if self.is_name("recursive"):
            self.fail("recursive for loops are not supported")
        self.expect_block_end()
        self.loop_depth += 1
        body = self.parse_body(("endfor", "else"), drop=False)
        self.loop_depth -= 1
        otherwise = []
        if self.next().value == "else":
            self.expect_block_end()
            otherwise = self.parse_body(("endfor",))
        else:
            self.expect_block_end()
        return n.For(tok.pos, target, it, body, otherwise, cond)

    def parse_if(self, tok: Token):
        test = self.parse_tuple(with_condexpr=False)
        self.expect_block_end()
        body = self.parse_body(("elif", "else", "endif"), drop=False)
        node = n.If(tok.pos, test, body, [])
        tail = node
        while True:
            end = self.next()
            if end.value == "elif":
                test = self.parse_tuple(with_condexpr=False)
                self.expect_block_end()
                body = self.parse_body(("elif", "else", "endif"), drop=False)
                nxt = n.If(end.pos, test, body, [])
                tail.otherwise = [nxt]
                tail = nxt
            elif end.value == "else":
                self.expect_block_end()
                tail.otherwise = self.parse_body(("endif",))
                return node
            else:
                self.expect_block_end()
                return node

    def parse_set(self, tok: Token):
        target = self.parse_assign_target(with_namespace=True)
        if self.skip_op("="):
            value = self.parse_tuple()
            self.expect_block_end()
            return n.Set(tok.pos, target, value)
        if isinstance(target, n.Getattr):
            self.fail("a block set cannot assign a namespace attribute", tok)
        filters = self.parse_filter_chain(None) if self.is_op("|") else []
        self.expect_block_end()
        body = self.parse_body(("endset",))
        return n.SetBlock(tok.pos, target, filters, body)

    def parse_signature(self, params: list, defaults: list) -> None:
        self.expect_op("(")
        while not self.is_op(")"):
            if params:
                self.expect_op(",")
                if self.is_op(")"):
                    break
            ptok = self.expect_name()
            if ptok.value in params:
                self.fail(f"duplicate parameter '{ptok.value}'", ptok)
            params.append(ptok.value)
            if self.skip_op("="):
                defaults.append(self.parse_expression())
            elif defaults:
                self.fail("non-default argument follows default argument", ptok)
        self.expect_op(")")

    def parse_macro(self, tok: Token):
        name = self.expect_name().value
        params: list = []
        defaults: list = []
        self.parse_signature(params, defaults)
        self.expect_block_end()
        saved, self.loop_depth = self.loop_depth, 0
        body = self.parse_body(("endmacro",))
        self.loop_depth = saved
        return n.Macro(tok.pos, name, params, defaults, body)

    def parse_call(self, tok: Token):
        params: list = []
        defaults: list = []
        if self.is_op("("):
            self.parse_signature(params, defaults)
        call = self.parse_expression()
        if not isinstance(call, n.Call):
            self.fail("expected call", tok)
        self.expect_block_end()
        saved, self.loop_depth = self.loop_depth, 0
        body = self.parse_body(("endcall",))
        self.loop_depth = saved
        return n.CallBlock(tok.pos, call, params, defaults, body)

    def parse_filter(self, tok: Token):
        # `{% filter a(x) | b %}`: the first filter has no leading pipe.
        first = self.cur
        name = self._dotted_name()
        args, kwargs = self.parse_args() if self.is_op("(") else ([], [])
        filters = [n.Filter(first.pos, None, name, args, kwargs)]
        filters += self.parse_filter_chain(None)
        self.expect_block_end()
        body = self.parse_body(("endfilter",))
        return n.FilterBlock(tok.pos, filters, body)

    def parse_break(self, tok: Token):
        return self._loopctl(tok, "break")

    def parse_continue(self, tok: Token):
        return self._loopctl(tok, "continue")

    def _loopctl(self, tok: Token, kind: str):
        if not self.loop_depth:
            self.fail(f"'{kind}' outside of a for loop", tok)
        self.expect_block_end()
        return n.Loopctl(tok.pos, kind)

    def parse_with(self, tok: Token):
        targets, values = [], []
        while self.cur.kind != BLOCK_END:
            if targets:
                self.expect_op(",")
            target = self.parse_assign_target()
            if not isinstance(target, n.Name):
                self.fail("with can only assign names", tok)
            targets.append(target)
            self.expect_op("=")
            values.append(self.parse_expression())
        self.expect_block_end()
        body = self.parse_body(("endwith",))
        return n.With(tok.pos, targets, values, body)

    def parse_generation(self, tok: Token):
        self.expect_block_end()
        body = self.parse_body(("endgeneration",))
        return n.If(tok.pos, n.Const(tok.pos, True), body, [])

    def parse_mark(self, tok: Token):
        expr = None
        if self.cur.kind != BLOCK_END:
            expr = self.parse_expression()
        self.expect_block_end()
        return n.Mark(tok.pos, expr)

    def parse_assign_target(self, with_namespace: bool = False, end_names: tuple = ()):
        tok = self.cur
        if with_namespace and tok.kind == NAME and self.peek().kind == OP and self.peek().value == ".":
            self.i += 2
            attr = self.expect_name()
            return n.Getattr(tok.pos, n.Name(tok.pos, tok.value), attr.value)
        target = self.parse_tuple(simplified=True, end_names=end_names)
        items = target.items if isinstance(target, n.TupleLit) else [target]
        for item in items:
            if not isinstance(item, n.Name):
                self.fail("can't assign to this expression", tok)
            if item.name in ("true", "false", "none", "True", "False", "None"):
                self.fail(f"can't assign to '{item.name}'", tok)
        return target

    # ------------------------------------------------------------ expressions

    def parse_tuple(self, simplified=False, with_condexpr=True, end_names=(),
                    explicit_parens=False):
        pos = self.cur.pos
        if simplified:
            parse = self.parse_primary
        elif with_condexpr:
            parse = self.parse_expression
        else:
            parse = lambda: self.parse_expression(False)  # noqa: E731
        args = []
        is_tuple = False
        while True:
            if args:
                self.expect_op(",")
            tok = self.cur
            if tok.kind in (VAR_END, BLOCK_END) or (tok.kind == OP and tok.value == ")") \
                    or (tok.kind == NAME and tok.value in end_names):
                break
            args.append(parse())
            if self.is_op(","):
                is_tuple = True
            else:
                break
        if not is_tuple:
            if args:
                return args[0]
            if not explicit_parens:
                self.fail(f"expected an expression, got {self.describe(self.cur)}")
        return n.TupleLit(pos, args)

    def parse_expression(self, with_condexpr: bool = True):
        return self.parse_condexpr() if with_condexpr else self.parse_or()

    def parse_condexpr(self):
        expr1 = self.parse_or()
        while self.is_name("if"):
            pos = self.next().pos
            expr2 = self.parse_or()
            expr3 = self.parse_condexpr() if self.skip_name("else") else None
            expr1 = n.CondExpr(pos, expr2, expr1, expr3)
        return expr1

    def parse_or(self):
        left = self.parse_and()
        while self.is_name("or"):
            pos = self.next().pos
            left = n.Or(pos, left, self.parse_and())
        return left

    def parse_and(self):
        left = self.parse_not()
        while self.is_name("and"):
            pos = self.next().pos
            left = n.And(pos, left, self.parse_not())
        return left

    def parse_not(self):
        if self.is_name("not"):
            pos = self.next().pos
            return n.Unary(pos, "not", self.parse_not())
        return self.parse_compare()

    def parse_compare(self):
        pos = self.cur.pos
        expr = self.parse_math1()
        ops = []
        while True:
            tok = self.cur
            if tok.kind == OP and tok.value in _COMPARE_OPS:
                self.i += 1
                ops.append((tok.value, self.parse_math1()))
            elif self.skip_name("in"):
                ops.append(("in", self.parse_math1()))
            elif self.is_name("not") and self.peek().kind == NAME and self.peek().value == "in":
                self.i += 2
                ops.append(("notin", self.parse_math1()))
            else:
                break
        return n.Compare(pos, expr, ops) if ops else expr

    def parse_math1(self):
        left = self.parse_concat()
        while self.cur.kind == OP and self.cur.value in ("+", "-"):
            tok = self.next()
            left = n.BinOp(tok.pos, tok.value, left, self.parse_concat())
        return left

    def parse_concat(self):
        left = self.parse_math2()
        while self.is_op("~"):
            tok = self.next()
            left = n.BinOp(tok.pos, "~", left, self.parse_math2())
        return left

    def parse_math2(self):
        left = self.parse_pow()
        while self.cur.kind == OP and self.cur.value in ("*", "/", "//", "%"):
            tok = self.next()
            left = n.BinOp(tok.pos, tok.value, left, self.parse_pow())
        return left

    def parse_pow(self):
        left = self.parse_unary()
        while self.is_op("**"):
            tok = self.next()
            left = n.BinOp(tok.pos, "**", left, self.parse_unary())
        return left

    def parse_unary(self, with_filter: bool = True):
        tok = self.cur
        if tok.kind == OP and tok.value == "-":
            self.i += 1
            node = n.Unary(tok.pos, "neg", self.parse_unary(False))
        elif tok.kind == OP and tok.value == "+":
            self.i += 1
            node = n.Unary(tok.pos, "pos", self.parse_unary(False))
        else:
            node = self.parse_primary()
        node = self.parse_postfix(node)
        if with_filter:
            node = self.parse_filter_expr(node)
        return node

    def parse_primary(self):
        tok = self.cur
        if tok.kind == NAME:
            self.i += 1
            if tok.value in ("true", "True"):
                return n.Const(tok.pos, True)
            if tok.value in ("false", "False"):
                return n.Const(tok.pos, False)
            if tok.value in ("none", "None"):
                return n.Const(tok.pos, None)
            return n.Name(tok.pos, tok.value)
        if tok.kind == STRING:
            self.i += 1
            parts = [tok.value]
            while self.cur.kind == STRING:
                parts.append(self.next().value)
            return n.Const(tok.pos, "".join(parts))
        if tok.kind in (INT, FLOAT):
            self.i += 1
            return n.Const(tok.pos, tok.value)
        if tok.kind == OP:
            if tok.value == "(":
                self.i += 1
                node = self.parse_tuple(explicit_parens=True)
                self.expect_op(")")
                return node
            if tok.value == "[":
                return self.parse_list()
            if tok.value == "{":
                return self.parse_dict()
        self.fail(f"unexpected {self.describe(tok)}")

    def parse_list(self):
        pos = self.expect_op("[").pos
        items = []
        while not self.is_op("]"):
            if items:
                self.expect_op(",")
            if self.is_op("]"):
                break
            items.append(self.parse_expression())
        self.expect_op("]")
        return n.ListLit(pos, items)

    def parse_dict(self):
        pos = self.expect_op("{").pos
        items = []
        while not self.is_op("}"):
            if items:
                self.expect_op(",")
            if self.is_op("}"):
                break
            key = self.parse_expression()
            self.expect_op(":")
            items.append((key, self.parse_expression()))
        self.expect_op("}")
        return n.DictLit(pos, items)

    def parse_postfix(self, node):
        while True:
            tok = self.cur
            if tok.kind != OP:
                return node
            if tok.value == ".":
                self.i += 1
                attr = self.cur
                if attr.kind == NAME:
                    self.i += 1
                    if attr.value.startswith("__"):
                        self.fail(f"access to attribute '{attr.value}' is unsafe", attr)
                    node = n.Getattr(tok.pos, node, attr.value)
                elif attr.kind == INT:
                    self.i += 1
                    node = n.Getitem(tok.pos, node, n.Const(attr.pos, attr.value))
                else:
                    self.fail("expected name or number", attr)
            elif tok.value == "[":
                self.i += 1
                keys = []
                while not self.is_op("]"):
                    if keys:
                        self.expect_op(",")
                    keys.append(self.parse_subscribed(node))
                self.expect_op("]")
                if len(keys) == 1 and isinstance(keys[0], n.Slice):
                    node = keys[0]
                elif len(keys) == 1:
                    node = n.Getitem(tok.pos, node, keys[0])
                else:
                    self.fail("multi-dimensional subscripts are not supported", tok)
            elif tok.value == "(":
                node = self.parse_call_args(node)
            else:
                return node

    def parse_subscribed(self, obj):
        pos = self.cur.pos
        if self.is_op(":"):
            self.i += 1
            args = [None]
        else:
            node = self.parse_expression()
            if not self.is_op(":"):
                return node
            self.i += 1
            args = [node]
        if self.is_op(":"):
            args.append(None)
        elif not (self.is_op("]") or self.is_op(",")):
            args.append(self.parse_expression())
        else:
            args.append(None)
        if self.skip_op(":"):
            if not (self.is_op("]") or self.is_op(",")):
                args.append(self.parse_expression())
            else:
                args.append(None)
        else:
            args.append(None)
        return n.Slice(pos, obj, *args)

    def parse_args(self):
        self.expect_op("(")
        args, kwargs = [], []
        while not self.is_op(")"):
            if args or kwargs:
                self.expect_op(",")
                if self.is_op(")"):
                    break
            if self.is_op("*") or self.is_op("**"):
                self.fail("*args and **kwargs calls are not supported")
            if self.cur.kind == NAME and self.peek().kind == OP and self.peek().value == "=":
                key = self.next().value
                self.i += 1
                kwargs.append((key, self.parse_expression()))
            else:
                if kwargs:
                    self.fail("positional argument follows keyword argument")
                args.append(self.parse_expression())
        self.expect_op(")")
        return args, kwargs

    def parse_call_args(self, node):
        pos = self.cur.pos
        args, kwargs = self.parse_args()
        return n.Call(pos, node, args, kwargs)

    def parse_filter_expr(self, node):
        while True:
            if self.is_op("|"):
                node = self.parse_filter_chain(node, single=True)[0]
            elif self.is_name("is"):
                node = self.parse_test(node)
            elif self.is_op("("):
                node = self.parse_call_args(node)
            else:
                return node

    def _dotted_name(self) -> str:
        name = self.expect_name().value
        while self.is_op(".") and self.peek().kind == NAME:
            self.i += 1
            name += "." + self.next().value
        return name

    def parse_filter_chain(self, node, single: bool = False) -> list:
        """Filters after ``|``; for filter blocks ``node`` is None (the body)."""
        chain = []
        while self.is_op("|"):
            tok = self.next()
            name = self._dotted_name()
            args, kwargs = self.parse_args() if self.is_op("(") else ([], [])
            node = n.Filter(tok.pos, node, name, args, kwargs)
            chain.append(node)
            if single:
                return [node]
        return chain if not single else [node]

    def parse_test(self, node):
        tok = self.next()  # 'is'
        negated = self.skip_name("not")
        name = self._dotted_name()
        args, kwargs = [], []
        cur = self.cur
        if self.is_op("("):
            args, kwargs = self.parse_args()
        elif (cur.kind in _TEST_ARG_START or (cur.kind == OP and cur.value in ("(", "[", "{"))) \
                and not (cur.kind == NAME and cur.value in ("else", "or", "and")):
            if cur.kind == NAME and cur.value == "is":
                self.fail("You cannot chain multiple tests with is")
            args = [self.parse_postfix(self.parse_primary())]
        node = n.Test(tok.pos, node, name, args, kwargs)
        if negated:
            node = n.Unary(tok.pos, "not", node)
        return node


def parse(source: Source) -> n.Template:
    """Parse normalised template source into a :class:`nodes.Template`."""
    parser = Parser(source)
    try:
        return parser.parse_template()
    except RecursionError:
        raise source.error("expressions or blocks nested too deeply",
                           parser.cur.pos) from None
