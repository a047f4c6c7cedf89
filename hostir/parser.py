"""Text -> host program, for exactly the form ``hostir.printer`` writes.

    >>> from hostir.parser import parse
    >>> from hostir.printer import print_program
    >>> text = print_program(program)          # doctest: +SKIP
    >>> print_program(parse(text)) == text     # doctest: +SKIP
    True

Every malformed input raises ``ParseError`` with a line and a column; a statement that
parses but is ill-formed (wrong shapes, unknown names) raises ``ParseError`` too, carrying
the construction check's message. The result is verified (``hostir.verify``).

The parser reads each statement by the ``TEXT`` template its record declares in
``hostir.ir`` (the same template the printer fills in): literal words must match, every
``{field:kind}`` slot is read by ``_SLOT_READERS[kind]``, and an ``OptionalText`` part is
read when its leading words are there. Only the program frame and ``FOR`` bodies are
parsed by hand.

Text is untrusted (a dump from another machine, a fuzzer). Tokenizing is one pass over
each line, so time grows linearly with the input, and these bounds refuse what no real
program needs before it costs memory or time (each refusal is a ``ParseError`` at the
offending token):

=========================  ==========  ===============================================
``MAX_INT_DIGITS``         18          digits of an integer literal (fits int64)
``MAX_FLOAT_CHARS``        40          characters of a float literal (a kernel parameter)
``MAX_NAME_CHARS``         256         characters of a name
``MAX_STRING_CHARS``       1024        characters of a quoted kernel parameter
``MAX_EXTENT``             2**40       extent of one tensor axis
``MAX_RANK``               16          axes of a tensor
``MAX_STAGES``             4096        extent of a ``Stream(n)`` axis (pipeline stages)
``MAX_STREAMS``            1024        ``numberOfStreams``
``MAX_TEAM``               65536       ranks in a team, a mesh or a ``DIDx(n)`` axis
``MAX_LIST``               65536       entries of any other list (launch args, scalars)
``MAX_LOOP_TRIPS``         2**20       iterations of one ``FOR``
``MAX_EXPR_OPERATORS``     64          operators in one index expression
``MAX_EXPR_DEPTH``         16          nested parentheses in one index expression
``MAX_FOR_DEPTH``          16          nested ``FOR`` loops
=========================  ==========  ===============================================
"""

from __future__ import annotations

import dataclasses
import re

from hostir import ir
from hostir.errors import HostIrError, ParseError

_TOKEN = re.compile(
    r"\s*(?:(?P<float>\d+\.\d*(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+)|(?P<int>\d+)"
    r"|(?P<name>[A-Za-z_][A-Za-z0-9_]*)|(?P<str>\"[^\"\\\n]*\")|(?P<op>//|[()\[\],=:%+\-*{}]))"
)
_HEADER = "%HostIr {"
_FOOTER = "} // %HostIr"
MAX_INT_DIGITS = 18
MAX_FLOAT_CHARS = 40
MAX_NAME_CHARS = 256
MAX_STRING_CHARS = 1024
MAX_EXTENT = 2**40
MAX_RANK = 16
MAX_STAGES = 4096
MAX_STREAMS = 1024
MAX_TEAM = 65536
MAX_LIST = 65536
MAX_LOOP_TRIPS = 2**20
# Bounds that keep hostile text from exhausting Python's recursion: real programs use an
# operator or two per index and a FOR or two.
MAX_EXPR_OPERATORS = 64
MAX_EXPR_DEPTH = 16
MAX_FOR_DEPTH = 16
_TOKEN_LIMITS = {"int": MAX_INT_DIGITS, "float": MAX_FLOAT_CHARS, "name": MAX_NAME_CHARS,
                 "str": MAX_STRING_CHARS + 2}


