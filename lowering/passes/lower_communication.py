"""Fusion -> host program: a sharded matmul becomes a loop of per-stage collectives.

The supported pattern (AllGather + GEMM, Megatron's column-parallel input side):

    A[Stream(S), DIDx(D), M/(S*D), K] @ B[K, N] -> C[Stream(S), D, M/(S*D), N]

Each rank holds slice ``rank`` of A's DIDx axis. For each stage ``i`` the program gathers
stage i of A from every rank and multiplies it with B into stage i of C. All of it runs on
the current stream here; ``assign_streams`` spreads the stages over worker streams.
Without a Stream axis (A[DIDx(D), M/D, K]) there is one stage. A matmul epilogue
(``gelu_aux``: a second output, the pre-activation, allocated like C; ``dgelu``: a third
input, the saved pre-activation) goes on every stage's GEMM with that stage's rows of it.

Every refusal names the tensor, the axis and what was expected.
"""

from __future__ import annotations

from hostir import ir
from hostir.errors import LoweringError
from lowering.fusion import Fusion, Op, TensorView


class _Names:
    """Fresh value names ``T<n>`` / ``C<n>`` that continue after the fusion's."""

    def __init__(self, start: int):
        self.n = start
        self.c = 0

    def tensor(self) -> str:
        self.n += 1
        return f"T{self.n - 1}"

    def comm(self) -> str:
        self.c += 1
        return f"C{self.c - 1}"


def _to_ir(t: TensorView) -> ir.Tensor:
    return ir.Tensor(t.name, tuple(t.shape), t.dtype, tuple(t.parallel), t.mesh)


def _check_mesh(t: TensorView, world_size: int) -> ir.DeviceMesh:
    if t.mesh is None:
        raise LoweringError(f"tensor {t.name}: it has a DIDx axis but no device mesh; "
                            f"expected set_mesh(DeviceMesh(range({world_size})))")
    if t.mesh.size != world_size or sorted(t.mesh.devices) != list(range(world_size)):
        raise LoweringError(
            f"tensor {t.name}: device mesh {list(t.mesh.devices)} does not match the world "
            f"of {world_size} ranks; expected a mesh of the devices 0..{world_size - 1}"
        )
    return t.mesh


def _check_matmul(op: Op, fusion: Fusion, world_size: int):
    a, b = op.inputs
    c = op.output
    P = ir.ParallelType
    if a not in fusion.inputs or b not in fusion.inputs:
        raise LoweringError(f"matmul {c.name}: expected both operands to be fusion inputs")
    if c not in fusion.outputs:
        raise LoweringError(f"matmul {c.name}: expected its result to be a fusion output")
    if any(p is not P.Serial for p in b.parallel):
        axis = next(i for i, p in enumerate(b.parallel) if p is not P.Serial)
        what = "(K, the contraction axis)" if axis == 0 else "(N)"
        raise LoweringError(
            f"tensor {b.name} axis {axis} {what} is {b.parallel[axis].value}: this lowering "
            f"supports AllGather+GEMM with {b.name} replicated; expected axis {axis} Serial"
        )
    k_axis = len(a.shape) - 1
    if a.parallel[k_axis] is not P.Serial:
        raise LoweringError(
            f"tensor {a.name} axis {k_axis} (K, the contraction axis) is "
            f"{a.parallel[k_axis].value}: a sharded K needs a reduction (GEMM+ReduceScatter), "
            f"which this lowering does not do; expected axis {k_axis} Serial"
        )
    layout = [p for p in a.parallel[:-1] if p is not P.Serial]
    if layout == [P.Stream, P.DIDx] and len(a.shape) == 4 and a.parallel[0] is P.Stream \
            and a.parallel[1] is P.DIDx:
        stages = a.shape[0]
    elif layout == [P.DIDx] and len(a.shape) == 3 and a.parallel[0] is P.DIDx:
        stages = 0  # no Stream axis: one stage, no loop axis
    else:
        raise LoweringError(
            f"tensor {a.name}: parallel types {[p.value for p in a.parallel]} of shape {a.shape} "
            f"are not a supported pattern; expected [Stream, DIDx, Serial, Serial] "
            f"(A[S, D, M/(S*D), K]) or [DIDx, Serial, Serial] (A[D, M/D, K])"
        )
    did_axis = a.parallel.index(P.DIDx)
    mesh = _check_mesh(a, world_size)
    if a.shape[did_axis] != world_size:
        raise LoweringError(
            f"tensor {a.name} axis {did_axis} is DIDx with extent {a.shape[did_axis]}; "
            f"expected the number of devices {world_size}"
        )
    if stages:
        if c.parallel[0] is not P.Stream:
            raise LoweringError(
                f"tensor {c.name} axis 0 (the stage axis) is {c.parallel[0].value}; expected "
                f"Stream, since {a.name} axis 0 is Stream"
            )
    elif P.Stream in c.parallel:
        raise LoweringError(
            f"tensor {c.name} axis {c.parallel.index(P.Stream)} is Stream but {a.name} has no "
            f"Stream axis; expected {a.name} split into stages first"
        )
    if P.DIDx in c.parallel:
        raise LoweringError(
            f"tensor {c.name} axis {c.parallel.index(P.DIDx)} is DIDx: the output of "
            f"AllGather+GEMM is replicated; expected no DIDx axis on it"
        )
    epilogue = op.attr("epilogue")
    if epilogue == "dgelu" and op.aux not in fusion.inputs:
        raise LoweringError(f"matmul {c.name}: the dgelu pre-activation {op.aux.name} must be "
                            "a fusion input")
    if epilogue == "gelu_aux" and op.aux not in fusion.outputs:
        raise LoweringError(f"matmul {c.name}: the gelu_aux pre-activation {op.aux.name} must "
                            "be a fusion output")
    if op.aux is not None and [p is P.Stream for p in op.aux.parallel] != \
            [p is P.Stream for p in c.parallel]:
        raise LoweringError(f"tensor {op.aux.name} (the pre-activation): parallel types "
                            f"{[p.value for p in op.aux.parallel]}; expected {c.name}'s "
                            f"{[p.value for p in c.parallel]}")
    return a, b, c, stages, mesh


