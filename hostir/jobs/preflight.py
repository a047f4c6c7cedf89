"""What every job checks before it starts: flag values, world size, output paths, memory,
optional packages; and the ranks' agreement on the outcome.

A job's ``validate(args, world)`` raises one of the `JobError` classes below; each
carries the exit code of its class (`hostir.jobs.exit_codes`, which `hostir.run`
exports). ``hostir.run`` then has every rank agree (`agree`) before the first
collective, so that a refusal seen by one rank only ends every rank instead of leaving
its peers waiting.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import re
import tempfile
from pathlib import Path

from hostir.jobs.exit_codes import (EXIT_DEPENDENCY, EXIT_MEMORY, EXIT_NO_DEVICE,
                                    EXIT_OUTPUT, EXIT_USAGE, EXIT_WORLD_SIZE)

# The dtypes of the multi-rank jobs' --dtype (one list for all of them).
DTYPES = ("float32", "float64", "bfloat16", "float16")


class JobError(Exception):
    """A refusal before (or, for output files, while) a job runs; ``code`` is its exit code."""

    code = EXIT_USAGE

    def __init__(self, message: str, code: int | None = None):
        super().__init__(message)
        if code is not None:
            self.code = code


class UsageError(JobError):
    code = EXIT_USAGE


class WorldSizeError(JobError):
    code = EXIT_WORLD_SIZE


class OutputPathError(JobError):
    code = EXIT_OUTPUT


class MemoryEstimateError(JobError):
    code = EXIT_MEMORY


class MissingDependencyError(JobError):
    code = EXIT_DEPENDENCY


class NoDeviceError(JobError):
    code = EXIT_NO_DEVICE


class JobParser(argparse.ArgumentParser):
    """argparse whose errors are a `UsageError` (one line, no usage block, on every rank)."""

    def error(self, message):
        raise UsageError(message)


# ----------------------------------------------------------------------- flag types


def at_least(lo: int):
    """An argparse type: an integer >= lo."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < lo:
            raise argparse.ArgumentTypeError(f"expected an integer >= {lo}, got {value}")
        return value

    parse.__name__ = f"integer >= {lo}"
    return parse


def positive_float(text: str) -> float:
    """An argparse type: a finite float > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text}")
    return value


# --seed: a signed 64-bit integer. torch takes [-2**63, 2**64 - 1]; the jobs derive more
# seeds by adding small offsets (seed + 1, seed + 1000 + step), which must stay in range.
SEED_MIN, SEED_MAX = -2 ** 63, 2 ** 63 - 1


def seed(text: str) -> int:
    """An argparse type: a random seed, an integer in [SEED_MIN, SEED_MAX]."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if not SEED_MIN <= value <= SEED_MAX:
        raise argparse.ArgumentTypeError(f"expected an integer from -2**63 to 2**63 - 1, "
                                         f"got {text}")
    return value


def device_name(text: str) -> str:
    """An argparse type: auto, cpu, cuda or cuda:N."""
    if re.fullmatch(r"auto|cpu|cuda(:\d+)?", text):
        return text
    raise argparse.ArgumentTypeError(f"expected auto, cpu, cuda or cuda:N, got {text!r}")


def shape_list(text: str) -> list[tuple[int, int, int]]:
    """An argparse type: comma-separated MxNxK (C[M, N] = A[M, K] @ B[K, N]), each >= 1."""
    shapes = []
    for item in text.split(","):
        parts = item.strip().lower().split("x")
        try:
            m, n, k = (int(p) for p in parts)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected MxNxK[,MxNxK...] (e.g. 8192x8192x4096), got {item.strip()!r}") from None
        if min(m, n, k) < 1:
            raise argparse.ArgumentTypeError(f"{item.strip()}: every extent must be >= 1")
        shapes.append((m, n, k))
    return shapes


# ----------------------------------------------------------------------- the ranks


@dataclasses.dataclass(frozen=True)
class World:
    """This process's rank and the job's world size, as launched; ``comm`` is
    MPI.COMM_WORLD under an MPI launcher (what `agree` talks over), else None."""

    rank: int = 0
    size: int = 1
    local_size: int = 1
    comm: object = None


_MPI_LAUNCHED = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS")


def launch_world() -> World:
    """The ranks as launched: torchrun's variables (no MPI), an MPI launcher's (MPI is
    initialized here, as the jobs would anyway), or one process (MPI not touched)."""
    env = os.environ
    if "TORCHELASTIC_RUN_ID" in env or ("RANK" in env and "MASTER_ADDR" in env):
        return World(int(env.get("RANK", 0)), int(env.get("WORLD_SIZE", 1)),
                     int(env.get("LOCAL_WORLD_SIZE", 1)), None)
    if not any(v in env for v in _MPI_LAUNCHED):
        return World()
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        local_size = local.Get_size()
    finally:
        local.Free()
    return World(comm.Get_rank(), comm.Get_size(), local_size, comm)


def agree(problem: JobError | None, world: World) -> JobError | None:
    """Every rank's outcome of its checks, agreed over MPI: None when no rank refused; else
    this rank's own refusal, or one naming the first rank that refused. Every rank gets
    the exit code of the lowest rank that refused."""
    if world.comm is None or world.size == 1:
        return problem
    mine = None if problem is None else (problem.code, str(problem))
    outcomes = world.comm.allgather(mine)
    failed = [(r, o) for r, o in enumerate(outcomes) if o is not None]
    if not failed:
        return None
    first_rank, (code, message) = failed[0]
    if problem is None:
        return JobError(f"rank {first_rank} refused the run: {message}", code)
    problem.code = code
    return problem


