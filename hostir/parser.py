"""Text -> host program, for exactly the form ``hostir.printer`` writes.

    >>> from hostir.parser import parse
    >>> from hostir.printer import print_program
    >>> text = print_program(program)          # doctest: +SKIP
    >>> print_program(parse(text)) == text     # doctest: +SKIP
    True

Every malformed input raises ``ParseError`` with a line and a column; a statement that
parses but is ill-formed (wrong shapes, unknown names) raises ``ParseError`` too, carrying
the construction check's message. The result is verified (``hostir.verify``).
"""

from __future__ import annotations

import re

from hostir import ir
from hostir.errors import HostIrError, ParseError

_TOKEN = re.compile(
    r"\s*(?:(?P<float>\d+\.\d*(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+)|(?P<int>\d+)"
    r"|(?P<name>[A-Za-z_][A-Za-z0-9_]*)|(?P<str>\"[^\"\\\n]*\")|(?P<op>//|[()\[\],=:%+\-*{}]))"
)
_HEADER = "%HostIr {"
_FOOTER = "} // %HostIr"
# Bounds that keep hostile text from exhausting Python's recursion: real programs use an
# operator or two per index and a FOR or two.
MAX_EXPR_OPERATORS = 64
MAX_EXPR_DEPTH = 16
MAX_FOR_DEPTH = 16


class _Line:
    """Tokens of one line with a cursor; errors carry the line and column."""

    def __init__(self, text: str, lineno: int, start_col: int):
        self.lineno = lineno
        self.tokens: list[tuple[str, str, int]] = []
        pos = start_col
        while pos < len(text):
            if text[pos:].strip() == "":
                break
            m = _TOKEN.match(text, pos)
            if not m or m.end() == pos:
                raise ParseError(f"unexpected character {text[pos]!r}", lineno, pos + 1)
            kind = m.lastgroup
            self.tokens.append((kind, m.group(kind), m.start(kind) + 1))
            pos = m.end()
        self.i = 0
        self.end_col = len(text) + 1
        self.depth = 0  # parentheses open in the index expression being parsed
        self.operators = 0  # operators in it so far

    def error(self, message: str) -> ParseError:
        col = self.tokens[self.i][2] if self.i < len(self.tokens) else self.end_col
        return ParseError(message, self.lineno, col)

    def peek(self) -> str | None:
        return self.tokens[self.i][1] if self.i < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        if self.i >= len(self.tokens):
            raise self.error(f"expected {expected!r} but the line ends" if expected
                             else "the line ends too early")
        kind, text, _ = self.tokens[self.i]
        if expected is not None and text != expected:
            raise self.error(f"expected {expected!r}, got {text!r}")
        self.i += 1
        return text

    def name(self) -> str:
        if self.i >= len(self.tokens) or self.tokens[self.i][0] != "name":
            raise self.error("expected a name")
        return self.take()

    def integer(self) -> int:
        sign = 1
        if self.peek() == "-":
            self.take()
            sign = -1
        if self.i >= len(self.tokens) or self.tokens[self.i][0] != "int":
            raise self.error("expected an integer")
        return sign * int(self.take())

    def int_list(self, open_: str, close: str) -> list[int]:
        self.take(open_)
        out = []
        while self.peek() != close:
            out.append(self.integer())
            if self.peek() != close:
                self.take(",")
        self.take(close)
        return out

    def value(self):
        """A kernel parameter: [-]int, [-]float, true/false, a name, or a "string"."""
        negative = self.peek() == "-"
        if negative:
            self.take()
        kind = self.tokens[self.i][0] if self.i < len(self.tokens) else None
        if kind == "int":
            v = int(self.take())
        elif kind == "float":
            v = float(self.take())
        elif negative:
            raise self.error("expected a number after '-'")
        elif kind == "str":
            return self.take()[1:-1]
        elif kind == "name":
            text = self.take()
            return {"true": True, "false": False}.get(text, text)
        else:
            raise self.error("expected a value")
        return -v if negative else v

    def end(self) -> None:
        if self.i != len(self.tokens):
            raise self.error(f"unexpected {self.peek()!r} at the end of the statement")

    # index expressions: precedence climbing over + - (low) and * // % (high)
    def expr(self) -> ir.IndexExpr:
        if self.depth == 0:
            self.operators = 0
        lhs = self._term()
        while self.peek() in ("+", "-"):
            op = self._operator()
            lhs = ir.BinOp(op, lhs, self._term())
        return lhs

    def _operator(self) -> str:
        self.operators += 1
        if self.operators > MAX_EXPR_OPERATORS:
            raise self.error(f"index expression too long: expected at most "
                             f"{MAX_EXPR_OPERATORS} operators")
        return self.take()

    def _term(self) -> ir.IndexExpr:
        lhs = self._atom()
        while self.peek() in ("*", "//", "%"):
            op = self._operator()
            lhs = ir.BinOp(op, lhs, self._atom())
        return lhs

    def _atom(self) -> ir.IndexExpr:
        tok = self.peek()
        if tok == "(":
            if self.depth >= MAX_EXPR_DEPTH:
                raise self.error(f"index expression nested too deep: expected at most "
                                 f"{MAX_EXPR_DEPTH} levels of parentheses")
            self.take()
            self.depth += 1
            e = self.expr()
            self.depth -= 1
            self.take(")")
            return e
        if tok == "-" or (self.i < len(self.tokens) and self.tokens[self.i][0] == "int"):
            return ir.Const(self.integer())
        return ir.Var(self.name())


