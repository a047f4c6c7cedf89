"""Autotuned schedules of AllGather+GEMM, persisted per device, world size, shape, dtype.

The overlap benchmark (``--bench --autotune``) stores the fastest correct schedule it
measured; ``choose`` returns it when one is stored and fits the problem, else the
heuristic of ``lowering.schedule``. The table (``SCHEDULES``) is a
`runtime.store.JsonTable`: private directory, merged under a lock (ranks or jobs writing
at once lose no entry), every field checked (`check_schedule`).

    >>> choose(8192, 8192, 8192, world_size=2, device="cuda", dtype="bfloat16")  # doctest: +SKIP
    Schedule(schedule='ring', stages=1, streams=2, transport='copy_engine')
"""

from __future__ import annotations

import torch

from hostir.options import dump
from lowering.schedule import Schedule, choose_schedule
from runtime.store import JsonTable, need, need_int, need_number, need_str

FILE = "pipelined_matmul_schedules.json"

SCHEDULES_KNOWN = ("pipelined", "ring")
TRANSPORTS = ("nccl", "copy_engine", "mpi", "torch")
CPU_TRANSPORTS = ("mpi", "torch")   # nccl and the copy engine need GPUs
MAX_STAGES = 1024
MAX_STREAMS = 64
MAX_MICROSECONDS = 1e12


def _key(m, k, n, world_size, device_name, dtype) -> str:
    return f"{device_name}|world{world_size}|{m}x{k}x{n}|{dtype}"


def _device_name(device: str) -> str:
    return torch.cuda.get_device_name() if device == "cuda" else "cpu"


def check_schedule(raw: dict, m: int, world_size: int, device: str) -> Schedule:
    """The stored schedule ``raw`` if every field checks and it fits the problem it is
    keyed under: a known schedule and transport (one the device has), 1 <= stages <=
    MAX_STAGES with stages * world_size dividing m, 1 <= streams <= MAX_STREAMS."""
    schedule = need_str(raw.get("schedule"), "schedule", SCHEDULES_KNOWN)
    stages = need_int(raw.get("stages"), "stages", 1, MAX_STAGES)
    streams = need_int(raw.get("streams"), "streams", 1, MAX_STREAMS)
    transport = need_str(raw.get("transport"), "transport",
                               TRANSPORTS if device == "cuda" else CPU_TRANSPORTS)
    need_number(raw.get("us"), "us", 0, MAX_MICROSECONDS)
    need(m % (stages * world_size) == 0,
               f"stages {stages} x world {world_size} do not divide m={m}")
    return Schedule(schedule, stages, streams, transport)


SCHEDULES = JsonTable("schedule store", FILE)


def store(m, k, n, world_size, device, dtype, schedule: Schedule, us: float) -> None:
    """Store ``schedule`` (timed at ``us`` microseconds) for this problem."""
    SCHEDULES.put(_key(m, k, n, world_size, _device_name(device), dtype),
                  {**schedule.__dict__, "us": us})


def choose(m, k, n, world_size, device, dtype) -> Schedule:
    """The stored winner for this problem if it checks, else the heuristic."""
    s = SCHEDULES.get(_key(m, k, n, world_size, _device_name(device), dtype),
                      lambda raw: check_schedule(raw, m, world_size, device))
    if s is not None:
        dump("autotune", f"pipelined_matmul {m}x{k}x{n}: tuned {s.key()}")
        return s
    s = choose_schedule(m, k, n, world_size, device)
    dump("autotune", f"pipelined_matmul {m}x{k}x{n}: heuristic {s.key()}")
    return s
