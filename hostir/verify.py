"""Invariants of a well-formed host program, checked over the whole program.

Construction checks (shapes, kinds of fields) live in the statement classes; this pass
checks what needs context:

- every value is defined before use, exactly once, and used with the type it was
  defined with; values defined in a FOR body are visible only inside it;
- index expressions use only FOR indices in scope and the parameters
  (``numberOfStreams``, ``rank``, ``worldSize``);
- a ``Wait`` names a ``Communication`` of the same scope that was not waited yet, and
  every communication is waited in the scope that posted it;
- a matmul or add writes into an existing tensor that is not an input (nor does a
  ``gelu_aux`` matmul's pre-activation ``aux``; a ``dgelu`` one reads its ``aux``);
- a program that switches streams captured the user's stream first, ends on it, and
  joins (``Synchronize``) every worker stream it issued work on after that work.

    >>> verify(program)  # doctest: +SKIP   (raises VerificationError, or returns None)
"""

from __future__ import annotations

from hostir import ir
from hostir.errors import VerificationError
from hostir.printer import format_statement, format_stream

MAX_QUOTED = 240  # characters of the offending statement an error message quotes


class _Scope:
    def __init__(self, parent: "_Scope | None" = None, index: str | None = None):
        self.parent = parent
        self.values: dict[str, object] = {}
        self.index = index
        self.pending: dict[str, ir.Communication] = {}

    def find(self, name: str):
        s = self
        while s is not None:
            if name in s.values:
                return s.values[name]
            s = s.parent
        return None

    def indices(self) -> set[str]:
        out, s = set(), self
        while s is not None:
            if s.index:
                out.add(s.index)
            s = s.parent
        return out


