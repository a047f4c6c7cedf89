"""The one canonical text form of a host program (``HOSTIR_DUMP=host_ir`` prints it).

    %HostIr {
      numberOfStreams = 2
      inputs:
        T0 : bfloat16[Stream(2), DIDx(2), 512, 1024] mesh=[0, 1]
        T1 : bfloat16[1024, 1024]
      outputs: T2
      GetCurrentStream into Stream s0
      T3 = ALLOCATE(bfloat16[2, 2, 512, 1024])
      FOR i in range(0, 2):
        SetCurrentStream to Stream (i % numberOfStreams)
        ...
    } // %HostIr

The parser (``hostir.parser``) reads exactly this form back:
``print_program(parse(print_program(p))) == print_program(p)``.
"""

from __future__ import annotations

from hostir import ir

INDENT = "  "


def format_expr(e: ir.IndexExpr) -> str:
    if isinstance(e, ir.Const):
        return str(e.value)
    if isinstance(e, ir.Var):
        return e.name
    return f"({format_expr(e.lhs)} {e.op} {format_expr(e.rhs)})"


def format_value(v) -> str:
    """A kernel parameter: true/false, an int, a float that reads back exactly, a name,
    or a double-quoted string."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        text = repr(v)
        return text if any(c in text for c in ".e") else text + ".0"
    if v.isidentifier() and v not in ("true", "false"):
        return v
    return f'"{v}"'


def format_kernel(k: ir.KernelDef) -> str:
    params = ", ".join(f"{key}={format_value(v)}" for key, v in k.params)
    return f"{k.name} = {k.generator}({params})"


def format_type(t: ir.Tensor) -> str:
    dims = []
    for n, p in zip(t.shape, t.parallel):
        dims.append(str(n) if p is ir.ParallelType.Serial else f"{p.value}({n})")
    text = f"{t.dtype}[{', '.join(dims)}]"
    if t.mesh is not None:
        text += f" mesh=[{', '.join(map(str, t.mesh.devices))}]"
    return text


def format_stream(s: ir.StreamRef) -> str:
    if isinstance(s, ir.StreamValue):
        return f"Stream {s.name}"
    idx = s.index
    if isinstance(idx, ir.Var):  # `Stream k` would read back as a named stream value
        return f"Stream ({idx.name})"
    return f"Stream {format_expr(idx)}"


def _ints(xs) -> str:
    return f"({', '.join(map(str, xs))})"


def _communication(s: ir.Communication) -> str:
    parts = [
        s.type.value,
        f"team=[{', '.join(map(str, s.team))}]",
        f"in={s.input.name}",
        f"out={s.output.name}",
    ]
    if s.type is ir.CommunicationType.Broadcast:
        parts.append(f"root={s.root}")
    if s.type in (ir.CommunicationType.ReduceScatter, ir.CommunicationType.Allreduce):
        parts.append(f"op={s.reduce_op}")
    if s.type is ir.CommunicationType.SendRecv:
        parts.append(f"send_peer={format_expr(s.send_peer)}")
        parts.append(f"recv_peer={format_expr(s.recv_peer)}")
    return f"{s.handle.name} = Communication({', '.join(parts)})"


def _launch(s: ir.LaunchKernel) -> str:
    text = (
        f"LaunchKernel {s.kernel}({', '.join(t.name for t in s.args)}) "
        f"grid={_ints(s.grid)} block={_ints(s.block)} smem={s.smem}"
    )
    if s.scalars:
        text += f" scalars={_ints(s.scalars)}"
    return text


# One formatter per statement type: the table is the whole text form of statements.
_FORMAT = {
    ir.GetCurrentStream: lambda s: f"GetCurrentStream into {format_stream(s.stream)}",
    ir.SetCurrentStream: lambda s: f"SetCurrentStream to {format_stream(s.stream)}",
    ir.Synchronize: lambda s: f"Synchronize {format_stream(s.stream)}",
    ir.Allocate: lambda s: f"{s.out.name} = ALLOCATE({format_type(s.out)})",
    ir.Select: lambda s: (
        f"{s.out.name} = select({s.input.name}, axis={s.axis}, index={format_expr(s.index)})"
    ),
    ir.Communication: _communication,
    ir.Wait: lambda s: f"Wait {s.handle.name}",
    ir.Matmul: lambda s: f"{s.out.name} = matmul({s.a.name}, {s.b.name}" + (
        f", epilogue={s.epilogue}, aux={s.aux.name})" if s.epilogue else ")"),
    ir.Add: lambda s: f"{s.out.name} = add({s.a.name}, {s.b.name})",
    ir.LaunchKernel: _launch,
}


def format_statement(s) -> str:
    """One line for a statement (a FOR prints its header only)."""
    if isinstance(s, ir.ForLoop):
        return f"FOR {s.index.name} in range({s.start}, {s.stop}):"
    return _FORMAT[type(s)](s)


def _lines(body, depth: int, out: list[str]) -> None:
    for s in body:
        out.append(INDENT * depth + format_statement(s))
        if isinstance(s, ir.ForLoop):
            _lines(s.body, depth + 1, out)


def print_program(p: ir.Program) -> str:
    """The canonical text of ``p``."""
    out = ["%HostIr {", f"{INDENT}numberOfStreams = {p.number_of_streams}", f"{INDENT}inputs:"]
    for t in p.inputs:
        out.append(f"{INDENT * 2}{t.name} : {format_type(t)}")
    out.append(f"{INDENT}outputs: {', '.join(t.name for t in p.outputs)}".rstrip())
    if p.kernels:  # printed only when the program launches generated kernels
        out.append(f"{INDENT}kernels:")
        for k in p.kernels:
            out.append(f"{INDENT * 2}{format_kernel(k)}")
    _lines(p.body, 1, out)
    out.append("} // %HostIr")
    return "\n".join(out) + "\n"
