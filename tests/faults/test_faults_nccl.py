"""The fault scenarios of test_faults.py under NCCL on 2 GPUs (skipped without them).

Each scenario is an ``mpirun -np 2`` job of ``hostir.run fault_injection --device cuda``
(NCCL bootstrapped by MPI, HOSTIR_COMM_TIMEOUT=10). Each job goes to the fault matrix
(``matrix.py``), written with HOSTIR_FAULTS_JSON=benchmarks/results/faults_<device>_x2.json
(docs/RELIABILITY.md, "Fault matrix").
"""

from __future__ import annotations

import re

import pytest
import torch

from tests.faults.test_faults import MATMUL_OF_STAGE_1, SELECT_OF_STAGE_1, TIMEOUT_S, mpirun

pytestmark = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")

NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
            "NVSHMEM_DISABLE_NVLS": "1"}


def _ring_statements() -> tuple[int, int]:
    """(statements a call, index of the first SendRecv) of the ring AllGather+GEMM the
    fault job runs (its defaults: 64x32x16, 2 stages, 2 streams, 2 ranks), counted the
    way HOSTIR_INJECT_FAULT counts them (FOR bodies once an iteration)."""
    from hostir import ir
    from lowering.patterns import allgather_matmul
    from lowering.pipeline import lower

    seq: list = []

    def run(body):
        for st in body:
            seq.append(st)
            if isinstance(st, ir.ForLoop):
                for _ in range(st.start, st.stop):
                    run(st.body)

    run(lower(allgather_matmul(64, 32, 16, 2, 2, "float32"), 2, 2, 0, schedule="ring").body)
    first = next(i for i, st in enumerate(seq) if isinstance(st, ir.Communication))
    return len(seq), first


RING_STATEMENTS, RING_FIRST_SENDRECV = _ring_statements()
# name: (flags, HOSTIR_INJECT_FAULT, what every rank's output must name)
SCENARIOS = {
    "healthy": ((), None, r"rank 1: ok"),
    "exception_mid_program": ((), f"1:{MATMUL_OF_STAGE_1}:raise",
                              r"\[rank 1\] .*ExecutionError: rank 1: while executing "
                              r"`T6 = matmul\(T5, T1\)`"),
    "rank_killed": ((), f"1:{SELECT_OF_STAGE_1}:kill",
                    r"\[rank 1\] hostir: injected fault 'kill' before statement \d+ `T4 = select"),
    "rank_exits": ((), f"1:{SELECT_OF_STAGE_1}:exit",
                   r"\[rank 1\] hostir: injected fault 'exit' before statement \d+ `T4 = select"),
    "rank_stuck": ((), f"1:{SELECT_OF_STAGE_1}:hang",
                   r"\[rank 0\] hostir: CommTimeoutError: rank 0: NCCL Allgather of \d+ bytes "
                   r"did not complete within 10 s"),
    # The ring over the copy engine: rank 1 stops in its second call (the first set up
    # the symmetric buffers) just before its first SendRecv; rank 0's stream waits in a
    # stream-memory barrier that nothing times out but the watchdog.
    "rank_stuck_copy_engine": (("--schedule", "ring"),
                               f"1:{RING_STATEMENTS + RING_FIRST_SENDRECV}:hang",
                               r"\[rank 0\] hostir: CommTimeoutError: rank 0: NCCL copy-engine "
                               r"SendRecv of \d+ bytes did not complete within 10 s"),
    "divergent_shapes": (("--fault", "divergent_shape"), None,
                         r"InputMismatchError: rank 0: inputs differ between ranks"),
    "bad_dtype": (("--fault", "bad_dtype"), None,
                  r"InputMismatchError: rank 0: rank 1 refused its inputs: input T1: expected "
                  r"dtype float32, got torch.float64"),
    "non_dividing_shape": (("--m", "10", "--stages", "4"), None,
                           r"LoweringError: tensor T0 \(A\) axis 0: extent M=10 is not divisible"),
}



@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_fault_under_nccl(name):
    flags, inject, expect = SCENARIOS[name]
    env = dict(NCCL_ENV)
    if inject:
        env["HOSTIR_INJECT_FAULT"] = inject
    comm = "copy_engine" if name.endswith("copy_engine") else "nccl"
    rc, out, took = mpirun(2, *flags, env=env, device="cuda", comm=comm,
                           fault=name.replace("_", " ").removesuffix(" copy engine"))
    assert re.search(expect, out), out
    if name == "healthy":
        assert rc == 0, out
        return
    assert rc != 0, out
    assert took < TIMEOUT_S + 30, (took, out)
    if name.startswith("rank_stuck"):  # the watchdog wrote the flight record and names it
        assert "flight records in " in out, out