class _Verifier:
    def __init__(self, program: ir.Program):
        self.program = program
        self.user_stream: ir.StreamValue | None = None
        self.current: ir.StreamRef | None = None  # None: the stream the program started on
        self.dirty: set = set()  # worker streams with work not yet joined into the user stream
        self.inputs = {t.name for t in program.inputs}
        self.kernels = {k.name for k in program.kernels}
        self.names: set[str] = set()

    def fail(self, stmt, message: str):
        where = format_statement(stmt) if stmt is not None else "program"
        if len(where) > MAX_QUOTED:  # a team of thousands of ranks: quote its start
            where = where[:MAX_QUOTED] + f"... ({len(where)} characters)"
        raise VerificationError(f"{message}\n  in: {where}")

    def define(self, scope: _Scope, value, stmt) -> None:
        if value.name in self.names:
            self.fail(stmt, f"{value.name} is defined twice")
        self.names.add(value.name)
        scope.values[value.name] = value

    def use(self, scope: _Scope, value, stmt):
        found = scope.find(value.name)
        if found is None:
            self.fail(stmt, f"{value.name} is used before it is defined (or outside its FOR)")
        if found != value:
            self.fail(
                stmt,
                f"{value.name} is used as a {type(value).__name__} {value} but was defined "
                f"as {type(found).__name__} {found}",
            )

    def expr(self, scope: _Scope, e: ir.IndexExpr, stmt) -> None:
        allowed = scope.indices() | ir.PARAMETERS
        for name in ir.free_vars(e):
            if name not in allowed:
                self.fail(
                    stmt,
                    f"index {name!r} is not a FOR index in scope nor one of "
                    f"{sorted(ir.PARAMETERS)}",
                )

    def stream(self, scope: _Scope, s: ir.StreamRef, stmt) -> None:
        if isinstance(s, ir.StreamValue):
            self.use(scope, s, stmt)
        else:
            self.expr(scope, s.index, stmt)

    def body(self, stmts, scope: _Scope) -> None:
        for s in stmts:
            self.statement(s, scope)
        if scope.pending:
            name, comm = next(iter(scope.pending.items()))
            self.fail(comm, f"communication {name} is never waited in the scope that posts it")

    def statement(self, s, scope: _Scope) -> None:
        # A statement without a rule below issues work unless proven otherwise: its
        # worker stream must then be joined, the safe side of the stream discipline.
        issues_work = isinstance(s, (ir.Communication, ir.Matmul, ir.Add, ir.LaunchKernel,
                                     ir.Wait)) or type(s) not in _OWN_RULES
        if isinstance(s, ir.GetCurrentStream):
            if self.user_stream is not None:
                self.fail(s, "the user's stream is captured twice")
            if scope.parent is not None:
                self.fail(s, "GetCurrentStream belongs at the top level")
            self.define(scope, s.stream, s)
            self.user_stream = s.stream
        elif isinstance(s, ir.SetCurrentStream):
            self.stream(scope, s.stream, s)
            if isinstance(s.stream, ir.PoolStream) and self.user_stream is None:
                self.fail(s, "switching to a worker stream before GetCurrentStream captured "
                             "the user's stream: the program could not end on it")
            self.current = s.stream
        elif isinstance(s, ir.Synchronize):
            self.stream(scope, s.stream, s)
            if s.stream == self.current:
                self.fail(s, "a stream cannot wait on itself")
            if self.current == self.user_stream or self.current is None:
                self.dirty.discard(s.stream)
        elif isinstance(s, ir.Allocate):
            self.define(scope, s.out, s)
        elif isinstance(s, ir.Select):
            self.use(scope, s.input, s)
            self.expr(scope, s.index, s)
            self.define(scope, s.out, s)
        elif isinstance(s, ir.Communication):
            self.use(scope, s.input, s)
            self.use(scope, s.output, s)
            if s.output.name in self.inputs:
                self.fail(s, f"communication writes into the program input {s.output.name}")
            for peer in (s.send_peer, s.recv_peer):
                if peer is not None:
                    self.expr(scope, peer, s)
            self.define(scope, s.handle, s)
            scope.pending[s.handle.name] = s
        elif isinstance(s, ir.Wait):
            self.use(scope, s.handle, s)
            if s.handle.name not in scope.pending:
                self.fail(s, f"{s.handle.name} is not a communication of this scope still in flight")
            del scope.pending[s.handle.name]
        elif isinstance(s, (ir.Matmul, ir.Add)):
            aux = getattr(s, "aux", None)
            for t in (s.a, s.b, s.out) + ((aux,) if aux is not None else ()):
                self.use(scope, t, s)
            if s.out.name in self.inputs:
                what = "matmul" if isinstance(s, ir.Matmul) else "add"
                self.fail(s, f"{what} writes into the program input {s.out.name}")
            if aux is not None:
                # shapes and dtypes equal out's (checked by Matmul itself); gelu_aux writes it
                if (aux.local_shape, aux.dtype) != (s.out.local_shape, s.out.dtype):
                    self.fail(s, f"aux {aux.name} differs from out {s.out.name} in shape or dtype")
                if s.epilogue == "gelu_aux" and aux.name in self.inputs:
                    self.fail(s, f"matmul writes its pre-activation into the program input {aux.name}")
        elif isinstance(s, ir.LaunchKernel):
            if s.kernel not in self.kernels:
                self.fail(s, f"kernel {s.kernel} is not among the program's kernels "
                             f"{sorted(self.kernels) or '(none)'}")
            for t in s.args:
                self.use(scope, t, s)
        elif isinstance(s, ir.ForLoop):
            if s.index.name in scope.indices():
                self.fail(s, f"FOR index {s.index.name} shadows an enclosing index")
            if s.index.name in self.names:
                self.fail(s, f"FOR index {s.index.name} reuses the name of a value")
            inner = _Scope(scope, s.index.name)
            self.body(s.body, inner)
            leaked = {d for d in self.dirty if isinstance(d, ir.PoolStream)
                      and s.index.name in ir.free_vars(d.index)}
            if leaked:
                self.fail(s, f"worker {format_stream(next(iter(leaked)))} is not joined into the "
                             "user's stream before its FOR iteration ends")
        else:
            self.by_text_form(s, scope)
        if issues_work and isinstance(self.current, ir.PoolStream):
            self.dirty.add(self.current)

    def by_text_form(self, s, scope: _Scope) -> None:
        """A statement with no rule of its own (a new one): its text form's slots say what
        it reads (tensors, handles, streams, index expressions), what it writes into (not
        a program input) and what it defines."""
        defined = []
        for piece in type(s).TEXT:
            if isinstance(piece, ir.OptionalText):
                if not piece.present(s):
                    continue
                piece = piece.text
            for field, kind in ir.SLOT.findall(piece):
                value = getattr(s, field)
                if kind in ("tensor", "written", "handle"):
                    self.use(scope, value, s)
                elif kind == "tensors":
                    for t in value:
                        self.use(scope, t, s)
                elif kind == "stream":
                    self.stream(scope, value, s)
                elif kind == "expr":
                    self.expr(scope, value, s)
                elif kind in ir.DEFINING_KINDS and value not in defined:
                    defined.append(value)
                if kind == "written" and value.name in self.inputs:
                    self.fail(s, f"{type(s).__name__} writes into the program input {value.name}")
        for value in defined:
            self.define(scope, value, s)

    def run(self) -> None:
        top = _Scope()
        for t in self.program.inputs:
            if t.name in self.names:
                self.fail(None, f"input {t.name} is declared twice")
            self.names.add(t.name)
            top.values[t.name] = t
        self.body(self.program.body, top)
        for t in self.program.outputs:
            found = top.values.get(t.name)
            if found is None:
                self.fail(None, f"output {t.name} is not defined at the top level")
            if found != t:
                self.fail(None, f"output {t.name} differs from its definition")
        if self.user_stream is not None and self.current not in (None, self.user_stream):
            self.fail(None, f"the program ends on {format_stream(self.current)}, not on the "
                            f"user's stream {self.user_stream.name}")
        if self.dirty:
            self.fail(None, f"worker {format_stream(next(iter(self.dirty)))} is never joined "
                            "into the user's stream")


# Statements with a rule of their own in _Verifier.statement; any other goes by its text form.
_OWN_RULES = frozenset({
    ir.GetCurrentStream, ir.SetCurrentStream, ir.Synchronize, ir.Allocate, ir.Select,
    ir.Communication, ir.Wait, ir.Matmul, ir.Add, ir.LaunchKernel, ir.ForLoop,
})


def verify(program: ir.Program) -> None:
    """Raise ``VerificationError`` naming the offending statement, or return None."""
    if not isinstance(program, ir.Program):
        raise VerificationError(f"expected a Program, got {type(program).__name__}")
    _Verifier(program).run()
