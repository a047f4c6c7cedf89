"""Fusion -> host program: a matmul with a sharded contraction axis becomes a loop of
per-stage partial GEMMs, each reduce-scattered into this rank's rows.

The supported pattern (GEMM + ReduceScatter, Megatron's row-parallel output side):

    A[Stream(S), M/S, DIDx(D), K/D] @ B[DIDx(D), K/D, N] -> C[Stream(S), DIDx(D), M/(S*D), N]

Rank r holds columns r*K/D.. of A and the same rows of B, so ``A_r @ B_r`` is its partial
sum of the whole product. For each stage ``i`` the program multiplies stage i of A (M/S
rows) into a temp and reduce-scatters it over the ranks: rank r receives rows
``i*M/S + r*M/(S*D) + j`` of C, summed. The output is local, ``[S, M/(S*D), N]`` (C without
its DIDx axis). Everything runs on the current stream here; ``assign_streams`` spreads the
stages over worker streams, so stage i's reduce-scatter runs while stage i+1 multiplies.
Without a Stream axis (A[M, DIDx(D), K/D], C[DIDx(D), M/D, N]) there is one stage.

The tensor-level description: define the logical matmul first, then shard its tensors
(nvFuser's manner: sharding is a transform of the tensors, not a different op)::

    c = fd.matmul(a, b)                       # [M, K] @ [K, N] -> [M, N]
    a.split(1, D).split(0, S)                 # [S, M/S, D, K/D]
    b.split(0, D)                             # [D, K/D, N]
    c.split(0, S).split(1, D)                 # [S, D, M/(S*D), N]
    # mesh on all three; Stream on axis 0 of a and c; DIDx on a[2], b[0], c[1]

``lowering.patterns.matmul_reduce_scatter`` builds exactly this. Every refusal names the
tensor, the axis and what was expected against what it got.
"""

from __future__ import annotations

from hostir import ir
from hostir.errors import LoweringError
from lowering.fusion import Fusion, TensorView
from lowering.passes.lower_communication import (
    _check_mesh, _Names, _to_ir, check_single_matmul,
)

P = ir.ParallelType


def _kinds(t: TensorView) -> list[str]:
    return [p.value for p in t.parallel]


def _expect_layout(t: TensorView, role: str, layouts: dict) -> str:
    """The name of the layout in ``layouts`` (name -> parallel types) that ``t`` has."""
    got = list(t.parallel)
    for name, want in layouts.items():
        if got == want:
            return name
    wanted = " or ".join(f"{[p.value for p in w]} ({name})" for name, w in layouts.items())
    # Name the first axis that differs from the closest layout of the same rank.
    same_rank = [w for w in layouts.values() if len(w) == len(got)]
    if same_rank:
        axis = next(i for i, (a, b) in enumerate(zip(got, same_rank[0])) if a is not b)
        raise LoweringError(
            f"tensor {t.name} ({role}) axis {axis} is {got[axis].value}, expected "
            f"{same_rank[0][axis].value}: parallel types {_kinds(t)} of shape {t.shape}; "
            f"expected {wanted}"
        )
    raise LoweringError(
        f"tensor {t.name} ({role}): rank {len(got)} with parallel types {_kinds(t)} of shape "
        f"{t.shape}; expected {wanted}"
    )


