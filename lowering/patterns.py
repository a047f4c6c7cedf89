"""Ready-made fusions for the patterns hostir lowers (used by the CLI, tests, layers)."""

from __future__ import annotations

from hostir.errors import LoweringError
from lowering.fusion import DeviceMesh, Fusion, ParallelType


def allgather_matmul(m: int, k: int, n: int, stages: int, world_size: int,
                     dtype: str = "float32") -> Fusion:
    """``A[M, K] @ B[K, N]`` with A's rows split into ``stages`` stages and each stage's
    rows sharded over ``world_size`` devices: A[Stream(S), DIDx(D), M/(S*D), K].

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
    c = fd.matmul(a, b)
    c.parallelize(0, ParallelType.Stream)
    fd.add_output(c)
    return fd


def shard_rows(a, stages: int, world_size: int, rank: int):
    """This rank's shard of a global A[M, K] in the layout of ``allgather_matmul``:
    [S, 1, M/(S*D), K], rows s*(M/S) + rank*(M/(S*D)) + r of stage s."""
    m, k = a.shape
    return a.view(stages, world_size, m // (stages * world_size), k)[:, rank:rank + 1].contiguous()
