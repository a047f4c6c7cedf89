"""What every results file records about where it came from, and how results files are named."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
from pathlib import Path


def commit() -> str:
    """HOSTIR_COMMIT when set (a copy of the tree, as on the device machines, may carry
    a stale .git or none), else the checkout's HEAD, else "unknown"."""
    if os.environ.get("HOSTIR_COMMIT"):
        return os.environ["HOSTIR_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True, cwd=Path(__file__).resolve().parents[2]).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def device_slug(name: str) -> str:
    """One spelling of a device in file names: the CUDA device name lowercased, words joined
    by '-', the memory size and kind left out (``NVIDIA H200`` → ``nvidia-h200``,
    ``NVIDIA H100 80GB HBM3`` → ``nvidia-h100``; ``NVIDIA H100 NVL`` keeps ``-nvl``)."""
    words = re.split(r"[^a-z0-9]+", name.lower())
    kept = [w for w in words if w and not re.fullmatch(r"\d+gb|hbm\d*e?", w)]
    return "-".join(kept) or "unknown"


def results_name(bench: str, device: str, world_size: int = 1) -> str:
    """``<bench>_<device>[_x<N>].json``: the name of a results file (N = world size > 1)."""
    return f"{bench}_{device_slug(device)}{f'_x{world_size}' if world_size > 1 else ''}.json"


def results_path(json_flag: str, bench: str, device: str, world_size: int = 1) -> Path:
    """Where ``--json`` writes: the file named, or, given a directory (an existing one, or
    a path ending in '/'), `results_name` inside it."""
    p = Path(json_flag).expanduser()
    if p.is_dir() or json_flag.endswith(os.sep):
        return p / results_name(bench, device, world_size)
    return p


def write_json(path: Path, doc: dict, flag: str = "--json") -> None:
    """Write ``doc`` to ``path`` whole (a reader never sees half a file), or leave ``path``
    as it was and raise an `OutputPathError` naming ``flag`` (a full disk, a file size
    limit, a ``path`` that exists and is not a regular file: never replaced)."""
    import json

    from hostir.jobs.preflight import OutputPathError

    if path.exists() and not path.is_file():
        raise OutputPathError(f"{flag} {path}: exists and is not a regular file (a directory, "
                              "device, fifo or socket); nothing written")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "w") as f:
            f.write(json.dumps(doc, indent=1) + "\n")
            f.flush()
            os.fsync(f.fileno())  # a full disk shows here, not after the rename
        os.replace(tmp, path)
    except OSError as e:
        raise OutputPathError(f"{flag} {path}: cannot write: {e.strerror or e}; "
                              "nothing written") from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


def write_on_rank0(rank: int, write):
    """``write()`` on rank 0 (it raises `OutputPathError` when it fails), and its outcome on
    every rank (`output_outcome`): a failure ends each rank with the output error. Returns
    what ``write`` returned on rank 0, None elsewhere; every rank calls it."""
    from hostir.jobs.preflight import OutputPathError

    result, failed = None, None
    if rank == 0:
        try:
            result = write()
        except OutputPathError as e:
            failed = str(e)
    output_outcome(failed, rank)
    return result


def output_outcome(failed: str | None, rank: int) -> None:
    """Rank 0's outcome of writing an output (None: written), on every rank; every rank
    calls it (a broadcast: the torch.distributed group if there is one, else MPI). A
    failure ends each rank with the output error: none exits 0, none is left waiting."""
    import sys

    from hostir.jobs.preflight import OutputPathError

    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        import torch

        box = [failed]
        device = (torch.device("cuda", torch.cuda.current_device())
                  if dist.get_backend() == "nccl" else None)
        dist.broadcast_object_list(box, src=0, device=device)
        failed = box[0]
    else:
        from mpi4py import MPI

        failed = MPI.COMM_WORLD.bcast(failed, root=0)
    if failed is not None:
        e = OutputPathError(failed if rank == 0 else f"rank 0 failed: {failed}")
        e.on_every_rank = True  # raised alike on every rank (hostir.run: a normal exit)
        raise e
