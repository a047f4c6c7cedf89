"""Normalization kernels without a GPU: spec checks, heuristics, NVRTC compiles, reference math."""

from __future__ import annotations

import dataclasses

import pytest

from hostir.errors import LoweringError
from lowering.kernels.normalization import (
    AddBroadcast,
    Cast,
    LayerNorm,
    NormalizationSpec,
    RmsNorm,
    candidate_plans,
    render_normalization,
    vector_width_for,
)

BENCH_HIDDEN = (768, 1024, 1280, 1536, 1600, 2048, 2560, 4096, 5140, 12288, 16384, 20480)
ODD_HIDDEN = (1, 77, 1601, 5141, 3000)
VARIANTS = {
    "fused": NormalizationSpec.reference_fusion,
    "layer_norm": NormalizationSpec.layer_norm,
    "rms_norm": NormalizationSpec.rms_norm,
}


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(rows=0), "rows"),
        (dict(hidden=-3), "hidden"),
        (dict(input_dtype="float32"), "input_dtype"),
        (dict(output_dtype="int8"), "output_dtype"),
        (dict(norm="layer_norm"), "norm"),
        (dict(prologue=[Cast("float16")]), "tuple"),
        (dict(prologue=("add",)), "AddBroadcast or Cast"),
        (dict(prologue=(AddBroadcast(name="x"),)), "repeat"),
        (dict(alignment=12), "power of two"),
        (dict(threads_per_row=100), "warp-multiple"),
        (dict(hidden=40000), "persistent"),
        (dict(rows=2**31), "rows"),
    ],
)
def test_spec_refuses_bad_fields(kwargs, message):
    base = dict(rows=8, hidden=1024, norm=LayerNorm())
    with pytest.raises(LoweringError, match=message):
        NormalizationSpec(**{**base, **kwargs})


@pytest.mark.parametrize("make, message", [
    (lambda: LayerNorm(eps=0.0), "eps"),
    (lambda: RmsNorm(eps=float("nan")), "eps"),
    (lambda: Cast("int32"), "Cast.dtype"),
    (lambda: AddBroadcast(dtype="float64"), "AddBroadcast.dtype"),
    (lambda: AddBroadcast(name="1x"), "identifier"),
])
def test_ops_refuse_bad_fields(make, message):
    with pytest.raises(LoweringError, match=message):
        make()


def test_reference_fusion_parameters():
    spec = NormalizationSpec.reference_fusion(8192, 1024)
    assert spec.parameter_names() == ("x", "b0", "b1", "weight", "bias", "y")
    assert spec.parameter_dtypes() == ("float16",) * 6
    assert spec.bytes_moved() == 2 * 8192 * 1024 * 2 + 4 * 1024 * 2
    assert NormalizationSpec.rms_norm(4, 64).parameter_names() == ("x", "weight", "y")


# --------------------------------------------------------------------------- heuristics