# ----------------------------------------------------------------------- devices


def resolve_device(flag_value: str) -> str:
    """``auto`` → cuda when a GPU is visible, else cpu; a CUDA device asked for where none
    is visible is a `NoDeviceError`."""
    import torch

    cuda = torch.cuda.is_available() and torch.cuda.device_count() > 0
    if flag_value == "auto":
        return "cuda" if cuda else "cpu"
    if flag_value.startswith("cuda"):
        if not cuda:
            raise NoDeviceError(f"--device {flag_value}: no CUDA device is visible "
                                f"(torch {torch.__version__}, CUDA build: "
                                f"{torch.version.cuda or 'no'}); use --device cpu")
        if ":" in flag_value and int(flag_value.split(":")[1]) >= torch.cuda.device_count():
            raise NoDeviceError(f"--device {flag_value}: only {torch.cuda.device_count()} "
                                "CUDA devices are visible")
    return flag_value


def need_cuda(what: str, device: str) -> None:
    """Refuse CUDA-only work on the CPU."""
    if not device.startswith("cuda"):
        raise NoDeviceError(f"{what} needs a CUDA GPU, and this run is on the CPU"
                            + (" (--device cpu)" if device == "cpu" else ""))


def need_module(module: str, install: str, what: str) -> None:
    """Refuse ``what`` when ``module`` cannot be imported; say how to install it."""
    if importlib.util.find_spec(module) is None:
        raise MissingDependencyError(f"{what} needs the package {module!r}, which is not "
                                     f"installed: pip install {install}")


def cupy_install() -> str:
    """The pip line for CuPy matching this torch's CUDA (and NCCL), or the generic one."""
    import torch

    major = (torch.version.cuda or "12").split(".")[0]
    return f"cupy-cuda{major}x  (or: pip install -e '.[cuda{major}]')"


# ----------------------------------------------------------------------- outputs


RESULTS_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def writable_output(flag: str, path: str, *, directory_ok: bool = False) -> Path:
    """Check, before the run, that ``path`` can be written: its directory is created if
    missing and a file is made (and removed) in it; an existing ``path`` must be a
    writable regular file (or, with ``directory_ok``, a directory). Returns the path."""
    if not path:
        raise OutputPathError(f"{flag}: an empty path, expected a file name")
    p = Path(path).expanduser()
    if p.is_dir() and not directory_ok:
        raise OutputPathError(f"{flag} {path}: is a directory, expected a file")
    if not directory_ok and os.path.basename(path) in ("", ".", ".."):
        # Path() drops a trailing '/': "out/" would pass as the file "out"
        raise OutputPathError(f"{flag} {path}: names a directory, expected a file")
    if p.exists() and not p.is_file() and not p.is_dir():
        raise OutputPathError(f"{flag} {path}: exists and is not a regular file "
                              "(a device, fifo or socket)")
    directory = p if (p.is_dir() or (directory_ok and path.endswith(os.sep))) else p.parent
    blocker = next((q for q in (directory, *directory.parents) if q.exists()), None)
    if blocker is not None and not blocker.is_dir():
        raise OutputPathError(f"{flag} {path}: {blocker} is a file, not a directory")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
        if p.is_file() and not os.access(p, os.W_OK):
            raise PermissionError(f"{p} is read-only")
    except OSError as e:
        reason = e.strerror or str(e)
        raise OutputPathError(f"{flag} {path}: cannot write in {directory}: {reason}") from None
    return p


def refuse_results_on_cpu(flag: str, path: str, device: str) -> None:
    """The repository's benchmarks/results/ holds GPU figures only."""
    if device.startswith("cuda"):
        return
    p = Path(path).expanduser().resolve()
    if p == RESULTS_DIR or RESULTS_DIR in p.parents:
        raise OutputPathError(f"{flag} {path}: benchmarks/results/ holds GPU results only; "
                              "a CPU run writes elsewhere (or nowhere: it prints)")


# ----------------------------------------------------------------------- memory


GIB = 2.0 ** 30


def host_memory_available() -> int:
    """Bytes the kernel says can be allocated without swapping (MemAvailable)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def check_fits(what: str, nbytes: float, device: str, world: World) -> None:
    """Refuse a problem whose estimated ``nbytes`` per rank exceed what this rank may use:
    the free memory of its GPU, or its share of the host's available memory (the ranks
    of one node share it)."""
    if device.startswith("cuda"):
        import torch

        from runtime.session import local_rank

        index = (int(device.split(":")[1]) if ":" in device
                 else local_rank() % torch.cuda.device_count())
        free, _ = torch.cuda.mem_get_info(index)
        where = f"free on cuda:{index}"
    else:
        free = host_memory_available() // max(1, world.local_size)
        where = ("available on this host (MemAvailable"
                 + (f", shared by {world.local_size} ranks)" if world.local_size > 1 else ")"))
    if nbytes > free:
        raise MemoryEstimateError(f"{what} needs about {nbytes / GIB:.1f} GiB per rank, "
                                  f"{free / GIB:.1f} GiB {where}; choose smaller sizes")


def dtype_bytes(name: str) -> int:
    return {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}[name]