class _Line:
    """Tokens of one line with a cursor; errors carry the line and column.

    Tokens are scanned on demand, each character once, so a long line costs time in
    proportion to what is read of it, and a malformed one fails at its first error."""

    def __init__(self, text: str, lineno: int, start_col: int):
        self.lineno = lineno
        self.tokens: list[tuple[str, str, int]] = []  # (kind, text, column), scanned so far
        self._text = text
        self._pos = start_col
        self._stop = len(text.rstrip())  # once per line: trailing blanks end the tokens
        self.i = 0
        self.end_col = len(text) + 1
        self.depth = 0  # parentheses open in the index expression being parsed
        self.operators = 0  # operators in it so far

    def token(self, k: int) -> tuple[str, str, int] | None:
        """Token ``k`` of the line (scanning up to it), or None past the end."""
        tokens, text = self.tokens, self._text
        while len(tokens) <= k and self._pos < self._stop:
            pos = self._pos
            m = _TOKEN.match(text, pos)
            if not m or m.end() == pos:
                raise ParseError(f"unexpected character {text[pos]!r}", self.lineno, pos + 1)
            kind = m.lastgroup
            token = m.group(kind)
            if len(token) > _TOKEN_LIMITS.get(kind, len(token)):
                raise ParseError(f"{kind} literal too long: {len(token)} characters, expected "
                                 f"at most {_TOKEN_LIMITS[kind]}", self.lineno, m.start(kind) + 1)
            tokens.append((kind, token, m.start(kind) + 1))
            self._pos = m.end()
        return tokens[k] if k < len(tokens) else None

    def all_tokens(self) -> list[tuple[str, str, int]]:
        while self.token(len(self.tokens)) is not None:
            pass
        return self.tokens

    def kind(self) -> str | None:
        t = self.token(self.i)
        return t[0] if t else None

    def text_at(self, k: int) -> str | None:
        t = self.token(k)
        return t[1] if t else None

    def error(self, message: str) -> ParseError:
        t = self.token(self.i)
        return ParseError(message, self.lineno, t[2] if t else self.end_col)

    def peek(self) -> str | None:
        return self.text_at(self.i)

    def take(self, expected: str | None = None) -> str:
        t = self.token(self.i)
        if t is None:
            raise self.error(f"expected {expected!r} but the line ends" if expected
                             else "the line ends too early")
        kind, text, _ = t
        if expected is not None and text != expected:
            raise self.error(f"expected {expected!r}, got {text!r}")
        self.i += 1
        return text

    def name(self) -> str:
        if self.kind() != "name":
            raise self.error("expected a name")
        return self.take()

    def integer(self) -> int:
        sign = 1
        if self.peek() == "-":
            self.take()
            sign = -1
        if self.kind() != "int":
            raise self.error("expected an integer")
        return sign * int(self.take())

    def bounded(self, low: int, high: int, what: str) -> int:
        """An integer in ``[low, high]``."""
        v = self.integer()
        if not low <= v <= high:
            self.i -= 1
            raise self.error(f"{what} {v} out of range: expected {low} to {high}")
        return v

    def int_list(self, open_: str, close: str, limit: int = MAX_LIST,
                 what: str = "list") -> list[int]:
        self.take(open_)
        out = []
        while self.peek() != close:
            if len(out) == limit:
                raise self.error(f"{what} too long: expected at most {limit} entries")
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
        kind = self.kind()
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
        if self.token(self.i) is not None:
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
        if tok == "-" or self.kind() == "int":
            return ir.Const(self.integer())
        return ir.Var(self.name())


@dataclasses.dataclass(frozen=True)
class _Form:
    """A statement's ``TEXT`` compiled for reading: steps are ``("word", token)``,
    ``("slot", field, kind, stop)`` (``stop``: the word after the slot, if any) and
    ``("optional", leading words, steps)``."""

    cls: type
    steps: tuple


def _literal_tokens(text: str) -> list[str]:
    line = _Line(text, 0, 0)
    return [t for _, t, _ in line.all_tokens()]


def _compile_steps(text: str) -> list:
    steps: list = []
    pos = 0
    for m in ir.SLOT.finditer(text):
        steps += [("word", t) for t in _literal_tokens(text[pos:m.start()])]
        steps.append(("slot", m.group(1), m.group(2), None))
        pos = m.end()
    steps += [("word", t) for t in _literal_tokens(text[pos:])]
    return steps


def _with_stops(steps: list) -> tuple:
    """Each slot learns the word that follows it (how a list of unknown length ends)."""
    out = []
    for k, step in enumerate(steps):
        if step[0] == "slot":
            nxt = steps[k + 1] if k + 1 < len(steps) else None
            stop = nxt[1] if nxt is not None and nxt[0] == "word" else None
            step = ("slot", step[1], step[2], stop)
        out.append(step)
    return tuple(out)


