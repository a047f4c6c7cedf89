"""Ordinary mistakes end every job with one line a rank and the exit code of their class.

Each case is an ``mpirun -np N python -m hostir.run JOB FLAGS`` job on CPU ranks; it must
end within the timeout (no hang), with the case's exit code (``hostir.run``'s constants,
docs/JOBS.md), exactly one ``[rank R] hostir JOB: error: ...`` line on every rank, and no
traceback. The jobs run a few at a time (the CI machines have 2 cores)::

    python -m pytest tests/faults/test_bad_invocations.py
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hostir.run import (EXIT_DEPENDENCY, EXIT_MEMORY, EXIT_NO_DEVICE, EXIT_OUTPUT,
                        EXIT_USAGE, EXIT_WORLD_SIZE)

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 90
PARALLEL = 6

pytestmark = pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs mpirun")


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


NO_CUDA = not _cuda()
NO_MATPLOTLIB = importlib.util.find_spec("matplotlib") is None
NO_CUPY = importlib.util.find_spec("cupy") is None

# (job, ranks, flags, exit code, what the message must say, run the case here?)
CASES = [
    # pipelined_matmul: flag values
    ("pipelined_matmul", 1, "--iters 0", EXIT_USAGE, "argument --iters: expected an integer >= 1, got 0", True),
    ("pipelined_matmul", 2, "--iters -3", EXIT_USAGE, "expected an integer >= 1, got -3", True),
    ("pipelined_matmul", 1, "--m 0", EXIT_USAGE, "argument --m: expected an integer >= 1", True),
    ("pipelined_matmul", 2, "--k abc", EXIT_USAGE, "argument --k: expected an integer, got 'abc'", True),
    ("pipelined_matmul", 1, "--stages 0", EXIT_USAGE, "argument --stages", True),
    ("pipelined_matmul", 3, "--streams 0", EXIT_USAGE, "argument --streams", True),
    ("pipelined_matmul", 1, "--dtype int8", EXIT_USAGE, "argument --dtype: invalid choice: 'int8'", True),
    ("pipelined_matmul", 2, "--no-such-flag", EXIT_USAGE, "unrecognized arguments: --no-such-flag", True),
    ("pipelined_matmul", 1, "--device tpu", EXIT_USAGE, "expected auto, cpu, cuda or cuda:N, got 'tpu'", True),
    ("pipelined_matmul", 1, "--autotune", EXIT_USAGE, "--autotune is for --bench", True),
    ("pipelined_matmul", 1, "--bench --shapes 8x8", EXIT_USAGE, "expected MxNxK", True),
    ("pipelined_matmul", 1, "--warmup -1", EXIT_USAGE, "argument --warmup: expected an integer >= 0", True),
    # pipelined_matmul: sizes against stages and ranks
    ("pipelined_matmul", 2, "--m 10 --stages 4", EXIT_USAGE, "--m 10 is not divisible by --stages 4", True),
    ("pipelined_matmul", 3, "--m 1024 --stages 2", EXIT_WORLD_SIZE, "does not split into --stages 2 x 3 ranks", True),
    ("pipelined_matmul", 3, "", EXIT_WORLD_SIZE, "--m 1024 rows do not split over 3 ranks", True),
    # pipelined_matmul: outputs, memory, optional packages, devices
    ("pipelined_matmul", 1, "--json /etc/hostname/run.json", EXIT_OUTPUT, "/etc/hostname is a file, not a directory", True),
    ("pipelined_matmul", 2, "--json benchmarks/results/cpu_run.json", EXIT_OUTPUT, "holds GPU results only", True),
    ("pipelined_matmul", 1, "--trace /proc/hostir/trace.json", EXIT_OUTPUT, "--trace /proc/hostir/trace.json: cannot write", True),
    ("pipelined_matmul", 1, "--json /tmp", EXIT_OUTPUT, "is a directory, expected a file", True),
    ("pipelined_matmul", 1, "--m 10000000 --n 10000000 --k 1000", EXIT_MEMORY, "GiB per rank", True),
    ("pipelined_matmul", 2, "--m 4000000 --n 4000000 --k 64 --check", EXIT_MEMORY, "shared by 2 ranks", True),
    ("pipelined_matmul", 2, "--timeline run.png", EXIT_DEPENDENCY, "pip install matplotlib", NO_MATPLOTLIB),
    ("pipelined_matmul", 1, "--bench --device cpu", EXIT_NO_DEVICE, "--bench (NCCL, the copy engine and CUDA graphs timed side by side) needs a CUDA GPU", True),
    ("pipelined_matmul", 1, "--graph --device cpu", EXIT_NO_DEVICE, "--graph (CUDA graph capture) needs a CUDA GPU", True),
    ("pipelined_matmul", 2, "--comm nccl --device cpu", EXIT_NO_DEVICE, "--comm nccl needs a CUDA GPU", True),
    ("pipelined_matmul", 1, "--matmul codegen --device cpu", EXIT_NO_DEVICE, "--matmul codegen needs a CUDA GPU", True),
    ("pipelined_matmul", 2, "--device cuda", EXIT_NO_DEVICE, "--device cuda: no CUDA device is visible", NO_CUDA),
    # matmul (one GPU)
    ("matmul", 1, "", EXIT_USAGE, "nothing to do: pass --bench", True),
    ("matmul", 1, "--bench --reps 0", EXIT_USAGE, "argument --reps", True),
    ("matmul", 1, "--bench --shapes 8x8x0", EXIT_USAGE, "every extent must be >= 1", True),
    ("matmul", 2, "--bench", EXIT_WORLD_SIZE, "runs on one GPU in one process, launched with 2 ranks", True),
    ("matmul", 1, "--bench", EXIT_NO_DEVICE, "matmul --bench needs a CUDA GPU", NO_CUDA),
    # layer_norm (one GPU)
    ("layer_norm", 1, "--rows 0", EXIT_USAGE, "argument --rows", True),
    ("layer_norm", 1, "--eps 0", EXIT_USAGE, "argument --eps: expected a number > 0", True),
    ("layer_norm", 1, "--hidden", EXIT_USAGE, "argument --hidden: expected at least one argument", True),
    ("layer_norm", 3, "--check", EXIT_WORLD_SIZE, "launched with 3 ranks", True),
    ("layer_norm", 1, "--check", EXIT_NO_DEVICE, "layer_norm needs a CUDA GPU", NO_CUDA),
    # train_mlp
    ("train_mlp", 3, "", EXIT_WORLD_SIZE, "--tokens 512 do not split into --stages 2 x 3 ranks", True),
    ("train_mlp", 2, "--tokens 7", EXIT_USAGE, "--tokens 7 is not divisible by --stages 2", True),
    ("train_mlp", 2, "--tokens 6", EXIT_WORLD_SIZE, "--tokens 6 do not split into --stages 2 x 2 ranks", True),
    ("train_mlp", 3, "--hidden 256 --ffn-mult 1 --tokens 6 --stages 1", EXIT_WORLD_SIZE, "= 256 does not split over 3 ranks", True),
    ("train_mlp", 1, "--steps 0", EXIT_USAGE, "argument --steps", True),
    ("train_mlp", 2, "--lr -1", EXIT_USAGE, "argument --lr: expected a number > 0", True),
    ("train_mlp", 2, "--bench --dtype float32", EXIT_USAGE, "--bench times bfloat16 only", True),
    ("train_mlp", 2, "--bench --check", EXIT_USAGE, "--check is for a training run", True),
    ("train_mlp", 1, "--json out.json", EXIT_USAGE, "--json is for --bench", True),
    ("train_mlp", 2, "--bench --json benchmarks/results/", EXIT_OUTPUT, "holds GPU results only", True),
    ("train_mlp", 2, "--hidden 100000 --tokens 100000", EXIT_MEMORY, "GiB per rank", True),
    ("train_mlp", 1, "--comm copy_engine --device cpu", EXIT_NO_DEVICE, "--comm copy_engine needs a CUDA GPU", True),
    # fault_injection (the fault tests' job)
    ("fault_injection", 2, "--fault bad_dtype --fault-rank 5", EXIT_WORLD_SIZE, "--fault-rank 5: the job has 2 ranks", True),
    ("fault_injection", 1, "--iters 0", EXIT_USAGE, "argument --iters", True),
]


def _env(extra=None) -> dict:
    e = dict(os.environ)
    for var in ("HOSTIR_DEBUG", "HOSTIR_INJECT_FAULT"):
        e.pop(var, None)
    e.update({
        "PYTHONPATH": f"{ROOT}{os.pathsep}{e.get('PYTHONPATH', '')}",
        "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        "PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe",  # Open MPI 5
        "OMPI_MCA_rmaps_base_oversubscribe": "1",                  # Open MPI 4
    })
    e.update(extra or {})
    return e


def run_job(job: str, ranks: int, flags: str, env=None) -> tuple[int, str]:
    """Exit code and output (stdout and stderr) of one mpirun job; TimeoutExpired on a hang."""
    cmd = ["mpirun", "-np", str(ranks), sys.executable, "-m", "hostir.run", job, *flags.split()]
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(env), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, timeout=TIMEOUT_S)
    return proc.returncode, proc.stdout.decode(errors="replace")


def _case_id(case) -> str:
    job, ranks, flags = case[:3]
    return f"{job}-np{ranks}-{flags.replace(' ', '_').replace('/', '_') or 'defaults'}"


RUNNABLE = [c for c in CASES if c[5]]


@pytest.fixture(scope="module")
def outcomes() -> dict:
    """Every runnable case, run a few at a time; {case id: (exit code, output) or the error}."""
    def one(case):
        try:
            return run_job(*case[:3])
        except subprocess.TimeoutExpired as e:
            return e

    with concurrent.futures.ThreadPoolExecutor(PARALLEL) as pool:
        return dict(zip(map(_case_id, RUNNABLE), pool.map(one, RUNNABLE)))


def test_the_table_is_large_and_covers_every_job_and_world_size():
    assert len(CASES) >= 30
    assert {c[0] for c in CASES} == {"pipelined_matmul", "matmul", "layer_norm", "train_mlp",
                                     "fault_injection"}
    assert {c[1] for c in CASES} == {1, 2, 3}
    assert len(RUNNABLE) >= 30


@pytest.mark.parametrize("case", CASES, ids=map(_case_id, CASES))
def test_a_bad_invocation_ends_every_rank_with_one_line(outcomes, case):
    job, ranks, flags, code, says, runnable = case
    if not runnable:
        pytest.skip("not a mistake on this machine (the device or package is there)")
    result = outcomes[_case_id(case)]
    assert not isinstance(result, subprocess.TimeoutExpired), f"hung: {result}"
    rc, out = result
    assert rc == code, out
    assert "Traceback" not in out, out
    lines = [line for line in out.splitlines() if f"hostir {job}: error: " in line]
    assert len(lines) == ranks, out
    for r in range(ranks):
        mine = [line for line in lines if line.startswith(f"[rank {r}] hostir {job}: error: ")]
        assert len(mine) == 1, out
        assert says in mine[0], out


def test_hostir_debug_shows_the_traceback():
    rc, out = run_job("pipelined_matmul", 1, "--m 10 --stages 4", env={"HOSTIR_DEBUG": "1"})
    assert rc == EXIT_USAGE, out
    assert "Traceback" in out and "UsageError" in out, out
    assert re.search(r"\[rank 0\] hostir pipelined_matmul: error: --m 10 is not divisible", out), out
