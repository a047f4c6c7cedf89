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

The program frame (header, inputs, outputs, kernels, indentation) is written here; each
statement's line comes from the ``TEXT`` template its record declares in ``hostir.ir``, with
every kind of slot formatted by ``SLOT_FORMAT``. Records do not print themselves (no
``Program.__str__``): the IR module stays free of imports from this one.
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


# How each kind of slot of a statement's text form (``ir.SLOT_KINDS``) is written. The
# statements' templates themselves live with their records in ``hostir.ir``.
SLOT_FORMAT = {
    "tensor": lambda t: t.name,
    "written": lambda t: t.name,
    "target": lambda t: t.name,
    "type": format_type,
    "tensors": lambda ts: ", ".join(t.name for t in ts),
    "handle": lambda h: h.name,
    "new_handle": lambda h: h.name,
    "stream": format_stream,
    "new_stream": format_stream,
    "new_index": lambda i: i.name,
    "expr": format_expr,
    "int": str,
    "int_list": lambda xs: f"[{', '.join(map(str, xs))}]",
    "int_tuple": _ints,
    "name": str,
    "collective": lambda c: c.value,
}


def _fill(text: str, s) -> str:
    return ir.SLOT.sub(lambda m: SLOT_FORMAT[m.group(2)](getattr(s, m.group(1))), text)


def format_statement(s) -> str:
    """One line for a statement (a FOR prints its header only): its record's ``TEXT``
    template, optional parts included when they apply."""
    out = []
    for piece in type(s).TEXT:
        if isinstance(piece, ir.OptionalText):
            if piece.present(s):
                out.append(_fill(piece.text, s))
        else:
            out.append(_fill(piece, s))
    return "".join(out)


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