def _compile_form(cls) -> _Form:
    steps: list = []
    for piece in cls.TEXT:
        if isinstance(piece, ir.OptionalText):
            inner = _with_stops(_compile_steps(piece.text))
            leading = []
            for step in inner:
                if step[0] != "word":
                    break
                leading.append(step[1])
            if not leading:
                raise ValueError(f"{cls.__name__}: an optional part must start with words")
            steps.append(("optional", tuple(leading), inner))
        else:
            steps += _compile_steps(piece)
    return _Form(cls, _with_stops(steps))


def _dispatch_key(form: _Form) -> tuple[int, str]:
    """Where a statement's first keyword sits: ``(0, "Wait")`` or ``(2, "matmul")`` after
    ``NAME =``. Slots before it must be one token each (a name)."""
    for pos, step in enumerate(form.steps):
        if step[0] == "word" and _TOKEN.fullmatch(step[1]).lastgroup == "name":
            return pos, step[1]
        if step[0] != "slot" and step[0] != "word":
            break
    raise ValueError(f"{form.cls.__name__}: its text form has no leading keyword")


FORMS = {cls: _compile_form(cls) for cls in ir.STATEMENT_TYPES}
_BY_KEYWORD: dict[tuple[int, str], _Form] = {}
for _form in FORMS.values():
    _key = _dispatch_key(_form)
    if _key in _BY_KEYWORD:
        raise ValueError(f"{_form.cls.__name__} and {_BY_KEYWORD[_key].cls.__name__} start "
                         f"with the same keyword {_key[1]!r}")
    _BY_KEYWORD[_key] = _form


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
            if len(shape) == MAX_RANK:
                raise line.error(f"too many axes: expected at most {MAX_RANK}")
            if line.peek() in ("Stream", "DIDx"):
                p = ir.ParallelType(line.take())
                par.append(p)
                line.take("(")
                if p is ir.ParallelType.Stream:
                    shape.append(line.bounded(1, MAX_STAGES, "stage count"))
                else:
                    shape.append(line.bounded(1, MAX_TEAM, "device count"))
                line.take(")")
            else:
                par.append(ir.ParallelType.Serial)
                shape.append(line.bounded(1, MAX_EXTENT, "extent"))
            if line.peek() != "]":
                line.take(",")
        line.take("]")
        mesh = None
        if line.peek() == "mesh":
            line.take("mesh")
            line.take("=")
            mesh = ir.DeviceMesh(tuple(line.int_list("[", "]", MAX_TEAM, "mesh")))
        return ir.Tensor(name, tuple(shape), dtype, tuple(par), mesh)

    def stream(self, line: _Line) -> ir.StreamRef:
        line.take("Stream")
        tok = line.peek()
        if tok is not None and line.kind() == "name":
            return self.lookup(line, ir.StreamValue, "stream")
        return ir.PoolStream(self.expr(line))

    def tensors(self, line: _Line, stop: str | None) -> tuple[ir.Tensor, ...]:
        out = []
        while line.peek() != stop and line.peek() is not None:
            if len(out) == MAX_LIST:
                raise line.error(f"too many tensors: expected at most {MAX_LIST}")
            out.append(self.lookup(line, ir.Tensor, "tensor"))
            if line.peek() != stop:
                line.take(",")
        return tuple(out)

    def written(self, line: _Line, keyword: str) -> ir.Tensor:
        at = line.i
        name = line.name()
        out = self.values.get(name)
        if not isinstance(out, ir.Tensor):
            line.i = at
            raise line.error(f"{keyword} writes into an existing tensor: {name!r} is not one")
        return out

    def collective(self, line: _Line) -> ir.CommunicationType:
        name = line.name()
        try:
            return ir.CommunicationType(name)
        except ValueError:
            line.i -= 1
            raise line.error(
                f"unknown communication {name!r}: expected one of "
                f"{[c.value for c in ir.CommunicationType]}"
            ) from None

    # ---- statements, read by their records' text forms
    def read_slot(self, line: _Line, form: _Form, values: dict, field: str, kind: str,
                  stop: str | None):
        if kind == "tensor":
            return self.lookup(line, ir.Tensor, "tensor")
        if kind == "written":
            return self.written(line, _dispatch_key(form)[1])
        if kind in ("target", "new_handle", "new_index", "name"):
            return line.name()
        if kind == "type":
            return self.tensor_type(line, values[field])
        if kind == "tensors":
            return self.tensors(line, stop)
        if kind == "handle":
            return self.lookup(line, ir.CommHandle, "communication")
        if kind == "stream":
            return self.stream(line)
        if kind == "new_stream":
            line.take("Stream")
            return line.name()
        if kind == "expr":
            return self.expr(line)
        if kind == "int":
            return line.integer()
        if kind == "int_list":
            return tuple(line.int_list("[", "]", MAX_TEAM, "team"))
        if kind == "int_tuple":
            return tuple(line.int_list("(", ")"))
        if kind == "collective":
            return self.collective(line)
        raise line.error(f"the text form of {form.cls.__name__} uses an unknown slot kind "
                         f"{kind!r}")  # pragma: no cover (a test checks every kind)

    def read_steps(self, line: _Line, form: _Form, steps, values: dict, defines: list) -> None:
        for step in steps:
            if step[0] == "word":
                line.take(step[1])
            elif step[0] == "slot":
                _, field, kind, stop = step
                at = line.i
                value = self.read_slot(line, form, values, field, kind, stop)
                if kind == "new_handle":
                    value = ir.CommHandle(value)
                elif kind == "new_stream":
                    value = ir.StreamValue(value)
                elif kind == "new_index":
                    value = ir.IndexVar(value)
                if kind in ir.DEFINING_KINDS:
                    defines.append((field, at))
                values[field] = value
            else:
                _, leading, inner = step
                ahead = [line.text_at(line.i + k) for k in range(len(leading))]
                if ahead == list(leading):
                    self.read_steps(line, form, inner, values, defines)

    def read(self, line: _Line, form: _Form) -> tuple[dict, list]:
        """The fields a statement's text gives, and the defined names' token positions."""
        values: dict = {}
        defines: list = []
        try:
            self.read_steps(line, form, form.steps, values, defines)
        except ParseError:
            raise
        except HostIrError as e:  # a value the records refuse, e.g. a reserved name
            raise line.error(str(e)) from e
        return values, defines

    def form_of(self, line: _Line) -> _Form:
        form = _BY_KEYWORD.get((0, line.text_at(0)))
        if form is None and line.text_at(1) == "=" and line.text_at(2) is not None:
            form = _BY_KEYWORD.get((2, line.text_at(2)))
            if form is None:
                line.i = 2
                raise line.error(f"unknown operation {line.text_at(2)!r}")
        if form is None:
            raise line.error(
                f"unknown statement: expected one of "
                f"{sorted(w for p, w in _BY_KEYWORD if p == 0)} or NAME = OPERATION(...)")
        return form

    def statement(self, line: _Line, scope: list[str]):
        self.scope = scope
        form = self.form_of(line)
        values, defines = self.read(line, form)
        line.end()
        build = getattr(form.cls, "from_text", form.cls)
        try:
            stmt = build(**values)
        except ParseError:
            raise
        except HostIrError as e:  # a construction check refused what the text describes
            raise ParseError(str(e), line.lineno, line.token(0)[2]) from e
        for field, at in defines:
            self.define(line, getattr(stmt, field), at)
        return stmt

    def for_loop(self, line: _Line, scope: list[str], block):
        """``FOR i in range(a, b):`` and its body; ``block(scope)`` parses the body."""
        self.scope = scope
        if len(scope) >= MAX_FOR_DEPTH:
            raise line.error(f"FOR nested too deep: expected at most {MAX_FOR_DEPTH} levels")
        form = FORMS[ir.ForLoop]
        values, defines = self.read(line, form)
        line.end()
        (field, at), = defines
        index = values[field]
        trips = values["stop"] - values["start"]
        if not 0 <= trips <= MAX_LOOP_TRIPS:
            line.i = len(line.tokens) - 5  # at the range's start
            raise line.error(f"range({values['start']}, {values['stop']}) has {trips} "
                             f"iterations: expected 0 to {MAX_LOOP_TRIPS}")
        self.define(line, index, at)
        body = block(scope + [index.name])
        del self.values[index.name]  # the index is visible only in its body
        return values, body


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
        nstreams = ln.bounded(1, MAX_STREAMS, "numberOfStreams")
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
                    values, body = p.for_loop(ln, scope, lambda inner: block(indent + 2, inner))
                    if not body:
                        raise ParseError("a FOR needs a body", lineno + 1, indent + 3)
                    try:
                        stmts.append(ir.ForLoop(body=tuple(body), **values))
                    except HostIrError as e:
                        raise ParseError(str(e), lineno, indent + 1) from e
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
