"""``python -m hostir.run <job> [flags]``: the jobs users run.

    mpirun -np 2 python -m hostir.run pipelined_matmul --m 8192 --n 8192 --k 8192 --check
    mpirun -np 2 python -m hostir.run train_mlp --check
    python -m hostir.run matmul --bench          # generated split-K matmul vs cuBLAS, one GPU
    python -m hostir.run layer_norm --bench      # generated normalization kernels, one GPU

``python -m hostir.run <job> --help`` lists each job's flags; docs/JOBS.md describes them,
the MxNxK convention and the exit codes below.

Every job checks its flags, the world size, its output paths, whether the problem fits
in memory and whether the optional packages it needs are installed, all before it starts.
A refusal prints one line ``[rank R] hostir <job>: error: ...`` on every rank and every
rank exits with the same code (``HOSTIR_DEBUG=1`` adds the traceback):
"""

from __future__ import annotations

import importlib
import os
import sys
import time
import traceback

from hostir.jobs.exit_codes import (EXIT_CHECK_FAILED, EXIT_CODES, EXIT_DEPENDENCY,
                                    EXIT_INTERRUPTED, EXIT_MEMORY, EXIT_NO_DEVICE, EXIT_OUTPUT,
                                    EXIT_RUN_FAILED, EXIT_USAGE, EXIT_WORLD_SIZE)

__all__ = ["main", "JOBS", "EXIT_CODES", "EXIT_CHECK_FAILED", "EXIT_USAGE", "EXIT_WORLD_SIZE",
           "EXIT_OUTPUT", "EXIT_MEMORY", "EXIT_DEPENDENCY", "EXIT_NO_DEVICE", "EXIT_RUN_FAILED",
           "EXIT_INTERRUPTED"]

__doc__ += "".join(f"\n    {code}  {what}" for code, what in EXIT_CODES.items()) + "\n"

JOBS = {
    "pipelined_matmul": "hostir.jobs.pipelined_matmul",
    "matmul": "hostir.jobs.matmul",
    "layer_norm": "hostir.jobs.layer_norm",
    "train_mlp": "hostir.jobs.train_mlp",
    "train_transformer": "hostir.jobs.train_transformer",
    "fault_injection": "hostir.jobs.fault_injection",
    "flight_report": "hostir.jobs.flight_report",
    "warmup": "hostir.jobs.warmup",
}


def _say(job: str, rank: int, message: str, exc: BaseException | None = None) -> None:
    if exc is not None and os.environ.get("HOSTIR_DEBUG") == "1":
        traceback.print_exception(exc, file=sys.stderr)
    print(f"[rank {rank}] hostir {job}: error: {message}", file=sys.stderr, flush=True)


def _exit_code(e) -> int:
    """Refusals of the problem as asked are usage errors; failures while running are not."""
    from hostir.errors import CommunicationError, CompilationError, ExecutionError

    return EXIT_RUN_FAILED if isinstance(e, (CommunicationError, CompilationError,
                                             ExecutionError)) else EXIT_USAGE


def _close_torch_group() -> None:
    """Destroy a torch.distributed group the job created, on a clean exit, and give its
    threads the GIL once more. A gloo worker frees a finished collective's tensors after
    ``wait()`` has returned, and freeing a tensor that Python once held needs the GIL; a
    rank that reaches interpreter shutdown first makes that thread abort the finished
    process (SIGABRT after "ok"). 50 ms with the GIL released lets it finish first."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
        time.sleep(0.05)


def _environment_problem():
    """A malformed HOSTIR_* setting, refused before the job starts like a bad flag."""
    from hostir.errors import OptionsError
    from hostir.jobs.preflight import UsageError
    from hostir.options import options
    from runtime.flight import capacity_from_environ

    try:
        options()
        capacity_from_environ()
    except OptionsError as e:
        return UsageError(f"{type(e).__name__}: {e}")
    return None


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.rstrip() + "\n\njobs: " + ", ".join(sorted(JOBS)),
              file=sys.stdout if argv else sys.stderr)
        return 0 if argv else EXIT_USAGE
    try:
        return _run(argv[0], argv[1:])
    except KeyboardInterrupt as e:
        # One line, no traceback; and the error path's ending: a peer that may wait in a
        # collective for this rank is ended with it.
        from runtime.watchdog import end_after_error, process_rank

        _say(argv[0], process_rank(), "interrupted", e)
        return end_after_error(e, EXIT_INTERRUPTED)


def _run(job: str, argv: list[str]) -> int:
    from runtime.watchdog import end_after_error, install_excepthook, process_rank

    if job not in JOBS:
        _say(job, process_rank(), f"unknown job {job!r}: expected one of {', '.join(sorted(JOBS))}")
        return EXIT_USAGE

    from hostir.errors import HostIrError
    from hostir.jobs import preflight

    module = importlib.import_module(JOBS[job])
    parser = preflight.JobParser(prog=f"python -m hostir.run {job}", description=module.__doc__)
    module.add_arguments(parser)
    problem, args = None, None
    try:
        args = parser.parse_args(argv)  # --help prints and exits 0 here, before MPI
    except preflight.JobError as e:
        problem = e
    if problem is None:
        problem = _environment_problem()
    world = preflight.launch_world()
    install_excepthook()  # under mpirun: an uncaught error on one rank ends every rank
    if problem is None and hasattr(module, "validate"):
        try:
            module.validate(args, world)
        except preflight.JobError as e:
            problem = e
    # A refusal that only some ranks see (a full disk, less free memory, a missing
    # package on one node) must still end every rank: the ranks agree first.
    problem = preflight.agree(problem, world)
    if problem is not None:
        _say(job, world.rank, str(problem), problem)
        return problem.code

    try:
        code = int(module.main(args) or 0)
        _close_torch_group()
        return code
    except (HostIrError, preflight.JobError) as e:
        # Refusals are the user's to fix: one clear line, rank first, no traceback.
        code = e.code if isinstance(e, preflight.JobError) else _exit_code(e)
        text = str(e) if isinstance(e, preflight.JobError) else f"{type(e).__name__}: {e}"
        _say(job, process_rank(), text, e)
        # aborts only where a peer may be left waiting in a collective this rank won't post
        return end_after_error(e, code)


def _leave(code: int) -> None:
    """``sys.exit(code)``; after an interrupt, ``os._exit(code)`` once MPI is finalized and
    the streams flushed. Under load, about one run in eight, an interrupted job that had
    printed its line and returned 130 still ended by SIGINT (status -2): CPython kills
    itself with SIGINT at exit where it took an interrupt as unhandled, most likely one
    that landed while an extension ran Python source through the C API (torch's import)."""
    if code == EXIT_INTERRUPTED:
        from runtime.bootstrap import mpi_world

        if mpi_world() is not None:  # MPI up (never initialized here)
            sys.modules["mpi4py.MPI"].Finalize()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    _leave(main())
