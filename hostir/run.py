"""``python -m hostir.run <job> [flags]``: the jobs users run.

    mpirun -np 2 python -m hostir.run pipelined_matmul --m 8192 --k 8192 --n 8192 --check
    python -m hostir.run matmul --bench          # generated split-K matmul vs cuBLAS, one GPU
    python -m hostir.run layer_norm --bench      # generated normalization kernels, one GPU

``python -m hostir.run <job> --help`` lists each job's flags.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from hostir.errors import HostIrError

JOBS = {
    "pipelined_matmul": "hostir.jobs.pipelined_matmul",
    "matmul": "hostir.jobs.matmul",
    "layer_norm": "hostir.jobs.layer_norm",
    "train_mlp": "hostir.jobs.train_mlp",
    "train_transformer": "hostir.jobs.train_transformer",
    "fault_injection": "hostir.jobs.fault_injection",
}


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m hostir.run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("job", choices=sorted(JOBS), help="what to run")
    if not argv or argv[0] not in JOBS:
        parser.parse_args(argv[:1] or ["--help"])
        return 2
    module = importlib.import_module(JOBS[argv[0]])
    sub = argparse.ArgumentParser(prog=f"python -m hostir.run {argv[0]}",
                                  description=module.__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    module.add_arguments(sub)
    args = sub.parse_args(argv[1:])
    from runtime.watchdog import end_job, install_excepthook, process_rank, world_size

    install_excepthook()  # under mpirun: an uncaught error on one rank ends every rank
    try:
        return int(module.main(args) or 0)
    except HostIrError as e:
        # Refusals are the user's to fix: one clear line, rank first, no traceback.
        print(f"[rank {process_rank()}] hostir {argv[0]}: error: {type(e).__name__}: {e}",
              file=sys.stderr, flush=True)
        if world_size() > 1 and not getattr(e, "on_every_rank", False):
            end_job(2)  # peers may be waiting in a collective this rank will never post
        return 2


if __name__ == "__main__":
    sys.exit(main())
