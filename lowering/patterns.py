"""Ready-made fusions for the patterns hostir lowers (used by the CLI, tests, layers)."""

from __future__ import annotations

from hostir.errors import LoweringError
from lowering.fusion import DeviceMesh, Fusion, ParallelType


def allgather_matmul(m: int, k: int, n: int, stages: int, world_size: int,
                     dtype: str = "float32", epilogue: str | None = None) -> Fusion:
    """``A[M, K] @ B[K, N]`` with A's rows split into ``stages`` stages and each stage's
    rows sharded over ``world_size`` devices: A[Stream(S), DIDx(D), M/(S*D), K].

    ``epilogue`` (``ir.Matmul``): ``gelu_aux`` adds a second output, the pre-activation
    ``[Stream(S), D, M/(S*D), N]`` laid out as C; ``dgelu`` a third input of that type,
    the saved pre-activation. Every per-stage (or per-row-block) GEMM gets the epilogue
    and its rows of the pre-activation.

    >>> fd = allgather_matmul(1024, 256, 512, stages=2, world_size=2)
    >>> fd.inputs[0]
    T0: float32[Stream(2), DIDx(2), 256, 256]
    """
    if stages < 1:
        raise LoweringError(f"tensor A axis 0: expected at least 1 stage, got {stages}")
    if m % (stages * world_size):
        raise LoweringError(
            f"tensor T0 (A) axis 0: extent M={m} is not divisible by stages*devices = "
            f"{stages}*{world_size} = {stages * world_size}; expected a multiple of it"
        )
    fd = Fusion()
    a = fd.define_tensor([m, k], dtype)
    b = fd.define_tensor([k, n], dtype)
    a.split(0, stages)
    a.split(1, world_size)
    a.set_mesh(DeviceMesh(tuple(range(world_size))))
    a.parallelize(0, ParallelType.Stream)
    a.parallelize(1, ParallelType.DIDx)
    pre = None
    if epilogue == "dgelu":
        pre = fd.define_tensor([m, n], dtype)
        pre.split(0, stages)
        pre.split(1, world_size)
    result = fd.matmul(a, b, epilogue, pre)
    c, pre = result if epilogue == "gelu_aux" else (result, pre)
    for t in (c, pre) if pre is not None else (c,):
        t.parallelize(0, ParallelType.Stream)
    fd.add_output(c)
    if epilogue == "gelu_aux":
        fd.add_output(pre)
    return fd


def check_row_split(tensor: str, rows: int, stages: int, world_size: int, axis: int = 0) -> None:
    """Refuse ``rows`` rows that do not split evenly into ``stages`` stages of
    ``world_size`` ranks: flooring the shard size would drop rows without a word.

    >>> check_row_split("x", 7, 1, 2)
    Traceback (most recent call last):
    ...
    hostir.errors.LoweringError: tensor x axis 0: extent 7 does not split over 1 stage(s) x 2 ranks; expected a multiple of 2, got 7
    """
    if stages < 1 or world_size < 1:
        raise LoweringError(f"tensor {tensor} axis {axis}: expected at least 1 stage and 1 rank, "
                            f"got stages={stages}, ranks={world_size}")
    if rows % (stages * world_size):
        raise LoweringError(
            f"tensor {tensor} axis {axis}: extent {rows} does not split over {stages} stage(s) "
            f"x {world_size} ranks; expected a multiple of {stages * world_size}, got {rows}")