class _Parser:
    def __init__(self):
        self.values: dict[str, object] = {}
        self.scope: list[str] = []

    def expr(self, line: _Line) -> ir.IndexExpr:
        """An index expression whose names are FOR indices in scope or parameters."""
        start = line.i
        e = line.expr()
        for name in sorted(ir.free_vars(e)):
            if name not in self.scope and name not in ir.PARAMETERS:
                line.i = start
                raise line.error(f"index {name!r} is not a FOR index in scope nor one of "
                                 f"{sorted(ir.PARAMETERS)}")
        return e

    def lookup(self, line: _Line, kind, what: str):
        name = line.name()
        value = self.values.get(name)
        if value is None:
            line.i -= 1
            raise line.error(f"{what} {name!r} is not defined")
        if not isinstance(value, kind):
            line.i -= 1
            raise line.error(f"{name!r} is a {type(value).__name__}, expected a {what}")
        return value

    def define(self, line: _Line, value, col_token: int) -> None:
        if value.name in self.values:
            line.i = col_token
            raise line.error(f"{value.name!r} is already defined")
        self.values[value.name] = value

    def tensor_type(self, line: _Line, name: str) -> ir.Tensor:
        dtype = line.name()
        if dtype not in ir.DTYPES:
            line.i -= 1
            raise line.error(f"unknown dtype {dtype!r}: expected one of {ir.DTYPES}")
        line.take("[")
        shape, par = [], []
        while line.peek() != "]":
            if line.peek() in ("Stream", "DIDx"):
                par.append(ir.ParallelType(line.take()))
                line.take("(")
                shape.append(line.integer())
                line.take(")")
            else:
                par.append(ir.ParallelType.Serial)
                shape.append(line.integer())
            if line.peek() != "]":
                line.take(",")
        line.take("]")
        mesh = None
        if line.peek() == "mesh":
            line.take("mesh")
            line.take("=")
            mesh = ir.DeviceMesh(tuple(line.int_list("[", "]")))
        return ir.Tensor(name, tuple(shape), dtype, tuple(par), mesh)

    def stream(self, line: _Line) -> ir.StreamRef:
        line.take("Stream")
        tok = line.peek()
        if tok is not None and line.tokens[line.i][0] == "name":
            return self.lookup(line, ir.StreamValue, "stream")
        return ir.PoolStream(self.expr(line))

    # ---- statements
    def statement(self, line: _Line, scope: list[str]):
        self.scope = scope
        first = line.peek()
        if first == "GetCurrentStream":
            line.take()
            line.take("into")
            line.take("Stream")
            at = line.i
            s = ir.StreamValue(line.name())
            self.define(line, s, at)
            return ir.GetCurrentStream(s)
        if first == "SetCurrentStream":
            line.take()
            line.take("to")
            return ir.SetCurrentStream(self.stream(line))
        if first == "Synchronize":
            line.take()
            return ir.Synchronize(self.stream(line))
        if first == "Wait":
            line.take()
            return ir.Wait(self.lookup(line, ir.CommHandle, "communication"))
        if first == "LaunchKernel":
            return self.launch(line)
        if first == "FOR":
            raise line.error("FOR is handled by the block parser")  # pragma: no cover
        at = line.i
        target = line.name()
        line.take("=")
        op = line.name()
        line.take("(")
        if op == "ALLOCATE":
            t = self.tensor_type(line, target)
            line.take(")")
            self.define(line, t, at)
            return ir.Allocate(t)
        if op == "select":
            src = self.lookup(line, ir.Tensor, "tensor")
            line.take(",")
            line.take("axis")
            line.take("=")
            axis = line.integer()
            line.take(",")
            line.take("index")
            line.take("=")
            index = self.expr(line)
            line.take(")")
            if not 0 <= axis < len(src.shape):
                raise line.error(f"axis {axis} out of range for {src.name} of rank {len(src.shape)}")
            out = ir.select_type(target, src, axis)
            self.define(line, out, at)
            return ir.Select(out, src, axis, index)
        if op in ("matmul", "add"):
            a = self.lookup(line, ir.Tensor, "tensor")
            line.take(",")
            b = self.lookup(line, ir.Tensor, "tensor")
            epilogue = aux = None
            if op == "matmul" and line.peek() == ",":  # `, epilogue=NAME, aux=TENSOR`
                line.take(",")
                line.take("epilogue")
                line.take("=")
                epilogue = line.name()
                if epilogue not in ir.MATMUL_EPILOGUES:
                    line.i -= 1
                    raise line.error(f"unknown epilogue {epilogue!r}: expected one of "
                                     f"{ir.MATMUL_EPILOGUES}")
                line.take(",")
                line.take("aux")
                line.take("=")
                aux = self.lookup(line, ir.Tensor, "tensor")
            line.take(")")
            out = self.values.get(target)
            if not isinstance(out, ir.Tensor):
                line.i = at
                raise line.error(f"{op} writes into an existing tensor: {target!r} is not one")
            if op == "matmul":
                return ir.Matmul(out, a, b, epilogue, aux)
            return ir.Add(out, a, b)
        if op == "Communication":
            return self.communication(line, target, at)
        line.i = at + 2
        raise line.error(f"unknown operation {op!r}")

    def communication(self, line: _Line, target: str, at: int) -> ir.Communication:
        ctype = line.name()
        try:
            ctype = ir.CommunicationType(ctype)
        except ValueError:
            line.i -= 1
            raise line.error(
                f"unknown communication {ctype!r}: expected one of "
                f"{[c.value for c in ir.CommunicationType]}"
            ) from None
        fields: dict[str, object] = {}
        while line.peek() == ",":
            line.take(",")
            key = line.name()
            line.take("=")
            if key in fields:
                line.i -= 2
                raise line.error(f"field {key!r} repeats")
            if key == "team":
                fields[key] = tuple(line.int_list("[", "]"))
            elif key in ("in", "out"):
                fields[key] = self.lookup(line, ir.Tensor, "tensor")
            elif key == "root":
                fields[key] = line.integer()
            elif key == "op":
                fields[key] = line.name()
            elif key in ("send_peer", "recv_peer"):
                fields[key] = self.expr(line)
            else:
                line.i -= 2
                raise line.error(f"unknown Communication field {key!r}")
        line.take(")")
        for required in ("team", "in", "out"):
            if required not in fields:
                raise line.error(f"Communication needs {required}=")
        handle = ir.CommHandle(target)
        stmt = ir.Communication(
            handle, ctype, fields["team"], fields["in"], fields["out"],
            root=fields.get("root", fields["team"][0] if fields["team"] else 0),
            reduce_op=fields.get("op", "sum"),
            send_peer=fields.get("send_peer"), recv_peer=fields.get("recv_peer"),
        )
        self.define(line, handle, at)
        return stmt

    def launch(self, line: _Line) -> ir.LaunchKernel:
        line.take("LaunchKernel")
        kernel = line.name()
        line.take("(")
        args = []
        while line.peek() != ")":
            args.append(self.lookup(line, ir.Tensor, "tensor"))
            if line.peek() != ")":
                line.take(",")
        line.take(")")
        kw: dict[str, object] = {}
        while line.peek() is not None:
            key = line.name()
            line.take("=")
            if key in ("grid", "block", "scalars"):
                kw[key] = tuple(line.int_list("(", ")"))
            elif key == "smem":
                kw[key] = line.integer()
            else:
                line.i -= 2
                raise line.error(f"unknown LaunchKernel field {key!r}")
        for required in ("grid", "block"):
            if required not in kw:
                raise line.error(f"LaunchKernel needs {required}=")
        return ir.LaunchKernel(kernel, tuple(args), **kw)