@pytest.mark.parametrize("hidden", BENCH_HIDDEN + ODD_HIDDEN)
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_plan_is_warp_multiple_and_covers_row(hidden, variant):
    plan = VARIANTS[variant](8192, hidden).plan
    assert plan.threads_per_row % 32 == 0
    assert plan.block_threads % 32 == 0 and plan.block_threads <= 1024
    vectors = -(-hidden // plan.vector_width)
    assert plan.threads_per_row * plan.batch >= vectors
    assert (plan.batch - 1) * plan.threads_per_row < vectors  # no batch slot empty everywhere
    assert plan.batch * plan.vector_width <= 32


@pytest.mark.parametrize("hidden, width", [
    (768, 8), (1600, 8), (20480, 8), (5140, 4), (1601, 1), (77, 1), (3000, 8), (1026, 2),
])
def test_vector_width_is_16_bytes_where_rows_stay_aligned(hidden, width):
    assert NormalizationSpec.layer_norm(16, hidden).plan.vector_width == width


def test_vector_width_follows_pointer_alignment():
    assert NormalizationSpec.layer_norm(16, 4096, alignment=4).plan.vector_width == 2
    # an fp32 tensor in the fusion halves the elements a 16-byte access holds
    assert vector_width_for(4096, (2, 4, 2), 16) == 4


@pytest.mark.parametrize("hidden", [768, 1024])
def test_short_rows_share_a_block(hidden):
    for plan in candidate_plans(hidden, 8, 2):
        assert plan.block_threads >= 128 or plan.threads_per_row >= 128


def test_large_rows_keep_batch_small_and_fit_registers():
    plan = NormalizationSpec.reference_fusion(8192, 20480).plan
    assert plan.batch * plan.vector_width <= 32
    assert plan.register_estimate * plan.block_threads <= 65536


def test_row_loop_is_not_unrolled_and_accesses_are_16_bytes():
    src = render_normalization(NormalizationSpec.reference_fusion(8192, 4096))
    loop = src.index("for (int group")
    assert src[:loop].rstrip().endswith("#pragma unroll 1")
    assert "Vec<unsigned short, kVec>" in src and "constexpr int kVec = 8" in src
    assert "#include" not in src


def test_odd_sizes_are_predicated():
    src = render_normalization(NormalizationSpec.layer_norm(8192, 5140))
    assert "vec < kVectors" in src and "constexpr int kVec = 4" in src


# --------------------------------------------------------------------------- compiles


def _compile(spec, arch):
    pytest.importorskip("cupy")
    from runtime import jit

    return jit.compile(render_normalization(spec), [spec.kernel_name], arch)


@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("hidden", BENCH_HIDDEN + ODD_HIDDEN)
def test_every_variant_compiles_without_spills(arch, variant, hidden):
    spec = VARIANTS[variant](8192, hidden)
    ck = _compile(spec, arch)
    name = spec.kernel_name
    assert ck.spill_bytes.get(name, 0) == 0, ck.log
    assert ck.local_bytes.get(name, 0) == 0, ck.log
    # the plan's estimate is what ptxas uses, within a few registers either way
    assert ck.registers[name] <= spec.plan.register_estimate + 8
    assert ck.registers[name] * spec.plan.block_threads <= 65536


@pytest.mark.parametrize("hidden", [768, 5140, 16384, 20480])
def test_every_candidate_plan_compiles_without_spills(hidden):
    spec = NormalizationSpec.reference_fusion(8192, hidden)
    for cand in candidate_plans(hidden, spec.plan.vector_width, 2):
        s = dataclasses.replace(spec, threads_per_row=cand.threads_per_row, batch=cand.batch)
        ck = _compile(s, "sm_90")
        assert ck.spill_bytes.get(s.kernel_name, 0) == 0, (cand, ck.log)
        assert ck.registers[s.kernel_name] <= cand.register_estimate + 8, cand


def test_bf16_and_epilogue_compile():
    spec = NormalizationSpec(
        64, 2048, RmsNorm(weight_dtype="float32"), input_dtype="bfloat16", output_dtype="float32",
        prologue=(AddBroadcast("bfloat16", "residual"),), epilogue=(Cast("bfloat16"), AddBroadcast("float32", "shift")),
    )
    ck = _compile(spec, "sm_90")
    assert ck.spill_bytes.get(spec.kernel_name, 0) == 0


# --------------------------------------------------------------------------- reference math


def test_reference_matches_torch_layer_norm_and_keeps_rounding():
    torch = pytest.importorskip("torch")
    from runtime.normalization import reference

    g = torch.Generator().manual_seed(1)
    x = (torch.randn(64, 1600, generator=g) + 300.0).half()  # large mean: two-pass territory
    b0, b1, w, b2 = (torch.randn(1600, generator=g).half() for _ in range(4))
    spec = NormalizationSpec.reference_fusion(64, 1600)
    got = reference(spec, {"x": x, "b0": b0, "b1": b1, "weight": w, "bias": b2})
    t9 = (x.double() + b0.double()).half()  # the cast rounds: it is part of the function
    want = torch.nn.functional.layer_norm(t9.double() + b1.double(), (1600,), w.double(), b2.double(), 1e-5)
    assert torch.allclose(got, want, rtol=0, atol=1e-9)
    unrounded = torch.nn.functional.layer_norm(x.double() + b0.double() + b1.double(), (1600,),
                                               w.double(), b2.double(), 1e-5)
    assert not torch.allclose(got, unrounded, rtol=0, atol=1e-6)


def test_reference_rms_norm_in_float32_is_close_to_float64():
    torch = pytest.importorskip("torch")
    from runtime.normalization import reference

    x = (torch.randn(32, 5140) * 3 + 50).half()
    w = torch.randn(5140).half()
    spec = NormalizationSpec.rms_norm(32, 5140)
    a = reference(spec, {"x": x, "weight": w}, torch.float32).double()
    b = reference(spec, {"x": x, "weight": w})
    assert float((a - b).norm() / b.norm()) < 1e-6
