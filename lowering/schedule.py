"""How to run AllGather+GEMM: which schedule, how many stages and streams.

The rule, from the figures in benchmarks/results/pipelined_matmul_*.json (2 x H200):

* Across GPUs, ``ring`` (local rows first, the others by SendRecv) over the copy engine
  beats every per-stage Allgather pipeline: the first transfer hides behind the local
  GEMM, and the copy engine takes no SMs from the GEMM. Per-stage NCCL Allgathers ran
  at or above allgather-then-GEMM (NCCL kernels take SMs; every stage pays for it).
* Stages: a ring step moves (M/D)·K elements while the GEMM before it does
  2·(M/D)·K·N flops; with ~350 GB/s of peer copy and ~700 TFLOP/s of bf16 GEMM the GEMM
  takes about N/2000 times as long as the copy, so even one stage hides the transfer at
  every benchmark shape. What stages buy is shorter dependency chains: each GEMM waits
  only for its own, smaller transfer. Measured on 2 x H200 (2026-11-22, all candidates
  timed side by side, SendRecvs writing straight into the peer's buffer), the best count
  gave stages of about 2048 rows a rank: 8192 rows a rank -> S=4 (1.015 of the GEMM
  alone; S=1 1.060), 4096 -> S=2 (0.984; S=1 1.019), 16384 -> S=4 (1.011; S=1 1.119),
  2048 -> S=1 (1.020; S=2 1.028). A second run agreed within 1%. Eight stages (1024
  rows a rank each at 16384 rows a rank) were slower than four in the run after
  (32768x8192x4096: 1.055 vs 1.032; 32768x32768x8192: 1.044 vs 1.030): stages =
  rows a rank / 2048, a power of two, at most 4 (each stage also costs ~150 µs of
  eager host issue).
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
    stages = 1
    while stages < 4 and (m // world_size) // (2 * stages) >= 2048:
        stages *= 2
    while stages > 1 and m % (stages * world_size):
        stages //= 2
    return Schedule("ring", stages, 2, "copy_engine")
