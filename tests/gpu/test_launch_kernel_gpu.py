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


@pytest.mark.parametrize("rows", [1031, 3])
def test_cluster_plan_program_matches_float64(rows):
    """A plain layer norm too wide for one block (40000 values, bf16) lowers to the
    envelope kernel split over a cluster; its LaunchKernel re-sizes the nominal grid to the
    clusters this device holds (also with fewer rows than clusters) and launches without
    the dependent launch: every row against float64."""
    pytest.importorskip("cupy")
    from lowering.kernels.normalization import spec_from_params
    from runtime.device import CudaBackend
    from runtime.interpreter import Interpreter

    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("thread-block clusters need an sm_90 part")
    hidden = 40000
    fd = Fusion()
    x = fd.define_tensor([rows, hidden], "bfloat16")
    w, b = (fd.define_tensor([hidden], "bfloat16") for _ in range(2))
    fd.add_output(fd.cast(fd.layer_norm(x, w, b, 1e-5), "bfloat16"))
    p = lower(fd, 1)
    (defn,) = p.kernels
    assert spec_from_params(defn.params).plan.cluster > 1
    run = Interpreter(p, CudaBackend())
    g = torch.Generator(device="cuda").manual_seed(rows)
    xs = (torch.randn(rows, hidden, device="cuda", generator=g) * 3 + 5).bfloat16()
    ws, bs = (torch.randn(hidden, device="cuda", generator=g).bfloat16() for _ in range(2))
    run.prepare(xs, ws, bs)
    for _ in range(2):
        (y,) = run(xs, ws, bs)
        ref = torch.nn.functional.layer_norm(xs.double(), (hidden,), ws.double(), bs.double(),
                                             1e-5)
        assert torch.isfinite(y).all()
        rows_err = (y.double() - ref).norm(dim=1) / ref.norm(dim=1)
        assert rows_err.max() < 1e-2, rows_err.argmax().item()


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


class _OneRank:
    """The communicator of a world of one: a reduce-scatter is a copy on the stream."""

    name, rank, world_size = "one", 0, 1

    class _Done:
        def wait(self, stream):
            pass

    def agree(self, obj):
        return [obj]

    def reduce_scatter(self, out, inp, op, stream):
        out.copy_(inp)  # on the current stream: the program's stage stream
        return self._Done()


@pytest.mark.parametrize("kind", ["rms_norm", "layer_norm"])
def test_stage_norm_program_matches_float64(kind):
    """GEMM+ReduceScatter with each stage's residual add + norm (the seam kernel launched
    by ``LaunchKernel`` on the stage's worker stream) against float64, host never
    blocked."""
    pytest.importorskip("cupy")
    from lowering.passes.stage_norm import fuse_stage_norm
    from lowering.patterns import matmul_reduce_scatter
    from runtime.device import CudaBackend
    from runtime.interpreter import Interpreter

    m, k, n, stages = 1024, 512, 4096, 2
    p = fuse_stage_norm(lower(matmul_reduce_scatter(m, k, n, stages, 1, "bfloat16"), 1, 2, 0,
                              schedule="pipelined"), kind, 1e-5, kind == "layer_norm")
    run = Interpreter(p, CudaBackend(), _OneRank())
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(m, k, device="cuda", generator=g).bfloat16()
    b = (torch.randn(k, n, device="cuda", generator=g) / k ** 0.5).bfloat16()
    residual = torch.randn(m, n, device="cuda", generator=g).bfloat16()
    w, bias = (torch.randn(n, device="cuda", generator=g).bfloat16() for _ in range(2))
    args = [a.view(p.inputs[0].local_shape), b.view(p.inputs[1].local_shape),
            residual.view(stages, -1, n), w] + ([bias] if kind == "layer_norm" else [])
    run.prepare(*args)
    torch.cuda.set_sync_debug_mode("error")
    try:
        _, y, h, *stats = run(*args)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    h64 = (a.double() @ b.double()).bfloat16().double() + residual.double()
    hf = h64 - h64.mean(-1, keepdim=True) if kind == "layer_norm" else h64
    ref = hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + 1e-5) * w.double()
    if kind == "layer_norm":
        ref = ref + bias.double()
    for got, want in ((h.view(m, n), h64), (y.view(m, n), ref)):
        err = float((got.double() - want).norm() / want.norm())
        assert torch.isfinite(got).all() and err < 1e-2, err
