"""The host IR: values and statements of a host program.

A host program is a flat list of statements (a ``ForLoop`` holds a body list) over named
values. Statements run on the host, in order; each one issues work on the *current* CUDA
stream or changes which stream is current. The interpreter (``runtime.interpreter``) gives
them meaning. Each statement class also declares its text form (``TEXT``, a template
over its fields, see ``OptionalText`` and ``SLOT_KINDS``); the printer (``hostir.printer``)
fills the templates in and the parser (``hostir.parser``) reads the same templates back, so
a new statement needs its record here and nothing in either of them.

Every class is a frozen, slotted dataclass that checks its inputs on construction, so a
malformed statement cannot exist. Checks that need the whole program (use before
definition, scopes, waits) live in ``hostir.verify``.

This module imports nothing of the project but the error types; it does not print itself
(``hostir.printer.print_program`` does), so the import graph stays a DAG.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from typing import Callable, ClassVar, Union

from hostir.errors import VerificationError

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
RESERVED = frozenset({"numberOfStreams", "rank", "worldSize", "range", "FOR", "in"})

DTYPES = ("float32", "float16", "bfloat16", "float64", "int32", "int64")


def _check_name(name: str, what: str) -> None:
    if not isinstance(name, str) or not _NAME.match(name):
        raise VerificationError(f"{what}: invalid name {name!r}: expected an identifier")
    if name in RESERVED:
        raise VerificationError(f"{what}: name {name!r} is reserved")


def _fail(where: str, message: str):
    raise VerificationError(f"{where}: {message}")


# --------------------------------------------------------------------------- text forms

# A slot of a text template: ``{field:kind}``, a field of the record and how it is written.
SLOT = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*):([a-z_]+)\}")

# Every kind of slot; the printer formats each one and the parser reads each one (a test
# checks that both cover this whole table).
SLOT_KINDS = {
    "tensor": "an existing tensor, by name",
    "written": "an existing tensor the statement writes into, by name",
    "target": "the name of the tensor the statement defines (left of `=`)",
    "type": "the type of the defined tensor: dtype[extents] mesh=[...]",
    "tensors": "existing tensors by name, comma-separated, possibly none",
    "handle": "an existing communication handle, by name",
    "new_handle": "the communication handle the statement defines",
    "stream": "a stream: `Stream name` or `Stream <index expression>`",
    "new_stream": "the stream value the statement defines: `Stream name`",
    "new_index": "the FOR index the statement defines",
    "expr": "an index expression",
    "int": "an integer",
    "int_list": "integers in brackets: [0, 1]",
    "int_tuple": "integers in parentheses: (1, 2, 3)",
    "name": "an identifier",
    "collective": "a CommunicationType, by its value",
}
# Kinds that define a name: the parser adds the value to the scope after construction.
DEFINING_KINDS = frozenset({"target", "new_handle", "new_stream", "new_index"})


@dataclasses.dataclass(frozen=True)
class OptionalText:
    """A part of a text form that is printed only when ``when(statement)`` holds (by
    default: when none of its slots' values is None or empty) and parsed when its leading
    words are there; when absent, its fields keep their defaults."""

    text: str
    when: Callable[[object], bool] | None = None

    def present(self, statement) -> bool:
        if self.when is not None:
            return self.when(statement)
        return all(getattr(statement, f) not in (None, ())
                   for f, _ in SLOT.findall(self.text))


class ParallelType(enum.Enum):
    """How one axis of a tensor is spread: over devices (DIDx) or over pipeline stages."""

    Serial = "Serial"
    DIDx = "DIDx"
    Stream = "Stream"


# --------------------------------------------------------------------------- index expressions


@dataclasses.dataclass(frozen=True, slots=True)
class Const:
    """An integer literal in an index expression."""

    value: int

    def __post_init__(self):
        if not isinstance(self.value, int) or isinstance(self.value, bool):
            _fail("Const", f"expected an int, got {self.value!r}")


@dataclasses.dataclass(frozen=True, slots=True)
class Var:
    """A name in an index expression: a FOR index, or one of the program parameters
    ``numberOfStreams``, ``rank`` (this process's position in the team) and ``worldSize``."""

    name: str

    def __post_init__(self):
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            _fail("Var", f"invalid name {self.name!r}")


BINARY_OPS = ("+", "-", "*", "//", "%")


@dataclasses.dataclass(frozen=True, slots=True)
class BinOp:
    """``lhs op rhs`` over integers; ``%`` and ``//`` follow Python (floor) semantics."""

    op: str
    lhs: "IndexExpr"
    rhs: "IndexExpr"

    def __post_init__(self):
        if self.op not in BINARY_OPS:
            _fail("BinOp", f"unknown operator {self.op!r}: expected one of {BINARY_OPS}")
        for side in (self.lhs, self.rhs):
            if not isinstance(side, (Const, Var, BinOp)):
                _fail("BinOp", f"operand {side!r} is not an index expression")


IndexExpr = Union[Const, Var, BinOp]
PARAMETERS = frozenset({"numberOfStreams", "rank", "worldSize"})


def as_index(x) -> IndexExpr:
    """Coerce an int, a loop-index name or an expression into an index expression."""
    if isinstance(x, (Const, Var, BinOp)):
        return x
    if isinstance(x, int) and not isinstance(x, bool):
        return Const(x)
    if isinstance(x, str):
        return Var(x)
    if isinstance(x, IndexVar):
        return Var(x.name)
    raise VerificationError(f"cannot use {x!r} as an index expression")


def free_vars(e: IndexExpr) -> set[str]:
    if isinstance(e, Var):
        return {e.name}
    if isinstance(e, BinOp):
        return free_vars(e.lhs) | free_vars(e.rhs)
    return set()


def evaluate(e: IndexExpr, env) -> int:
    """Evaluate an index expression; ``env`` maps variable names to ints."""
    if isinstance(e, Const):
        return e.value
    if isinstance(e, Var):
        return int(env[e.name])
    a, b = evaluate(e.lhs, env), evaluate(e.rhs, env)
    if e.op == "+":
        return a + b
    if e.op == "-":
        return a - b
    if e.op == "*":
        return a * b
    if e.op == "//":
        return a // b
    return a % b


_OPS = {"+": int.__add__, "-": int.__sub__, "*": int.__mul__, "//": int.__floordiv__,
        "%": int.__mod__}


def compile_index(e: IndexExpr):
    """``e`` as a function of the environment, equal to ``evaluate(e, env)``; the
    interpreter compiles each expression once instead of walking it every call."""
    if isinstance(e, Const):
        value = e.value
        return lambda env: value
    if isinstance(e, Var):
        name = e.name
        return lambda env: int(env[name])
    op, lhs, rhs = _OPS[e.op], compile_index(e.lhs), compile_index(e.rhs)
    if isinstance(e.rhs, Const):  # a constant right operand needs no call
        k = e.rhs.value
        return lambda env: op(lhs(env), k)
    return lambda env: op(lhs(env), rhs(env))


# --------------------------------------------------------------------------- values


@dataclasses.dataclass(frozen=True, slots=True)
class DeviceMesh:
    """The devices (ranks) a tensor is spread over, in order: axis DIDx position d lives on
    ``devices[d]``."""

    devices: tuple[int, ...]

    def __post_init__(self):
        devs = tuple(self.devices)
        object.__setattr__(self, "devices", devs)
        if not devs:
            _fail("DeviceMesh", "expected at least one device")
        if any(not isinstance(d, int) or d < 0 for d in devs):
            _fail("DeviceMesh", f"device ids must be non-negative ints, got {devs}")
        if len(set(devs)) != len(devs):
            _fail("DeviceMesh", f"device ids repeat: {devs}")

    @property
    def size(self) -> int:
        return len(self.devices)


@dataclasses.dataclass(frozen=True, slots=True)
class Tensor:
    """A tensor value. ``shape`` is the *logical* extent of each axis; ``parallel`` says how
    each axis is spread. On one rank a ``DIDx`` axis has local extent 1 (each device holds
    its own slice), so ``local_shape`` is what the runtime allocates and checks."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    parallel: tuple[ParallelType, ...] = ()
    mesh: DeviceMesh | None = None

    def __post_init__(self):
        _check_name(self.name, "Tensor")
        shape = tuple(self.shape)
        object.__setattr__(self, "shape", shape)
        if any(not isinstance(n, int) or isinstance(n, bool) or n <= 0 for n in shape):
            _fail(f"Tensor {self.name}", f"extents must be positive ints, got {shape}")
        if self.dtype not in DTYPES:
            _fail(f"Tensor {self.name}", f"dtype {self.dtype!r} is not one of {DTYPES}")
        par = tuple(self.parallel) or (ParallelType.Serial,) * len(shape)
        object.__setattr__(self, "parallel", par)
        if len(par) != len(shape):
            _fail(
                f"Tensor {self.name}",
                f"{len(par)} parallel types for {len(shape)} axes",
            )
        dids = [i for i, p in enumerate(par) if p is ParallelType.DIDx]
        if len(dids) > 1:
            _fail(f"Tensor {self.name}", f"axes {dids} are all DIDx: at most one may be")
        if dids:
            if self.mesh is None:
                _fail(f"Tensor {self.name}", f"axis {dids[0]} is DIDx but no mesh is given")
            if shape[dids[0]] != self.mesh.size:
                _fail(
                    f"Tensor {self.name}",
                    f"axis {dids[0]} is DIDx with extent {shape[dids[0]]}, "
                    f"expected the mesh size {self.mesh.size}",
                )

    @property
    def local_shape(self) -> tuple[int, ...]:
        return tuple(
            1 if p is ParallelType.DIDx else n for n, p in zip(self.shape, self.parallel)
        )

    @property
    def is_sharded(self) -> bool:
        return ParallelType.DIDx in self.parallel


@dataclasses.dataclass(frozen=True, slots=True)
class IndexVar:
    """The index of a FOR loop; an int on the host, bound while the body runs."""

    name: str

    def __post_init__(self):
        _check_name(self.name, "IndexVar")


@dataclasses.dataclass(frozen=True, slots=True)
class StreamValue:
    """A named CUDA stream captured by ``GetCurrentStream`` (the user's stream)."""

    name: str

    def __post_init__(self):
        _check_name(self.name, "StreamValue")


@dataclasses.dataclass(frozen=True, slots=True)
class PoolStream:
    """Stream number ``index`` of the interpreter's worker pool, taken modulo
    ``numberOfStreams``; the lowering writes ``i % numberOfStreams`` for round-robin."""

    index: IndexExpr

    def __post_init__(self):
        object.__setattr__(self, "index", as_index(self.index))


StreamRef = Union[StreamValue, PoolStream]


@dataclasses.dataclass(frozen=True, slots=True)
class CommHandle:
    """What a ``Communication`` returns: the work in flight, consumed by ``Wait``."""

    name: str

    def __post_init__(self):
        _check_name(self.name, "CommHandle")


# --------------------------------------------------------------------------- statements


def _need(where: str, value, kind, what: str):
    if not isinstance(value, kind):
        _fail(where, f"{what} must be a {getattr(kind, '__name__', kind)}, got {value!r}")


@dataclasses.dataclass(frozen=True, slots=True)
class GetCurrentStream:
    """Captures the stream that is current when the program starts (the user's stream)
    as ``stream``. Issues no GPU work. Programs end by switching back to it and making it
    wait on every worker stream they used."""

    TEXT: ClassVar[tuple] = ("GetCurrentStream into {stream:new_stream}",)

    stream: StreamValue

    def __post_init__(self):
        _need("GetCurrentStream", self.stream, StreamValue, "stream")


@dataclasses.dataclass(frozen=True, slots=True)
class SetCurrentStream:
    """Makes ``stream`` current: every later statement issues its kernels and collectives
    on it. Host-only; never synchronizes."""

    TEXT: ClassVar[tuple] = ("SetCurrentStream to {stream:stream}",)

    stream: StreamRef

    def __post_init__(self):
        _need("SetCurrentStream", self.stream, (StreamValue, PoolStream), "stream")


@dataclasses.dataclass(frozen=True, slots=True)
class Synchronize:
    """The current stream waits for all work issued so far on ``stream``: an event is
    recorded on ``stream`` and ``cudaStreamWaitEvent`` makes the current stream wait on it.
    The host never blocks."""

    TEXT: ClassVar[tuple] = ("Synchronize {stream:stream}",)

    stream: StreamRef

    def __post_init__(self):
        _need("Synchronize", self.stream, (StreamValue, PoolStream), "stream")


@dataclasses.dataclass(frozen=True, slots=True)
class Allocate:
    """Allocates ``out`` (its local shape) with the device's allocator on the current
    stream. Contents are undefined until written."""

    TEXT: ClassVar[tuple] = ("{out:target} = ALLOCATE({out:type})",)

    out: Tensor

    def __post_init__(self):
        _need("Allocate", self.out, Tensor, "out")
        if self.out.is_sharded:
            _fail(f"Allocate {self.out.name}", "allocations are local: no DIDx axis allowed")


@dataclasses.dataclass(frozen=True, slots=True)
class Select:
    """``out`` aliases slice ``index`` of ``input`` along ``axis`` (the axis is dropped).
    Host-only: no copy, no GPU work; writes to ``out`` land in ``input``."""

    TEXT: ClassVar[tuple] = (
        "{out:target} = select({input:tensor}, axis={axis:int}, index={index:expr})",)

    out: Tensor
    input: Tensor
    axis: int
    index: IndexExpr

    def __post_init__(self):
        where = f"select {self.out.name}"
        _need(where, self.out, Tensor, "out")
        _need(where, self.input, Tensor, "input")
        object.__setattr__(self, "index", as_index(self.index))
        rank = len(self.input.shape)
        if not isinstance(self.axis, int) or not 0 <= self.axis < rank:
            _fail(where, f"axis {self.axis} out of range for {self.input.name} of rank {rank}")
        expected = select_type(self.out.name, self.input, self.axis)
        if self.out != expected:
            _fail(
                where,
                f"expected type {expected.dtype}{list(expected.shape)} "
                f"{[p.value for p in expected.parallel]} (tensor {self.input.name} without "
                f"axis {self.axis}), got {self.out.dtype}{list(self.out.shape)} "
                f"{[p.value for p in self.out.parallel]}",
            )

    @classmethod
    def from_text(cls, out: str, input: Tensor, axis: int, index: IndexExpr) -> "Select":
        """The statement that ``out = select(input, axis=..., index=...)`` reads as: the
        text names ``out``, its type follows from ``input`` and ``axis``."""
        return cls(select_type(out, input, axis), input, axis, index)


def select_type(name: str, input: Tensor, axis: int) -> Tensor:
    """The tensor that ``select(input, axis=axis, index=...)`` defines under ``name``."""
    _need(f"select {name}", input, Tensor, "input")
    if not isinstance(axis, int) or not 0 <= axis < len(input.shape):
        _fail(f"select {name}",
              f"axis {axis} out of range for {input.name} of rank {len(input.shape)}")
    return Tensor(
        name,
        input.shape[:axis] + input.shape[axis + 1 :],
        input.dtype,
        input.parallel[:axis] + input.parallel[axis + 1 :],
        input.mesh,
    )


class CommunicationType(enum.Enum):
    Allgather = "Allgather"
    ReduceScatter = "ReduceScatter"
    Allreduce = "Allreduce"
    Broadcast = "Broadcast"
    SendRecv = "SendRecv"


REDUCE_OPS = ("sum", "max", "min")


@dataclasses.dataclass(frozen=True, slots=True)
class Communication:
    """Posts a collective over ``team`` (ranks, in order) on the current stream and returns
    ``handle`` at once; the data is ready only after ``Wait handle``. All ranks of the team
    must post the same collectives in the same order (NCCL matches them by order).

    Shapes, along the outermost axis, with D = len(team):
      Allgather      out = concat of every rank's in:         out[0] = D * in[0]
      ReduceScatter  out = this rank's chunk of sum over ranks: in[0] = D * out[0]
      Allreduce      out = sum over ranks of in:               out == in
      Broadcast      out = root's in on every rank:            out == in
      SendRecv       send in to rank ``send_peer``, receive out from ``recv_peer``
    """

    TEXT: ClassVar[tuple] = (
        "{handle:new_handle} = Communication({type:collective}, team={team:int_list}, "
        "in={input:tensor}, out={output:tensor}",
        OptionalText(", root={root:int}", lambda s: s.type is CommunicationType.Broadcast),
        OptionalText(", op={reduce_op:name}", lambda s: s.type in (
            CommunicationType.ReduceScatter, CommunicationType.Allreduce)),
        OptionalText(", send_peer={send_peer:expr}, recv_peer={recv_peer:expr}"),
        ")",
    )

    handle: CommHandle
    type: CommunicationType
    team: tuple[int, ...]
    input: Tensor
    output: Tensor
    root: int | None = None  # None: the team's first rank
    reduce_op: str = "sum"
    send_peer: IndexExpr | None = None
    recv_peer: IndexExpr | None = None

    def __post_init__(self):
        where = f"Communication {getattr(self.handle, 'name', '?')}"
        _need(where, self.handle, CommHandle, "handle")
        _need(where, self.type, CommunicationType, "type")
        _need(where, self.input, Tensor, "input")
        _need(where, self.output, Tensor, "output")
        team = tuple(self.team)
        object.__setattr__(self, "team", team)
        if self.root is None and team:
            object.__setattr__(self, "root", team[0])
        if not team or len(set(team)) != len(team) or any(
            not isinstance(r, int) or r < 0 for r in team
        ):
            _fail(where, f"team must be distinct non-negative ranks, got {team}")
        if self.input.dtype != self.output.dtype:
            _fail(where, f"in is {self.input.dtype} but out is {self.output.dtype}")
        if self.reduce_op not in REDUCE_OPS:
            _fail(where, f"reduce op {self.reduce_op!r} is not one of {REDUCE_OPS}")
        if self.root not in team:
            _fail(where, f"root {self.root} is not in team {list(team)}")
        d = len(team)
        i, o = self.input.local_shape, self.output.local_shape
        t = self.type
        if t is CommunicationType.SendRecv:
            if self.send_peer is None or self.recv_peer is None:
                _fail(where, "SendRecv needs send_peer and recv_peer")
            object.__setattr__(self, "send_peer", as_index(self.send_peer))
            object.__setattr__(self, "recv_peer", as_index(self.recv_peer))
        elif self.send_peer is not None or self.recv_peer is not None:
            _fail(where, f"{t.value} takes no peers")
        if not i and t in (CommunicationType.Allgather, CommunicationType.ReduceScatter):
            # both work along axis 0: a 0-d tensor has none
            _fail(where, f"{t.value} of {self.input.name}: expected in of rank >= 1 (it "
                         "works along axis 0), got a 0-d tensor")
        if t is CommunicationType.Allgather:
            expected = (d * i[0],) + i[1:]
            if o != expected:
                _fail(where, f"Allgather of in{list(i)} over {d} ranks: expected out "
                             f"{list(expected)}, got {list(o)}")
        elif t is CommunicationType.ReduceScatter:
            if i[0] % d:
                _fail(where, f"ReduceScatter in axis 0 has extent {i[0]}, not divisible "
                             f"by the team size {d}")
            expected = (i[0] // d,) + i[1:]
            if o != expected:
                _fail(where, f"ReduceScatter of in{list(i)} over {d} ranks: expected out "
                             f"{list(expected)}, got {list(o)}")
        elif o != i:
            _fail(where, f"{t.value}: expected out shape {list(i)} (same as in), got {list(o)}")


@dataclasses.dataclass(frozen=True, slots=True)
class Wait:
    """The current stream waits until the communication ``handle`` completes (for NCCL on
    the same stream this costs nothing; on another stream it is an event wait; on the CPU
    backend it completes the MPI request)."""

    TEXT: ClassVar[tuple] = ("Wait {handle:handle}",)

    handle: CommHandle

    def __post_init__(self):
        _need("Wait", self.handle, CommHandle, "handle")


MATMUL_EPILOGUES = ("gelu_aux", "dgelu")


@dataclasses.dataclass(frozen=True, slots=True)
class Matmul:
    """``out = a @ b`` on the current stream, written into the existing tensor ``out``
    (batch axes of ``a`` broadcast against a 2-D ``b``).

    An optional ``epilogue`` runs on the product before it is stored, in the same GEMM on
    CUDA (a cuBLASLt epilogue) or as torch ops after it elsewhere; the GELU is the tanh
    approximation (cuBLASLt's), and ``aux`` has out's shape and dtype:

    - ``gelu_aux``: ``out = gelu(a @ b)`` and ``aux = a @ b`` (written: the pre-activation
      that the backward needs);
    - ``dgelu``: ``out = (a @ b) * gelu'(aux)`` (``aux`` read: the saved pre-activation).
    """

    TEXT: ClassVar[tuple] = ("{out:written} = matmul({a:tensor}, {b:tensor}",
                             OptionalText(", epilogue={epilogue:name}, aux={aux:tensor}"), ")")

    out: Tensor
    a: Tensor
    b: Tensor
    epilogue: str | None = None
    aux: Tensor | None = None

    def __post_init__(self):
        where = f"matmul {getattr(self.out, 'name', '?')}"
        for name in ("out", "a", "b"):
            _need(where, getattr(self, name), Tensor, name)
        a, b, o = self.a.local_shape, self.b.local_shape, self.out.local_shape
        if len(b) != 2 or len(a) < 2:
            _fail(where, f"expected a of rank >= 2 and b of rank 2, got {list(a)} and {list(b)}")
        if a[-1] != b[0]:
            _fail(where, f"contraction extents differ: {self.a.name} axis {len(a) - 1} is "
                         f"{a[-1]}, {self.b.name} axis 0 is {b[0]}")
        if o != a[:-1] + (b[1],):
            _fail(where, f"expected out {list(a[:-1] + (b[1],))}, got {list(o)}")
        if not (self.a.dtype == self.b.dtype == self.out.dtype):
            _fail(where, f"dtypes differ: a {self.a.dtype}, b {self.b.dtype}, out {self.out.dtype}")
        if self.epilogue is None:
            if self.aux is not None:
                _fail(where, f"aux {self.aux.name} without an epilogue")
            return
        if self.epilogue not in MATMUL_EPILOGUES:
            _fail(where, f"unknown epilogue {self.epilogue!r}: expected one of {MATMUL_EPILOGUES}")
        _need(where, self.aux, Tensor, f"aux of epilogue {self.epilogue}")
        if self.aux.local_shape != o or self.aux.dtype != self.out.dtype:
            _fail(where, f"aux {self.aux.name} is {self.aux.dtype}{list(self.aux.local_shape)}, "
                         f"expected out's {self.out.dtype}{list(o)}")
        if self.aux.name in (self.out.name, self.a.name, self.b.name):
            _fail(where, f"aux {self.aux.name} must be a tensor of its own")


@dataclasses.dataclass(frozen=True, slots=True)
class Add:
    """``out = a + b`` elementwise on the current stream, written into the existing tensor
    ``out``; all three have the same local shape and dtype, and ``out`` may be ``a`` or
    ``b`` (an in-place accumulate). The sum is computed and rounded in that dtype, once per
    statement, as a NCCL ReduceScatter over bf16 rounds after every hop of its ring: the
    ring GEMM + ReduceScatter (``lowering.passes.ring_reduce_scatter``) accumulates the
    partial sums it receives with it."""

    TEXT: ClassVar[tuple] = ("{out:written} = add({a:tensor}, {b:tensor})",)

    out: Tensor
    a: Tensor
    b: Tensor

    def __post_init__(self):
        where = f"add {getattr(self.out, 'name', '?')}"
        for name in ("out", "a", "b"):
            _need(where, getattr(self, name), Tensor, name)
        a, b, o = self.a.local_shape, self.b.local_shape, self.out.local_shape
        if not (a == b == o):
            _fail(where, f"expected equal shapes, got out {list(o)}, {self.a.name} {list(a)}, "
                         f"{self.b.name} {list(b)}")
        if not (self.a.dtype == self.b.dtype == self.out.dtype):
            _fail(where, f"dtypes differ: a {self.a.dtype}, b {self.b.dtype}, out {self.out.dtype}")


@dataclasses.dataclass(frozen=True, slots=True)
class LaunchKernel:
    """Launches the generated kernel ``kernel`` on the current stream with ``args``
    (tensors first, then integer scalars), grid and block in CTAs and threads, and
    ``smem`` bytes of dynamic shared memory. The kernel's source comes from the code
    generator by name; its cross-CTA semaphores come from the zeroed arena of the current
    stream."""

    TEXT: ClassVar[tuple] = (
        "LaunchKernel {kernel:name}({args:tensors}) grid={grid:int_tuple} "
        "block={block:int_tuple} smem={smem:int}",
        OptionalText(" scalars={scalars:int_tuple}"),
    )

    kernel: str
    args: tuple[Tensor, ...]
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem: int = 0
    scalars: tuple[int, ...] = ()

    def __post_init__(self):
        where = f"LaunchKernel {self.kernel}"
        _check_name(self.kernel, "LaunchKernel")
        object.__setattr__(self, "args", tuple(self.args))
        object.__setattr__(self, "grid", tuple(self.grid))
        object.__setattr__(self, "block", tuple(self.block))
        object.__setattr__(self, "scalars", tuple(self.scalars))
        for t in self.args:
            _need(where, t, Tensor, "every arg")
        for what, dims in (("grid", self.grid), ("block", self.block)):
            if len(dims) != 3 or any(not isinstance(x, int) or x <= 0 for x in dims):
                _fail(where, f"{what} must be 3 positive ints, got {dims}")
        if self.block[0] * self.block[1] * self.block[2] > 1024:
            _fail(where, f"block {self.block} has more than 1024 threads")
        if not isinstance(self.smem, int) or self.smem < 0:
            _fail(where, f"smem must be a non-negative int, got {self.smem}")


@dataclasses.dataclass(frozen=True, slots=True)
class ForLoop:
    """Runs ``body`` once for each ``index`` in ``range(start, stop)``, on the host. The
    index is visible only inside the body."""

    TEXT: ClassVar[tuple] = ("FOR {index:new_index} in range({start:int}, {stop:int}):",)

    index: IndexVar
    start: int
    stop: int
    body: tuple["Statement", ...]

    def __post_init__(self):
        _need("FOR", self.index, IndexVar, "index")
        object.__setattr__(self, "body", tuple(self.body))
        if not (isinstance(self.start, int) and isinstance(self.stop, int)):
            _fail(f"FOR {self.index.name}", "bounds must be ints")
        if self.stop < self.start:
            _fail(f"FOR {self.index.name}", f"empty range({self.start}, {self.stop})")


_STRING_VALUE = re.compile(r'[^"\\\n]*\Z')


@dataclasses.dataclass(frozen=True, slots=True)
class KernelDef:
    """A generated kernel a program launches: its ``name`` (what ``LaunchKernel`` names),
    the ``generator`` that renders its CUDA C++ (``normalization``, ``matmul``) and that
    generator's parameters, plain values only (int, float, bool, str), so that the text
    form carries enough to render the very same source again. The runtime compiles it
    (NVRTC, cached) before the program's first launch."""

    name: str
    generator: str
    params: tuple[tuple[str, object], ...] = ()

    def __post_init__(self):
        _check_name(self.name, "KernelDef")
        where = f"kernel {self.name}"
        if not isinstance(self.generator, str) or not _NAME.match(self.generator):
            _fail(where, f"generator must be an identifier, got {self.generator!r}")
        params = tuple((k, v) for k, v in self.params)
        object.__setattr__(self, "params", params)
        keys = [k for k, _ in params]
        if len(set(keys)) != len(keys):
            _fail(where, f"parameters repeat: {keys}")
        for k, v in params:
            if not isinstance(k, str) or not _NAME.match(k):
                _fail(where, f"parameter name {k!r} is not an identifier")
            if isinstance(v, float):
                if v != v or v in (float("inf"), float("-inf")):
                    _fail(where, f"parameter {k} must be finite, got {v}")
            elif isinstance(v, str):
                if not _STRING_VALUE.match(v):
                    _fail(where, f"parameter {k}: strings may not hold quotes, backslashes "
                                 f"or newlines, got {v!r}")
            elif not isinstance(v, (int, bool)):
                _fail(where, f"parameter {k} must be an int, float, bool or str, got {v!r}")

    def param(self, key: str, default=None):
        return dict(self.params).get(key, default)


Statement = Union[
    GetCurrentStream, SetCurrentStream, Synchronize, Allocate, Select, Communication, Wait,
    Matmul, Add, LaunchKernel, ForLoop,
]
STATEMENT_TYPES = (
    GetCurrentStream, SetCurrentStream, Synchronize, Allocate, Select, Communication, Wait,
    Matmul, Add, LaunchKernel, ForLoop,
)


@dataclasses.dataclass(frozen=True, slots=True)
class Program:
    """A host program: its inputs (with their sharding), outputs, the size of the worker
    stream pool, and the statements. ``provenance`` names the pass that produced it."""

    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    body: tuple[Statement, ...]
    number_of_streams: int = 1
    provenance: str = ""
    kernels: tuple[KernelDef, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "outputs", tuple(self.outputs))
        object.__setattr__(self, "body", tuple(self.body))
        object.__setattr__(self, "kernels", tuple(self.kernels))
        for k in self.kernels:
            _need("Program", k, KernelDef, "every kernel")
        names = [k.name for k in self.kernels]
        if len(set(names)) != len(names):
            _fail("Program", f"kernel names repeat: {names}")
        if not isinstance(self.number_of_streams, int) or self.number_of_streams < 1:
            _fail("Program", f"numberOfStreams must be >= 1, got {self.number_of_streams}")
        for s in self.body:
            _need("Program", s, STATEMENT_TYPES, "every statement")


def walk(body) -> "list[Statement]":
    """Every statement of ``body``, loop bodies included, in program order."""
    out = []
    for s in body:
        out.append(s)
        if isinstance(s, ForLoop):
            out.extend(walk(s.body))
    return out


def tensors_of(program: Program):
    """Every tensor a program names: its inputs, then each statement's tensor fields (a
    value or a tuple of values, e.g. ``LaunchKernel.args``), in program order."""
    yield from program.inputs
    for s in walk(program.body):
        for field in dataclasses.fields(s):
            value = getattr(s, field.name)
            for v in value if isinstance(value, tuple) else (value,):
                if isinstance(v, Tensor):
                    yield v


def fresh_tensor_names(program: Program):
    """Tensor names ``T<n>`` the program does not use, in increasing order (a pass that
    adds tensors draws its names here)."""
    used = [int(t.name[1:]) for t in tensors_of(program) if t.name[1:].isdigit()]
    n = max(used, default=-1)
    while True:
        n += 1
        yield f"T{n}"
