"""How to run AllGather+GEMM: which schedule, how many stages and streams.

The rule, from the figures in benchmarks/results/pipelined_matmul_*.json (2 x H200):

* Across GPUs, ``ring`` (local rows first, the others by SendRecv) over the copy engine
  beats every per-stage Allgather pipeline: the first transfer hides behind the local
  GEMM, and the copy engine takes no SMs from the GEMM. Per-stage NCCL Allgathers ran
  at or above allgather-then-GEMM (NCCL kernels take SMs; every stage pays for it).
* Stages: a ring step moves (M/D)·K elements while the GEMM before it does
  2·(M/D)·K·N flops; with ~350 GB/s of peer copy and ~700 TFLOP/s of bf16 GEMM the GEMM
  takes about N/2000 times as long as the copy, so one stage hides the transfer at every
  benchmark shape. Measured on 2 x H200 (2026-11-22), one stage was fastest (within 2%)
  up to 8192 rows a rank, and four stages were 3-4% faster from 16384 rows a rank
  (32768x8192x4096, 32768x32768x8192): with long transfers, smaller ones interleave
  better with the GEMMs that wait on them.
* On one rank, or on CPU ranks, the plain pipelined program (nothing to hide).

An autotuned choice, when one was stored for the same device, world size, shape and
dtype (``runtime.schedule_tuning``), overrides this rule.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Schedule:
    schedule: str      # "pipelined" or "ring"
    stages: int
    streams: int
    transport: str     # "nccl", "copy_engine", "mpi" or "torch"

    def key(self) -> str:
        return f"{self.schedule}/S{self.stages}/streams{self.streams}/{self.transport}"


def choose_schedule(m: int, k: int, n: int, world_size: int, device: str) -> Schedule:
    """The heuristic schedule for A[M, K] (rows sharded over ``world_size``) @ B[K, N]."""
    if device != "cuda" or world_size == 1:
        stages = 2 if m % (2 * world_size) == 0 else 1
        return Schedule("pipelined", stages, 2, "nccl" if device == "cuda" else "mpi")
    stages = 4 if m // world_size >= 16384 else 1
    while stages > 1 and m % (stages * world_size):
        stages //= 2
    return Schedule("ring", stages, 2, "copy_engine")