def _check(fusion: Fusion, world_size: int):
    """Returns A, B, C, stages (0: no Stream axis), m = rows per rank and stage, and the
    mesh; refuses anything else."""
    op = fusion.ops[0]
    a, b = op.inputs
    c = op.output
    if op.attr("epilogue") is not None:
        raise LoweringError(
            f"matmul {c.name}: epilogue {op.attr('epilogue')} on GEMM+ReduceScatter would apply "
            "to each rank's partial sum, not to the reduced product; expected none")
    if a not in fusion.inputs or b not in fusion.inputs:
        raise LoweringError(f"matmul {c.name}: expected both operands to be fusion inputs")
    if c not in fusion.outputs:
        raise LoweringError(f"matmul {c.name}: expected its result to be a fusion output")
    if len(b.shape) == 2 and b.parallel[0] is P.DIDx:
        raise LoweringError(
            f"tensor {b.name} axis 0 (K, the contraction axis) is DIDx without a split: "
            f"expected B split as [DIDx({world_size}), K/{world_size}, N] (b.split(0, "
            f"{world_size}) after fd.matmul), got shape {b.shape} {_kinds(b)}"
        )
    _expect_layout(b, "B", {"[DIDx(D), K/D, N]": [P.DIDx, P.Serial, P.Serial]})
    a_form = _expect_layout(a, "A", {
        "[Stream(S), M/S, DIDx(D), K/D]": [P.Stream, P.Serial, P.DIDx, P.Serial],
        "[M, DIDx(D), K/D]": [P.Serial, P.DIDx, P.Serial],
    })
    staged = a_form.startswith("[Stream")
    c_layouts = ({"[Stream(S), DIDx(D), M/(S*D), N]": [P.Stream, P.DIDx, P.Serial, P.Serial]}
                 if staged else {"[DIDx(D), M/D, N]": [P.DIDx, P.Serial, P.Serial]})
    if not staged and P.Stream in c.parallel:
        raise LoweringError(
            f"tensor {c.name} axis {c.parallel.index(P.Stream)} is Stream but {a.name} has no "
            f"Stream axis; expected {a.name} split into the same stages (a.split(0, S))"
        )
    _expect_layout(c, "C", c_layouts)
    mesh = _check_mesh(b, world_size)
    for t in (a, c):
        if _check_mesh(t, world_size) != mesh:
            raise LoweringError(f"tensor {t.name}: mesh {list(t.mesh.devices)} differs from "
                                f"{b.name}'s {list(mesh.devices)}; expected the same mesh")
    if list(mesh.devices) != sorted(mesh.devices):
        raise LoweringError(f"tensor {b.name}: mesh {list(mesh.devices)} must list devices in rank order")
    k_local = b.shape[1]
    if a.shape[-1] != k_local:
        raise LoweringError(
            f"tensor {a.name} axis {len(a.shape) - 1} (K/D) has extent {a.shape[-1]}; expected "
            f"{k_local}, the extent of {b.name} axis 1 (both split by the same D)"
        )
    if c.shape[-1] != b.shape[2]:
        raise LoweringError(f"tensor {c.name} axis {len(c.shape) - 1} (N) has extent "
                            f"{c.shape[-1]}; expected {b.shape[2]}, {b.name} axis 2")
    rows = a.shape[1] if staged else a.shape[0]  # rows of one stage
    stages = a.shape[0] if staged else 0
    if staged and c.shape[0] != stages:
        raise LoweringError(f"tensor {c.name} axis 0 (Stream) has {c.shape[0]} stages; expected "
                            f"{stages}, as {a.name} axis 0")
    m = c.shape[-2]
    if m * world_size != rows:
        axis = len(c.shape) - 2
        raise LoweringError(
            f"tensor {c.name} axis {axis} has extent {m}; expected {rows}/{world_size} = "
            f"{rows / world_size:g}: each rank receives 1/{world_size} of the {rows} rows of a stage"
        )
    return a, b, c, stages, m, mesh


def lower_reduce_scatter(fusion: Fusion, world_size: int) -> ir.Program:
    """The stage loop of partial matmuls and reduce-scatters, all on the current stream.

    >>> from lowering.patterns import matmul_reduce_scatter
    >>> p = lower_reduce_scatter(matmul_reduce_scatter(64, 32, 16, 2, 2), 2)
    >>> p.outputs[0].shape            # [S, M/(S*D), N]: this rank's rows of C
    (2, 16, 16)
    """
    check_single_matmul(fusion, world_size)
    a, b, c, stages, m, mesh = _check(fusion, world_size)
    names = _Names(fusion._count)
    A, B = _to_ir(a), _to_ir(b)
    team = tuple(mesh.devices)
    N, S = b.shape[2], max(stages, 1)
    rows = world_size * m
    b_local = ir.select_type(names.tensor(), B, 0)  # this rank's K/D rows of B
    partial = ir.Tensor(names.tensor(), (S, rows, N), a.dtype)
    out = ir.Tensor(c.name, (S, m, N), c.dtype)
    body: list = [ir.Select(b_local, B, 0, 0), ir.Allocate(partial), ir.Allocate(out)]
    h = ir.CommHandle(names.comm())
    if stages:
        i = ir.IndexVar("i")
        a_i = ir.select_type(names.tensor(), A, 0)          # [M/S, DIDx(D), K/D]
        a_local = ir.select_type(names.tensor(), a_i, 1)    # [M/S, K/D]
        p_i = ir.select_type(names.tensor(), partial, 0)
        c_i = ir.select_type(names.tensor(), out, 0)
        loop = [
            ir.Select(a_i, A, 0, i.name),
            ir.Select(a_local, a_i, 1, 0),
            ir.Select(p_i, partial, 0, i.name),
            ir.Matmul(p_i, a_local, b_local),
            ir.Select(c_i, out, 0, i.name),
            ir.Communication(h, ir.CommunicationType.ReduceScatter, team, p_i, c_i),
            ir.Wait(h),
        ]
        body.append(ir.ForLoop(i, 0, S, tuple(loop)))
    else:
        a_local = ir.select_type(names.tensor(), A, 1)
        p0 = ir.select_type(names.tensor(), partial, 0)
        c0 = ir.select_type(names.tensor(), out, 0)
        body += [
            ir.Select(a_local, A, 1, 0),
            ir.Select(p0, partial, 0, 0),
            ir.Matmul(p0, a_local, b_local),
            ir.Select(c0, out, 0, 0),
            ir.Communication(h, ir.CommunicationType.ReduceScatter, team, p0, c0),
            ir.Wait(h),
        ]
    return ir.Program((A, B), (out,), tuple(body), 1, provenance="lower_reduce_scatter")
