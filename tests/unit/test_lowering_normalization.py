import pytest

from hostir import ir
from hostir.errors import ExecutionError, LoweringError
from hostir.parser import parse
from hostir.printer import print_program
from lowering.fusion import DeviceMesh, Fusion, ParallelType
from lowering.kernels.normalization import (
    AddBroadcast, Cast, LayerNorm, NormalizationSpec, spec_from_params, spec_params,
)
from lowering.pipeline import lower


def reference_fusion(rows=64, hidden=5140, dtype="float16"):
    """nvFuser's report: t9 = half(x + b0); t13 = float(t9) + b1; y = half(LN(t13) * w + b2)."""
    fd = Fusion()
    x = fd.define_tensor([rows, hidden], dtype)
    b0, b1, w, b2 = (fd.define_tensor([hidden], dtype) for _ in range(4))
    t9 = fd.add(x, b0)
    t13 = fd.add(fd.cast(t9, "float32"), b1)
    fd.add_output(fd.cast(fd.layer_norm(t13, w, b2, 1e-5), dtype))
    return fd


def test_reference_fusion_becomes_one_launch():
    p = lower(reference_fusion(), 1)
    assert [type(s).__name__ for s in p.body] == ["Allocate", "LaunchKernel"]
    (k,) = p.kernels
    spec = spec_from_params(k.params)
    assert spec == NormalizationSpec(
        64, 5140, LayerNorm(1e-5, True, True, "float16", "float16"), "float16", "float16",
        (AddBroadcast("float16", "T1"), Cast("float16"), AddBroadcast("float16", "T2")), ())
    launch = p.body[1]
    assert launch.kernel == k.name == spec.kernel_name
    assert [t.name for t in launch.args] == ["T0", "T1", "T2", "T3", "T4", p.outputs[0].name]
    assert launch.scalars == (64,) and launch.block[0] % 32 == 0
    assert launch.grid == (spec.plan.grid(64), 1, 1)
    assert launch.smem == spec.plan.dynamic_shared_bytes


def test_persistent_grid_and_staged_params_in_the_launch():
    # 20480: the 1-D tensors do not fit the registers; they are staged in shared memory,
    # which the LaunchKernel carries, and the grid is the resident blocks, not the rows
    p = lower(reference_fusion(8192, 20480), 1)
    (k,) = p.kernels
    spec = spec_from_params(k.params)
    launch = p.body[1]
    assert spec.plan.persistent
    assert launch.grid[0] == spec.plan.grid(8192) < 8192
    assert launch.smem == spec.plan.dynamic_shared_bytes
    text = print_program(p)
    assert print_program(parse(text)) == text


def test_round_trip_with_kernels():
    for fd in (reference_fusion(), reference_fusion(8, 1600, "bfloat16")):
        text = print_program(lower(fd, 1))
        assert "  kernels:\n" in text
        assert print_program(parse(text)) == text


def test_rms_norm_with_fp32_output():
    fd = Fusion()
    x = fd.define_tensor([16, 1024], "bfloat16")
    w = fd.define_tensor([1024], "bfloat16")
    fd.add_output(fd.rms_norm(x, w))
    p = lower(fd, 1)
    spec = spec_from_params(p.kernels[0].params)
    assert spec.output_dtype == "float32" and spec.norm.__class__.__name__ == "RmsNorm"
    assert p.outputs[0].dtype == "float32"


@pytest.mark.parametrize("build,message", [
    (lambda fd, x, b: fd.add_output(fd.add(fd.layer_norm(fd.layer_norm(x)), b)), "one norm"),
    (lambda fd, x, b: fd.add_output(fd.add(x, b)), "no lowering for them"),
    (lambda fd, x, b: (lambda t: fd.add_output(fd.layer_norm(fd.add(t, t))))(fd.add(x, b)),
     "must be a fusion input"),
])
def test_refusals(build, message):
    fd = Fusion()
    x = fd.define_tensor([8, 64], "float16")
    b = fd.define_tensor([64], "float16")
    build(fd, x, b)
    with pytest.raises(LoweringError, match=message):
        lower(fd, 1)


def test_refuses_a_sharded_or_fp32_input():
    fd = Fusion()
    x = fd.define_tensor([8, 64], "float16")
    x.set_mesh(DeviceMesh((0, 1))).split(0, 2).parallelize(0, ParallelType.DIDx)
    fd.add_output(fd.layer_norm(x))
    with pytest.raises(LoweringError):
        lower(fd, 2)
    fd = Fusion()
    x = fd.define_tensor([8, 64], "float32")
    fd.add_output(fd.layer_norm(x))
    with pytest.raises(LoweringError, match="float16 or bfloat16"):
        lower(fd, 1)


def test_spec_params_round_trip():
    for spec in (NormalizationSpec.reference_fusion(8192, 5140),
                 NormalizationSpec.rms_norm(3, 77, dtype="bfloat16", batch=2),
                 NormalizationSpec.layer_norm(5, 768, epilogue=(AddBroadcast("float32", "e"),))):
        assert spec_from_params(spec_params(spec)) == spec
    with pytest.raises(LoweringError, match="cannot read op"):
        spec_from_params(dict(spec_params(NormalizationSpec.layer_norm(5, 768)), prologue="mul:x"))