def check_single_matmul(fusion: Fusion, world_size: int) -> None:
    """What both sharded-matmul passes need first: a fusion of one matmul, a world size."""
    if not isinstance(fusion, Fusion):
        raise LoweringError(f"expected a Fusion, got {type(fusion).__name__}")
    if not isinstance(world_size, int) or world_size < 1:
        raise LoweringError(f"world size must be a positive int, got {world_size!r}")
    if len(fusion.ops) != 1 or fusion.ops[0].kind != "matmul":
        kinds = [op.kind for op in fusion.ops]
        raise LoweringError(
            f"fusion ops {kinds}: this pass lowers one sharded matmul; expected ['matmul']"
        )


def lower_communication(fusion: Fusion, world_size: int) -> ir.Program:
    """The stage loop of collectives and matmuls, all on the current stream."""
    check_single_matmul(fusion, world_size)
    a, b, c, stages, mesh = _check_matmul(fusion.ops[0], fusion, world_size)
    names = _Names(fusion._count)
    A, B = _to_ir(a), _to_ir(b)
    D = world_size
    team = tuple(mesh.devices)
    if sorted(team) != list(team):
        raise LoweringError(f"tensor {a.name}: mesh {list(team)} must list devices in rank order")
    m, K, N = a.shape[-2], a.shape[-1], b.shape[1]
    S = max(stages, 1)
    op = fusion.ops[0]
    epilogue = op.attr("epilogue")
    gathered = ir.Tensor(names.tensor(), (S, D, m, K), a.dtype)
    out = ir.Tensor(c.name, (S, D, m, N), c.dtype)
    body: list = [ir.Allocate(gathered), ir.Allocate(out)]
    inputs, outputs = (A, B), (out,)
    pre = None  # the pre-activation: the same layout as out, written or read per stage
    if epilogue == "gelu_aux":
        pre = ir.Tensor(op.aux.name, (S, D, m, N), c.dtype)
        body.append(ir.Allocate(pre))
        outputs += (pre,)
    elif epilogue == "dgelu":
        pre = _to_ir(op.aux)
        inputs += (pre,)

    def gemm(c_i: ir.Tensor, g_i: ir.Tensor, index) -> list:
        if pre is None:
            return [ir.Matmul(c_i, g_i, B)]
        if len(pre.shape) == len(c_i.shape):  # an unstaged input: already one stage
            return [ir.Matmul(c_i, g_i, B, epilogue, pre)]
        p_i = ir.select_type(names.tensor(), pre, 0)
        return [ir.Select(p_i, pre, 0, index), ir.Matmul(c_i, g_i, B, epilogue, p_i)]

    if stages:
        i = ir.IndexVar("i")
        a_i = ir.select_type(names.tensor(), A, 0)
        g_i = ir.select_type(names.tensor(), gathered, 0)
        c_i = ir.select_type(names.tensor(), out, 0)
        h = ir.CommHandle(names.comm())
        loop = [
            ir.Select(a_i, A, 0, i.name),
            ir.Select(g_i, gathered, 0, i.name),
            ir.Communication(h, ir.CommunicationType.Allgather, team, a_i, g_i),
            ir.Wait(h),
            ir.Select(c_i, out, 0, i.name),
            *gemm(c_i, g_i, i.name),
        ]
        body.append(ir.ForLoop(i, 0, S, tuple(loop)))
    else:
        g0 = ir.select_type(names.tensor(), gathered, 0)
        c0 = ir.select_type(names.tensor(), out, 0)
        h = ir.CommHandle(names.comm())
        body += [
            ir.Select(g0, gathered, 0, 0),
            ir.Communication(h, ir.CommunicationType.Allgather, team, A, g0),
            ir.Wait(h),
            ir.Select(c0, out, 0, 0),
            *gemm(c0, g0, 0),
        ]
    return ir.Program(inputs, outputs, tuple(body), 1, provenance="lower_communication")
