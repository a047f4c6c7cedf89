"""Generated kernels run from host programs: LaunchKernel of a normalization fusion, and
Matmul statements on the generated split-K kernel (--matmul codegen/auto). Skips without
CUDA."""

import pytest
import torch

from lowering.fusion import Fusion
from lowering.pipeline import lower

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _reference_fusion(rows, hidden, dtype):
    fd = Fusion()
    x = fd.define_tensor([rows, hidden], dtype)
    b0, b1, w, b2 = (fd.define_tensor([hidden], dtype) for _ in range(4))
    t13 = fd.add(fd.cast(fd.add(x, b0), "float32"), b1)
    fd.add_output(fd.cast(fd.layer_norm(t13, w, b2, 1e-5), dtype))
    return fd


# 16384, 20480: the persistent kernel with its 1-D tensors staged in over 48 KiB of
# shared memory (the launcher opts in) and a grid re-sized to the device's SMs
@pytest.mark.parametrize("rows,hidden,dtype", [(512, 5140, "float16"), (300, 1024, "bfloat16"),
                                               (700, 16384, "float16"), (300, 20480, "bfloat16")])
def test_normalization_program_matches_float64(rows, hidden, dtype):
    pytest.importorskip("cupy")
    from runtime.device import CudaBackend
    from runtime.interpreter import Interpreter

    p = lower(_reference_fusion(rows, hidden, dtype), 1)
    run = Interpreter(p, CudaBackend())
    dt = getattr(torch, dtype)
    x = (torch.randn(rows, hidden, device="cuda") * 3 + 5).to(dt)   # large row means too
    b0, b1, w, b2 = (torch.randn(hidden, device="cuda").to(dt) for _ in range(4))
    run.prepare(x, b0, b1, w, b2)
    torch.cuda.set_sync_debug_mode("error")
    try:
        (y,) = run(x, b0, b1, w, b2)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    t9 = (x.double() + b0.double()).to(dt).double()
    t13 = t9 + b1.double()
    ref = torch.nn.functional.layer_norm(t13, (hidden,), w.double(), b2.double(), 1e-5)
    err = float((y.double() - ref).norm() / ref.norm())
    assert torch.isfinite(y).all() and err < 1e-2, err


def test_normalization_program_runs_the_stored_winner(tmp_path):
    """A program lowered with ``normalization_plan=choose`` on this device names and runs
    the plan the autotuner stored (here stored by hand: a twin of the heuristic's pick)."""
    pytest.importorskip("cupy")
    import dataclasses
    import functools

    from hostir.options import options, set_options
    from lowering.kernels.normalization import PLAN_FIELDS, spec_from_params, tune_plans
    from runtime import autotune
    from runtime import normalization as rn
    from runtime.device import CudaBackend
    from runtime.interpreter import Interpreter

    saved = options()
    set_options(dataclasses.replace(saved, cache_dir=tmp_path))
    rn.clear_caches()
    try:
        rows, hidden, dev = 1000, 1600, torch.cuda.current_device()
        heuristic = spec_from_params(lower(_reference_fusion(rows, hidden, "float16"), 1)
                                     .kernels[0].params)
        twin = next(p for p in tune_plans(heuristic) if p != heuristic.plan and p.persistent)
        autotune.store_entry(rn._tune_key(heuristic, dev), {
            "plan": {f: getattr(rn.spec_with_plan(heuristic, twin), f) for f in PLAN_FIELDS},
            "describe": twin.describe()})
        p = lower(_reference_fusion(rows, hidden, "float16"), 1,
                  normalization_plan=functools.partial(rn.choose, device_index=dev))
        assert spec_from_params(p.kernels[0].params).plan == twin
        run = Interpreter(p, CudaBackend())
        x = (torch.randn(rows, hidden, device="cuda") * 3 + 5).half()
        b0, b1, w, b2 = (torch.randn(hidden, device="cuda").half() for _ in range(4))
        run.prepare(x, b0, b1, w, b2)
        (y,) = run(x, b0, b1, w, b2)
        ref = rn.reference(heuristic, dict(zip(heuristic.parameter_names()[:-1],
                                               (x, b0, b1, w, b2))))
        err = float((y.double() - ref).norm() / ref.norm())
        assert torch.isfinite(y).all() and err < 1e-2, err
    finally:
        set_options(saved)
        rn.clear_caches()


@pytest.mark.parametrize("mode", ["codegen", "auto"])
def test_pipelined_program_on_the_generated_matmul(mode):
    pytest.importorskip("cupy")
    from lowering.patterns import allgather_matmul, shard_rows
    from runtime.session import Session

    session = Session("cuda", "nccl")
    m, k, n = 1024, 512, 768
    p = lower(allgather_matmul(m, k, n, 2, 1, "bfloat16"), 1, 2)
    from runtime.interpreter import Interpreter

    run = Interpreter(p, session.backend, session.comm, matmul=mode)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    run.prepare(shard_rows(a, 2, 1, 0), b)
    if mode == "auto":
        assert set(run.matmul.measured.values()) <= {"cublas", "codegen"}
        assert len(run.matmul.measured) == 1
    (out,) = run(shard_rows(a, 2, 1, 0), b)
    ref = a.double() @ b.double()
    assert float((out.reshape(m, n).double() - ref).norm() / ref.norm()) < 1e-2