def test_unknown_kernels_and_cpu_launches_are_refused():
    from runtime.device import CpuBackend
    from runtime.interpreter import Interpreter

    p = lower(reference_fusion(4, 64), 1)
    bad = ir.Program(p.inputs, p.outputs, p.body, kernels=())
    from hostir.errors import VerificationError
    with pytest.raises(VerificationError, match="not among the program's kernels"):
        Interpreter(bad, CpuBackend())
    import torch

    args = [torch.randn(*t.local_shape).half() for t in p.inputs]
    with pytest.raises(ExecutionError, match="CUDA devices only"):
        Interpreter(p, CpuBackend())(*args)


def test_the_kernel_a_program_names_compiles():
    pytest.importorskip("cupy")
    from lowering.kernels.normalization import render_normalization
    from runtime import jit

    p = lower(reference_fusion(8192, 5140), 1)
    spec = spec_from_params(p.kernels[0].params)
    for arch in ("sm_90", "sm_80"):
        ck = jit.compile(render_normalization(spec), [spec.kernel_name], arch)
        assert ck.cubin and max(ck.spill_bytes.values()) == 0


def test_codegen_matmul_is_refused_before_running_on_the_cpu():
    from lowering.patterns import allgather_matmul
    from runtime.device import CpuBackend
    from runtime.interpreter import Interpreter

    p = lower(allgather_matmul(64, 8, 8, 2, 1, "bfloat16"), 1, 2)
    with pytest.raises(ExecutionError, match="--matmul codegen runs fp16/bf16 matmuls on CUDA"):
        Interpreter(p, CpuBackend(), matmul="codegen")
    with pytest.raises(ExecutionError, match="expected one of"):
        Interpreter(p, CpuBackend(), matmul="fastest")


def test_pinned_plan_round_trips_through_the_kernels_header():
    import dataclasses

    fd = Fusion()
    x = fd.define_tensor([64, 16384], "float16")
    w = fd.define_tensor([16384], "float16")
    fd.add_output(fd.rms_norm(x, w))
    p = lower(fd, 1)
    spec = spec_from_params(p.kernels[0].params)
    pinned = dataclasses.replace(spec, threads_per_row=512, batch=8, rows_per_block=1,
                                 param_cache="shared", prefetch=True, x_staged=True)
    kernel = ir.KernelDef(pinned.kernel_name, "normalization", spec_params(pinned))
    launch = dataclasses.replace(p.body[1], kernel=pinned.kernel_name,
                                 smem=pinned.plan.dynamic_shared_bytes)
    text = print_program(dataclasses.replace(p, kernels=(kernel,), body=(p.body[0], launch)))
    assert "param_cache=shared, prefetch=true, x_staged=true" in text
    q = parse(text)
    assert spec_from_params(q.kernels[0].params) == pinned
    assert print_program(q) == text


def test_a_plan_chooser_pins_the_plan_the_program_prints_and_runs():
    # e.g. functools.partial(runtime.normalization.choose, device_index=0): the autotuner's
    # stored winner; here a tuner candidate that is not the heuristic's pick
    from lowering.kernels.normalization import spec_with_plan, tune_plans

    seen = []

    def chooser(spec):
        seen.append(spec)
        other = next(p for p in tune_plans(spec) if p != spec.plan and p.persistent)
        return spec_with_plan(spec, other)

    p = lower(reference_fusion(8192, 1600), 1, normalization_plan=chooser)
    (base,) = seen
    assert not any(getattr(base, f) is not None for f in ("threads_per_row", "batch"))
    spec = spec_from_params(p.kernels[0].params)
    assert spec.plan != base.plan and spec == chooser(base)
    launch = p.body[1]
    assert launch.kernel == spec.kernel_name
    assert launch.grid == (spec.plan.grid(8192), 1, 1)
    assert launch.block == (spec.plan.block_threads, 1, 1)
    assert launch.smem == spec.plan.dynamic_shared_bytes
    text = print_program(p)
    assert f"threads_per_row={spec.plan.threads_per_row}" in text
    assert print_program(parse(text)) == text
    assert spec_from_params(parse(text).kernels[0].params) == spec
    # without a chooser: the heuristic's plan, nothing pinned
    assert spec_from_params(lower(reference_fusion(8192, 1600), 1).kernels[0].params) == base


@pytest.mark.parametrize("bad", [
    lambda s: s.__class__(s.rows, s.hidden + 8, s.norm, s.input_dtype, s.output_dtype,
                          s.prologue, s.epilogue),
    lambda s: None,
])
def test_a_plan_chooser_may_not_change_the_problem(bad):
    with pytest.raises(LoweringError, match="plan chooser"):
        lower(reference_fusion(64, 1600), 1, normalization_plan=bad)