def shard_rows(a, stages: int, world_size: int, rank: int):
    """This rank's shard of a global A[M, K] in the layout of ``allgather_matmul``:
    [S, 1, M/(S*D), K], rows s*(M/S) + rank*(M/(S*D)) + r of stage s."""
    m, k = a.shape
    check_row_split("A", m, stages, world_size)
    return a.view(stages, world_size, m // (stages * world_size), k)[:, rank:rank + 1].contiguous()


def matmul_reduce_scatter(m: int, k: int, n: int, stages: int, world_size: int,
                          dtype: str = "float32", epilogue: str | None = None) -> Fusion:
    """``A[M, K] @ B[K, N]`` with the contraction axis K sharded over ``world_size`` devices
    and the result reduce-scattered over rows, stage by stage (the row-parallel side):

        A[Stream(S), M/S, DIDx(D), K/D] @ B[DIDx(D), K/D, N] -> C[Stream(S), DIDx(D), M/(S*D), N]

    >>> fd = matmul_reduce_scatter(1024, 256, 512, stages=2, world_size=2)
    >>> fd.inputs[0], fd.inputs[1], fd.outputs[0]
    (T0: float32[Stream(2), 512, DIDx(2), 128], T1: float32[DIDx(2), 128, 512], T2: float32[Stream(2), DIDx(2), 256, 512])

    ``epilogue`` must be None: each rank's GEMM yields a partial sum, and a GELU (or its
    derivative) of a partial sum is not one of the sum; it belongs after the reduction.
    """
    if epilogue is not None:
        raise LoweringError(
            f"matmul_reduce_scatter: epilogue {epilogue!r} would apply to each rank's partial "
            "sum, not to the reduced product; expected None (apply it after the reduce-scatter)")
    if stages < 1:
        raise LoweringError(f"tensor T0 (A) axis 0: expected at least 1 stage, got {stages}")
    if m % (stages * world_size):
        raise LoweringError(
            f"tensor T2 (C) axis 0: extent M={m} is not divisible by stages*devices = "
            f"{stages}*{world_size} = {stages * world_size}; expected a multiple of it"
        )
    if k % world_size:
        raise LoweringError(
            f"tensor T0 (A) axis 1: extent K={k} is not divisible by the {world_size} devices; "
            f"expected a multiple of {world_size}"
        )
    fd = Fusion()
    a = fd.define_tensor([m, k], dtype)
    b = fd.define_tensor([k, n], dtype)
    c = fd.matmul(a, b)  # the logical product first, then its sharding
    mesh = DeviceMesh(tuple(range(world_size)))
    a.split(1, world_size).split(0, stages).set_mesh(mesh)
    a.parallelize(0, ParallelType.Stream).parallelize(2, ParallelType.DIDx)
    b.split(0, world_size).set_mesh(mesh).parallelize(0, ParallelType.DIDx)
    c.split(0, stages).split(1, world_size).set_mesh(mesh)
    c.parallelize(0, ParallelType.Stream).parallelize(1, ParallelType.DIDx)
    fd.add_output(c)
    return fd


def is_reduce_scatter(fusion: Fusion) -> bool:
    """Whether ``fusion`` is a matmul whose K axis is split over devices (B split into
    [D, K/D, N]) or whose output is sharded: the GEMM + ReduceScatter side."""
    if len(fusion.ops) != 1 or fusion.ops[0].kind != "matmul":
        return False
    op = fusion.ops[0]
    b, c = op.inputs[1], op.output
    return len(b.shape) == 3 or ParallelType.DIDx in c.parallel


def shard_columns(a, world_size: int, rank: int):
    """This rank's columns of a global A[M, K] in the layout of ``matmul_reduce_scatter``
    (columns rank*K/D ..), contiguous, as [M, K/D]; the program takes it as a view
    ``.view(S, M/S, 1, K/D)``."""
    m, k = a.shape
    check_row_split("A", k, 1, world_size, axis=1)
    return a[:, rank * (k // world_size):(rank + 1) * (k // world_size)].contiguous()


def stage_rows(stages: int, rows: int, world_size: int, rank: int):
    """The global row indices, in order, that rank ``rank`` holds when ``rows`` rows are
    split into ``stages`` stages and each stage's rows over ``world_size`` ranks: the
    shard of ``shard_rows`` (input of ``allgather_matmul``) and the output of
    ``matmul_reduce_scatter``, ``[S, rows/(S*D), N]``.

    >>> stage_rows(2, 8, 2, 1).tolist()
    [2, 3, 6, 7]
    """
    import torch

    check_row_split("rows", rows, stages, world_size)
    m = rows // (stages * world_size)
    stage = torch.arange(stages).view(stages, 1) * (m * world_size)
    return (stage + rank * m + torch.arange(m).view(1, m)).reshape(-1)
