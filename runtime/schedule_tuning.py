"""Autotuned schedules of AllGather+GEMM, persisted per device, world size, shape, dtype.

The overlap benchmark (``--bench --autotune``) stores the fastest correct schedule it
measured; ``choose`` returns it when one is stored, else the heuristic of
``lowering.schedule``. Writes are atomic (temp file + os.replace), so ranks or jobs
writing at once leave a whole file.

    >>> choose(8192, 8192, 8192, world_size=2, device="cuda", dtype="bfloat16")  # doctest: +SKIP
    Schedule(schedule='ring', stages=1, streams=2, transport='copy_engine')
"""

from __future__ import annotations

import json

import torch

from hostir.options import dump, options
from lowering.schedule import Schedule, choose_schedule
from runtime.jit import write_atomically

FILE = "pipelined_matmul_schedules.json"


def _path():
    return options().cache_dir / FILE


def _key(m, k, n, world_size, device_name, dtype) -> str:
    return f"{device_name}|world{world_size}|{m}x{k}x{n}|{dtype}"


def _device_name(device: str) -> str:
    return torch.cuda.get_device_name() if device == "cuda" else "cpu"


def load() -> dict:
    try:
        with open(_path()) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}  # missing or unreadable: fall back to the heuristic


def store(m, k, n, world_size, device, dtype, schedule: Schedule, us: float) -> None:
    data = load()
    data[_key(m, k, n, world_size, _device_name(device), dtype)] = {
        **schedule.__dict__, "us": us}
    write_atomically(_path(), json.dumps(data, indent=1, sort_keys=True).encode())


def choose(m, k, n, world_size, device, dtype) -> Schedule:
    """The stored winner for this problem, else the heuristic."""
    entry = load().get(_key(m, k, n, world_size, _device_name(device), dtype))
    if entry:
        try:
            s = Schedule(entry["schedule"], int(entry["stages"]), int(entry["streams"]),
                         entry["transport"])
            dump("autotune", f"pipelined_matmul {m}x{k}x{n}: tuned {s.key()} ({entry.get('us')} us)")
            return s
        except (KeyError, TypeError, ValueError):
            pass
    s = choose_schedule(m, k, n, world_size, device)
    dump("autotune", f"pipelined_matmul {m}x{k}x{n}: heuristic {s.key()}")
    return s