def _indent_of(text: str) -> int:
    return len(text) - len(text.lstrip(" "))


def parse(text: str, verify: bool = True) -> ir.Program:
    """Parse the canonical text of a host program. Lines starting with ``//`` before the
    header are comments (the TP layers' dumps name each program's pass that way)."""
    if not isinstance(text, str):
        raise ParseError(f"expected text, got {type(text).__name__}", 1, 1)
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    skipped = 0
    while skipped < len(lines) and lines[skipped].startswith("//"):
        skipped += 1
    lines = lines[skipped:]
    if not lines or lines[0].rstrip() != _HEADER:
        raise ParseError(f"expected {_HEADER!r} on the first line", skipped + 1, 1)
    if len(lines) < 2 or lines[-1].rstrip() != _FOOTER:
        raise ParseError(f"expected {_FOOTER!r} on the last line",
                         max(len(lines), 1) + skipped, 1)
    body_lines = [(n + 2 + skipped, t) for n, t in enumerate(lines[1:-1])]
    p = _Parser()
    pos = 0

    def line_at(k: int, expect_indent: int) -> _Line:
        lineno, raw = body_lines[k]
        if "\t" in raw:
            raise ParseError("tabs are not allowed", lineno, raw.index("\t") + 1)
        ind = _indent_of(raw)
        if ind != expect_indent:
            raise ParseError(f"expected indentation {expect_indent}, got {ind}", lineno, 1)
        return _Line(raw, lineno, ind)

    def header_line(expect: str) -> _Line:
        nonlocal pos
        if pos >= len(body_lines):
            raise ParseError(f"expected {expect!r}", len(lines) + skipped, 1)
        ln = line_at(pos, 2)
        pos += 1
        ln.take(expect)
        return ln

    try:
        ln = header_line("numberOfStreams")
        ln.take("=")
        nstreams = ln.integer()
        ln.end()
        ln = header_line("inputs")
        ln.take(":")
        ln.end()
        inputs = []
        while pos < len(body_lines) and _indent_of(body_lines[pos][1]) == 4:
            ln = line_at(pos, 4)
            pos += 1
            at = ln.i
            name = ln.name()
            ln.take(":")
            t = p.tensor_type(ln, name)
            ln.end()
            p.define(ln, t, at)
            inputs.append(t)
        ln = header_line("outputs")
        ln.take(":")
        out_names = []
        while ln.peek() is not None:
            out_names.append((ln.i, ln.name()))
            if ln.peek() is not None:
                ln.take(",")
        out_line = ln
        kernels = []
        if pos < len(body_lines) and re.match(r"  kernels\s*:", body_lines[pos][1]):
            ln = header_line("kernels")
            ln.take(":")
            ln.end()
            while pos < len(body_lines) and _indent_of(body_lines[pos][1]) == 4:
                ln = line_at(pos, 4)
                pos += 1
                kernels.append(_kernel_def(ln))
                ln.end()

        def block(indent: int, scope: list[str]) -> list:
            nonlocal pos
            stmts = []
            while pos < len(body_lines):
                lineno, raw = body_lines[pos]
                ind = _indent_of(raw)
                if ind < indent:
                    break
                ln = line_at(pos, indent)
                pos += 1
                if ln.peek() == "FOR":
                    if len(scope) >= MAX_FOR_DEPTH:
                        raise ln.error(f"FOR nested too deep: expected at most {MAX_FOR_DEPTH} "
                                       "levels")
                    ln.take("FOR")
                    at = ln.i
                    index = ir.IndexVar(ln.name())
                    ln.take("in")
                    ln.take("range")
                    ln.take("(")
                    start = ln.integer()
                    ln.take(",")
                    stop = ln.integer()
                    ln.take(")")
                    ln.take(":")
                    ln.end()
                    p.define(ln, index, at)
                    body = block(indent + 2, scope + [index.name])
                    del p.values[index.name]  # the index is visible only in its body
                    if not body:
                        raise ParseError("a FOR needs a body", lineno + 1, indent + 3)
                    stmts.append(ir.ForLoop(index, start, stop, tuple(body)))
                else:
                    stmts.append(p.statement(ln, scope))
                    ln.end()
            return stmts

        body = block(2, [])
        if pos != len(body_lines):
            lineno, raw = body_lines[pos]
            raise ParseError("unexpected indentation", lineno, 1)
        outputs = []
        for at, name in out_names:
            v = p.values.get(name)
            if not isinstance(v, ir.Tensor):
                out_line.i = at
                raise out_line.error(f"output {name!r} is not a tensor of the program")
            outputs.append(v)
        program = ir.Program(tuple(inputs), tuple(outputs), tuple(body), nstreams,
                             kernels=tuple(kernels))
    except ParseError:
        raise
    except HostIrError as e:  # a construction check refused what the text describes
        raise ParseError(str(e), _current_lineno(body_lines, pos), 1) from e
    if verify:
        from hostir.verify import verify as _verify

        try:
            _verify(program)
        except HostIrError:
            raise
    return program


def _kernel_def(ln: _Line) -> ir.KernelDef:
    """``name = generator(key=value, ...)``"""
    name = ln.name()
    ln.take("=")
    generator = ln.name()
    ln.take("(")
    params = []
    while ln.peek() != ")":
        key = ln.name()
        ln.take("=")
        params.append((key, ln.value()))
        if ln.peek() != ")":
            ln.take(",")
    ln.take(")")
    return ir.KernelDef(name, generator, tuple(params))


def _current_lineno(body_lines, pos: int) -> int:
    if not body_lines:
        return 1
    return body_lines[min(max(pos - 1, 0), len(body_lines) - 1)][0]
