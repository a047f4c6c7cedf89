"""The fault matrix: per fault and comm backend, how the job ended and how fast.

Every fault test records its job here (``record``); ``tests/faults/conftest.py`` writes
the rows as JSON at the end of the session, only when ``HOSTIR_FAULTS_JSON=path`` asks
(CI runs write nothing). The GPU matrix is produced the same way, e.g.

    HOSTIR_FAULTS_JSON=benchmarks/results/faults_nvidia-h100_x2.json python -m pytest tests/faults
"""

from __future__ import annotations

import json
import os
import platform

ROWS: list[dict] = []


def record(fault: str, comm: str, ranks: int, injected: str, exit_code: int,
           seconds: float, comm_timeout_s: float) -> None:
    ROWS.append({"fault": fault, "comm": comm, "ranks": ranks, "injected": injected,
                 "exit_code": exit_code, "seconds_to_exit": round(seconds, 2),
                 "comm_timeout_s": comm_timeout_s})


def write(path: str) -> None:
    """The rows, sorted by fault and backend, with the machine they ran on."""
    import datetime

    import torch

    from hostir.jobs.results import commit

    cuda = torch.cuda.is_available()
    data = {
        "bench": "faults",
        "device": torch.cuda.get_device_name(0) if cuda else f"cpu ({platform.machine()})",
        "gpus": torch.cuda.device_count() if cuda else 0,
        "date": datetime.date.today().isoformat(),
        "commit": commit(),
        "torch": torch.__version__,
        "rows": sorted(ROWS, key=lambda r: (r["fault"], r["comm"], r["ranks"])),
    }
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)
