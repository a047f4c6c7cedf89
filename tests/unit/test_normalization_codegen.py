"""Normalization kernels without a GPU: spec checks, heuristics, NVRTC compiles, reference math."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from hostir.errors import LoweringError
from lowering.kernels.normalization import (
    AddBroadcast,
    Cast,
    LayerNorm,
    NormalizationSpec,
    RmsNorm,
    DEFAULT_SM_COUNT,
    SM90,
    MAX_ENVELOPE_CHUNKS,
    LaunchPlan,
    candidate_plans,
    persistent_candidates,
    persistent_register_estimate,
    plan_launch,
    render_normalization,
    spec_from_params,
    spec_params,
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
        (dict(hidden=40000, shared_row=False), "persistent"),
        (dict(hidden=40000, shared_row=True, threads_per_row=128), "no shared-row plan"),
        (dict(hidden=4096, shared_row=True, param_cache="registers"), "its own kernel"),
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
    if plan.shared_row:  # one row a block, 16-byte chunks of it (test_normalization_sweep)
        assert plan.block_threads % 32 == 0 and plan.block_threads <= 1024
        slots = -(-plan.row_chunks // plan.threads_per_row)
        assert (slots - 1) * plan.threads_per_row < plan.row_chunks
        return
    if plan.envelope:  # the row's 16-byte chunks, `batch` of them a thread of each CTA
        assert plan.threads_per_row % 32 == 0 and plan.block_threads <= 1024
        per_cta = plan.threads_per_row * plan.batch
        assert plan.cluster * per_cta >= plan.row_chunks
        share = -(-plan.row_chunks // plan.cluster)
        assert (plan.batch - 1) * plan.threads_per_row < share
        assert (plan.cluster - 1) * per_cta < -(-hidden // 8)  # no CTA without chunks
        assert plan.cluster == 1 or plan.rows_per_block == 1
        assert plan.batch <= MAX_ENVELOPE_CHUNKS
        return
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
    """The register families' vectors; rows that allow them under 8 bytes take the
    envelope kernel by default (16-byte chunks at any alignment) from 512 values
    (`ENVELOPE_LAYER_MIN` for layer norms)."""
    plan = NormalizationSpec.layer_norm(16, hidden, shared_row=False).plan
    assert plan.vector_width == width
    if width * 2 < 8 and hidden >= 512:
        assert NormalizationSpec.rms_norm(16, hidden).plan.envelope
        assert NormalizationSpec.layer_norm(16, hidden).plan.envelope
    elif width * 2 < 8:
        assert not NormalizationSpec.layer_norm(16, hidden).plan.envelope


def test_vector_width_follows_pointer_alignment():
    assert NormalizationSpec.layer_norm(16, 4096, alignment=4, shared_row=False).plan.vector_width == 2
    assert NormalizationSpec.rms_norm(16, 4096, alignment=4).plan.envelope
    # a layer norm's rows of 4- and 2-byte vectors take the envelope kernel from 512
    # values (`ENVELOPE_LAYER_MIN`)
    assert NormalizationSpec.layer_norm(16, 500, alignment=4).plan.vector_width == 2
    assert NormalizationSpec.layer_norm(16, 512, alignment=4).plan.envelope
    assert NormalizationSpec.layer_norm(16, 512, alignment=2).plan.envelope
    assert NormalizationSpec.layer_norm(16, 504, alignment=2).plan.vector_width == 1
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
    src = render_normalization(NormalizationSpec.layer_norm(8192, 5140, shared_row=False))
    assert "vec < kVectors" in src and "constexpr int kVec = 4" in src
    # the shared-row kernel: the first and last chunks of a row masked to [lo, hi)
    src = render_normalization(NormalizationSpec.layer_norm(8192, 5141, shared_row=True))
    assert "e >= lo && e < hi" in src and "constexpr bool kRowsAligned = false" in src


# --------------------------------------------------------------------------- persistent kernel


@pytest.mark.parametrize("hidden", [512, 768, 1024])
def test_one_warp_rows_default_to_the_rowwise_kernel(hidden):
    # rule 0 of plan_launch: a row one warp covers runs the row-wise kernel, 4 rows a block
    plan = NormalizationSpec.reference_fusion(8192, hidden).plan
    assert not plan.persistent and plan.threads_per_row == 32 and plan.rows_per_block == 4
    assert plan.grid(8192) == 8192 // 4
    # pinning the persistent kernel still gives one
    assert NormalizationSpec.reference_fusion(8192, hidden, param_cache="shared").plan.persistent


@pytest.mark.parametrize("hidden", [h for h in BENCH_HIDDEN if h > 1024])
def test_default_plan_is_persistent_with_a_resident_grid(hidden):
    plan = NormalizationSpec.reference_fusion(8192, hidden).plan
    assert plan.persistent and plan.param_cache in ("registers", "shared", "global")
    groups = -(-8192 // plan.rows_per_block)
    assert plan.grid(8192) == min(groups, DEFAULT_SM_COUNT * plan.min_blocks_per_sm)
    assert plan.grid(8192, sm_count=78) == min(groups, 78 * plan.min_blocks_per_sm)
    assert plan.grid(3) == 1 or plan.rows_per_block < 3  # never more blocks than groups
    assert plan.block_threads % 32 == 0
    # the blocks counted on fit an SM: registers, threads, shared memory
    need = -(-(plan.register_estimate + 8) // 8) * 8
    assert plan.min_blocks_per_sm * plan.block_threads * need <= 65536
    assert plan.min_blocks_per_sm * plan.block_threads <= 2048
    assert plan.min_blocks_per_sm * (plan.dynamic_shared_bytes + plan.shared_bytes) <= 228 * 1024


@pytest.mark.parametrize("hidden", [h for h in BENCH_HIDDEN if h > 1024])
def test_balanced_grid_takes_no_more_rounds_and_fewest_blocks(hidden):
    plan = NormalizationSpec.reference_fusion(8192, hidden).plan
    groups = -(-8192 // plan.rows_per_block)
    resident = plan.grid(8192, 132, balanced=False)
    balanced = plan.grid(8192, 132, balanced=True)
    rounds = -(-groups // resident)
    assert balanced <= resident and -(-groups // balanced) == rounds
    assert balanced == 1 or -(-groups // (balanced - 1)) > rounds  # one block fewer: a round more
    assert plan.grid(8192, 132) == resident  # measured slower: off by default
    switched = dataclasses.replace(plan, balanced_grid=True)
    assert switched.grid(8192, 132) == balanced and switched.grid(8192, 132, balanced=False) == resident


def test_grid_follows_the_blocks_the_driver_reports():
    plan = NormalizationSpec.reference_fusion(8192, 1536).plan
    assert plan.persistent
    groups = 8192 // plan.rows_per_block
    assert plan.grid(8192, 132, blocks_per_sm=7) == min(groups, 132 * 7)
    assert plan.grid(8192, 132, blocks_per_sm=None) == plan.grid(8192)


def test_resident_blocks_falls_back_to_the_plan_without_a_driver():
    import types

    pytest.importorskip("cupy")
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("checks the fallback; the GPU tests cover the driver's answer")
    from runtime import normalization as rn

    plan = NormalizationSpec.reference_fusion(8192, 4096).plan
    kernel = types.SimpleNamespace(function=types.SimpleNamespace(ptr=0), ensure_smem=lambda n: None)
    assert rn.resident_blocks(kernel, plan) == plan.min_blocks_per_sm


def test_rowwise_plan_keeps_one_block_per_group():
    plan = NormalizationSpec.reference_fusion(8192, 4096, param_cache="none").plan
    assert not plan.persistent and not plan.prefetch
    assert plan.grid(8192) == 8192 // plan.rows_per_block


def test_param_cache_register_estimate():
    # four fp16 tensors cached packed: 2 bytes x 4 / 4 bytes a register = 2 registers a value
    reg = persistent_register_estimate(16, 8, 2, 8, prefetch=False)
    none = persistent_register_estimate(16, 8, 2, 0, prefetch=False)
    assert reg - none == 16 * 8 // 4
    # the prefetched next row is packed x: half a register a value
    assert persistent_register_estimate(16, 8, 2, 8, prefetch=True) - reg == 8
    fused = NormalizationSpec.reference_fusion(8192, 4096, threads_per_row=256, batch=2,
                                               param_cache="registers", prefetch=False).plan
    rms = NormalizationSpec.rms_norm(8192, 4096, threads_per_row=256, batch=2,
                                     param_cache="registers", prefetch=False).plan
    assert fused.param_bytes == 8 and rms.param_bytes == 2
    assert fused.register_estimate - rms.register_estimate == 16 * (8 - 2) // 4
    # staged in shared memory: no registers for them, shared memory for every slot
    shared = NormalizationSpec.reference_fusion(8192, 4096, threads_per_row=256, batch=2,
                                                param_cache="shared", prefetch=False).plan
    assert shared.register_estimate < fused.register_estimate
    assert shared.dynamic_shared_bytes == 8 * 4096 and fused.dynamic_shared_bytes == 0


def test_cached_params_are_loaded_once_before_the_row_loop():
    src = render_normalization(NormalizationSpec.reference_fusion(
        8192, 2048, threads_per_row=128, batch=2, param_cache="registers", prefetch=True))
    loop = src.index("for (int group")
    for name in ("b0", "b1", "weight", "bias"):
        assert src.index(f"in_{name})") < loop  # the only read of each 1-D tensor
        assert src.count(f"in_{name})") == 1
    assert src.count("__ldcs(&") == 1 and src.count("load_row(") == 3  # helper, first, next
    body = src[loop:]
    assert "opaque(c_b0[i].raw)" in body  # the conversions stay inside the loop
    shared = render_normalization(NormalizationSpec.reference_fusion(
        8192, 2048, threads_per_row=128, batch=2, param_cache="shared", prefetch=False))
    assert "extern __shared__" in shared and "__syncthreads();\n" in shared
    assert shared.index("s_b0[j].raw") < shared.index("for (int group")


@pytest.mark.parametrize("cache, prefetch", [("registers", True), ("registers", False),
                                             ("shared", True), ("shared", False)])
def test_predication_at_5140(cache, prefetch):
    spec = NormalizationSpec.reference_fusion(8192, 5140, threads_per_row=448, batch=3,
                                              param_cache=cache, prefetch=prefetch)
    plan = spec.plan
    assert plan.vector_width == 4  # 5140 x 2 bytes is not a multiple of 16
    vectors = 5140 // 4
    assert vectors % plan.threads_per_row and plan.batch * plan.threads_per_row > vectors
    src = render_normalization(spec)
    assert "constexpr int kFullBatches = 2;" in src and "vec < kVectors" in src
    assert "v[i][e] = ok ? a : 0.f;" in src  # padded slots add nothing to the sums
    if cache == "shared":
        assert "if (j < kVectors)" in src


def _covered(plan, rows, hidden, grid):
    """Emulates the persistent kernel's index math: how often each (row, element) is
    read and written over the grid-stride loop, the rows of a block and the batch slots."""
    import numpy as np

    count = np.zeros((rows, hidden), dtype=np.int64)
    vectors = -(-hidden // plan.vector_width)
    full = vectors // plan.threads_per_row
    groups = -(-rows // plan.rows_per_block)
    for block in range(grid):
        for tid in range(plan.block_threads):
            lane, rib = tid % plan.threads_per_row, tid // plan.threads_per_row
            for group in range(block, groups, grid):
                row = group * plan.rows_per_block + rib
                if row >= rows:
                    continue
                for i in range(plan.batch):
                    vec = i * plan.threads_per_row + lane
                    if i < full or vec < vectors:
                        count[row, vec * plan.vector_width:(vec + 1) * plan.vector_width] += 1
    return count


@pytest.mark.parametrize("hidden, rows, kw", [
    (5140, 37, dict(threads_per_row=448, batch=3)),
    (768, 301, dict()),
    (77, 9, dict()),
    (1600, 50, dict(threads_per_row=64, batch=4)),
])
def test_grid_stride_covers_every_element_once(hidden, rows, kw):
    spec = NormalizationSpec.reference_fusion(rows, hidden, **kw)
    plan = spec.plan
    for grid in (1, 3, plan.grid(rows), plan.grid(rows, 7)):
        assert (_covered(plan, rows, hidden, grid) == 1).all()


def test_plan_fields_round_trip_through_params():
    for spec in (NormalizationSpec.reference_fusion(64, 5140),
                 NormalizationSpec.reference_fusion(64, 5140, threads_per_row=448, batch=3,
                                                    param_cache="shared", prefetch=False),
                 NormalizationSpec.rms_norm(64, 1024, param_cache="none")):
        assert spec_from_params(spec_params(spec)) == spec


def test_plan_overrides_are_checked():
    with pytest.raises(LoweringError, match="param_cache"):
        NormalizationSpec.layer_norm(8, 1024, param_cache="l2")
    with pytest.raises(LoweringError, match="prefetch"):
        NormalizationSpec.layer_norm(8, 1024, param_cache="none", prefetch=True)
    with pytest.raises(LoweringError, match="shared memory"):
        # four fp32 tensors of 20480 staged: 320 KiB
        plan_launch(20480, 8, 2, threads_per_row=640, batch=4, param_cache="shared",
                    prefetch=False, param_bytes=16)
    assert isinstance(plan_launch(20480, 8, 2, param_bytes=8), LaunchPlan)


# --------------------------------------------------------------------------- compiles


def _compile(spec, arch, options=()):
    pytest.importorskip("cupy")
    from runtime import jit

    return jit.compile(render_normalization(spec), [spec.kernel_name], arch, options)


def _cap(plan):
    """The register cap the plan promises ptxas: its estimate plus the margin of 8."""
    return -(-(plan.register_estimate + 8) // 8) * 8


def _check_compiled(spec, ck):
    name, plan = spec.kernel_name, spec.plan
    assert ck.spill_bytes.get(name, 0) == 0, (plan, ck.log)
    assert ck.local_bytes.get(name, 0) == 0, (plan, ck.log)
    # the blocks the grid counts on are resident: __launch_bounds__ made ptxas keep to it
    assert ck.registers[name] * plan.block_threads * plan.min_blocks_per_sm <= 65536
    if not plan.persistent:
        # the row-wise plan's estimate is what ptxas uses, within a few registers
        assert ck.registers[name] <= plan.register_estimate + 8


@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("hidden", BENCH_HIDDEN + ODD_HIDDEN)
def test_every_variant_compiles_without_spills(arch, variant, hidden):
    # sm_80 has no thread-block clusters: its model says so (runtime.normalization)
    hardware = SM90 if arch == "sm_90" else dataclasses.replace(SM90, clusters=False)
    spec = VARIANTS[variant](8192, hidden, hardware=hardware)
    assert arch == "sm_90" or spec.plan.cluster == 1
    _check_compiled(spec, _compile(spec, arch))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("hidden", BENCH_HIDDEN)
def test_register_estimate_is_enough_for_ptxas(dtype, variant, hidden):
    """ptxas uses whatever slack __launch_bounds__ leaves (it is no measure of need), so
    the estimate is checked the way the plan relies on it: held to the estimate plus the
    margin, ptxas still spills nothing. And the kernel as shipped spills nothing either."""
    import re

    pytest.importorskip("cupy")
    from runtime import jit

    spec = VARIANTS[variant](8192, hidden, dtype=dtype)
    _check_compiled(spec, _compile(spec, "sm_90"))
    if spec.plan.shared_row:
        return  # ptxas is not monotonic in the cap there: see SHARED_ROW_REGISTERS
    # -maxrregcount is ignored where __launch_bounds__ is given: strip it for this check
    source = re.sub(r"__launch_bounds__\(\d+, \d+\)( __cluster_dims__)?",
                    r"\1", render_normalization(spec))
    assert "__launch_bounds__" not in source
    capped = jit.compile(source, [spec.kernel_name], "sm_90",
                         (f"-maxrregcount={_cap(spec.plan)}",))
    assert capped.registers[spec.kernel_name] <= _cap(spec.plan)
    assert capped.spill_bytes.get(spec.kernel_name, 0) == 0, (spec.plan, capped.log)


@pytest.mark.parametrize("hidden", [768, 5140, 16384, 20480])
def test_every_candidate_plan_compiles_without_spills(hidden):
    spec = NormalizationSpec.reference_fusion(8192, hidden)
    for cand in candidate_plans(hidden, spec.plan.vector_width, 2):
        s = dataclasses.replace(spec, threads_per_row=cand.threads_per_row, batch=cand.batch,
                                param_cache="none")
        assert s.plan == cand
        ck = _compile(s, "sm_90")
        assert ck.spill_bytes.get(s.kernel_name, 0) == 0, (cand, ck.log)
        assert ck.registers[s.kernel_name] <= cand.register_estimate + 8, cand
    for cand in persistent_candidates(hidden, spec.plan.vector_width, 2, 8, False, (2, 2, 2, 2)):
        s = dataclasses.replace(spec, threads_per_row=cand.threads_per_row, batch=cand.batch,
                                rows_per_block=cand.rows_per_block,
                                param_cache=cand.param_cache, prefetch=cand.prefetch,
                                x_staged=cand.x_staged or None,
                                stages=cand.stages if cand.x_staged else None,
                                one_pass=cand.one_pass or None, packed=cand.packed or None,
                                x_bulk=cand.x_bulk or None,
                                shared_param_bytes=cand.shared_param_bytes or None)
        assert s.plan == cand
        _check_compiled(s, _compile(s, "sm_90"))


def test_packed_row_where_the_tensors_fit_registers_only_so():
    """16384: four 1-D tensors and an fp32 row slice do not fit a 512-thread block's
    registers; with the row slice in 16 bits they do, and the planner takes that plan.
    The packed kernel keeps t9 = half(x + b0) and adds b1 again in every pass."""
    spec = NormalizationSpec.reference_fusion(8192, 16384)
    plan = spec.plan
    assert plan.packed and plan.param_cache == "registers" and plan.x_staged
    src = render_normalization(spec)
    assert "Vec<unsigned short, kVec> pv[kBatch];" in src and "float v[kBatch][kVec];" not in src
    assert "#define VAL(i, e) (f16_to_f32(pv[i].e[e]) + f16_to_f32(c_b1[(i)].e[e]))" in src
    _check_compiled(spec, _compile(spec, "sm_90"))
    # where the tensors fit beside the fp32 row, no packing (its recompute costs more)
    for hidden in (1600, 4096, 12288):
        assert not NormalizationSpec.reference_fusion(8192, hidden).plan.packed
    # a layer_norm without a prologue packs x itself: VAL is x's value
    ln = NormalizationSpec.layer_norm(8192, 16384, 1e-5, "float16", threads_per_row=512,
                                      batch=4, param_cache="registers", x_staged=True,
                                      packed=True)
    assert "#define VAL(i, e) f16_to_f32(pv[i].e[e])" in render_normalization(ln)
    with pytest.raises(LoweringError, match="packed"):
        NormalizationSpec.reference_fusion(8192, 16384, param_cache="global", x_staged=True,
                                           packed=True, threads_per_row=512, batch=4)


@pytest.mark.parametrize("hidden", [2048, 12288, 20480])
def test_new_plan_dimensions_are_candidates(hidden):
    """The sweep times deeper x rings, the one-pass reduction and tensors through L2."""
    spec = NormalizationSpec.reference_fusion(8192, hidden)
    cands = persistent_candidates(hidden, spec.plan.vector_width, 2, 8)
    assert any(c.stages == 2 and c.x_staged for c in cands)
    assert any(c.one_pass for c in cands)
    assert any(c.param_cache == "global" and c.x_staged for c in cands)
    assert all(not c.one_pass or c.warps_per_row > 1 for c in cands)


def test_deeper_ring_one_pass_and_global_render():
    spec = NormalizationSpec.reference_fusion(8192, 20480, param_cache="global", x_staged=True,
                                              stages=2, one_pass=True, threads_per_row=640,
                                              batch=4)
    plan = spec.plan
    assert (plan.stages, plan.one_pass, plan.param_cache) == (2, True, "global")
    assert plan.describe() == "persistent/global t640 b4 v8 r1 prefetch/smem2 1pass"
    assert plan.dynamic_shared_bytes == 3 * 640 * 4 * 8 * 2  # a ring of three rows, no tensors
    src = render_normalization(spec)
    assert "cp_async_wait_group<kStages - 1>()" in src and "constexpr int kStages = 2" in src
    assert "__ldg" in src and "chan_merge" in src
    body = src[src.index("#pragma unroll 1"):]
    assert body.count("row_stats(n, m, q") == 1  # one reduction, one barrier a row
    assert "parity ^= 1" in body
    assert "__syncthreads" not in body  # the barrier is inside row_stats only


def test_rms_norm_alternates_its_partials_in_the_persistent_loop():
    """One reduction a row on one buffer would let a fast warp overwrite the partial a
    slow warp still reads: the persistent kernel alternates two buffers by parity."""
    spec = NormalizationSpec.rms_norm(8192, 4096, param_cache="shared", prefetch=True,
                                      threads_per_row=256, batch=2)
    src = render_normalization(spec)
    assert "row_sum(s, partials[parity][row_in_block])" in src and "parity ^= 1" in src


def test_stage_and_one_pass_overrides_are_checked():
    with pytest.raises(LoweringError, match="stages"):
        NormalizationSpec.reference_fusion(8, 4096, stages=4, x_staged=True)
    with pytest.raises(LoweringError, match="x_staged"):
        NormalizationSpec.reference_fusion(8, 4096, stages=2, x_staged=False)
    with pytest.raises(LoweringError, match="one_pass"):
        NormalizationSpec.reference_fusion(8, 4096, one_pass=True, param_cache="none")
    spec = NormalizationSpec.reference_fusion(8, 4096, stages=2, one_pass=True)
    assert spec.plan.x_staged and spec.plan.stages == 2 and spec.plan.one_pass
    assert spec_from_params(spec_params(spec)) == spec


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


@pytest.mark.parametrize("hint", ["evict_first", "prefetch_256b"])
@pytest.mark.parametrize("hidden", [768, 2048, 5140, 12288, 16384, 20480])
def test_l2_hint_variants_render_and_compile_without_spills(hidden, hint):
    """The sweep's L2 hints on the cp.async of x: the planner's first two plans that
    stage x (16-byte vectors, 8-byte ones at 5140), each hint; the hint is in the
    source, nothing spills."""
    from lowering.kernels.normalization import hint_variants

    spec = NormalizationSpec.reference_fusion(8192, hidden)
    cands = persistent_candidates(hidden, spec.plan.vector_width, 2, 8)
    variants = [p for p in hint_variants(cands, hidden, 2) if p.l2_hint == hint]
    assert len(variants) == 2 and all(p.x_staged for p in variants)
    for cand in variants:
        s = dataclasses.replace(spec, threads_per_row=cand.threads_per_row, batch=cand.batch,
                                rows_per_block=cand.rows_per_block, param_cache=cand.param_cache,
                                prefetch=True, x_staged=True, stages=cand.stages,
                                l2_hint=hint, packed=cand.packed or None,
                                x_bulk=cand.x_bulk or None,
                                shared_param_bytes=cand.shared_param_bytes or None)
        assert s.plan == cand and s.plan.describe().endswith(" " + hint)
        src = render_normalization(s)
        assert ("L2::cache_hint" in src) == (hint == "evict_first")
        assert ("L2::256B" in src) == (hint == "prefetch_256b")
        assert s.kernel_name != dataclasses.replace(s, l2_hint=None).kernel_name
        _check_compiled(s, _compile(s, "sm_90"))


def test_l2_hint_needs_staged_x():
    with pytest.raises(LoweringError, match="l2_hint"):
        NormalizationSpec.reference_fusion(8192, 4096, param_cache="registers", prefetch=True,
                                           x_staged=False, l2_hint="evict_first")
    with pytest.raises(LoweringError, match="l2_hint"):
        NormalizationSpec.reference_fusion(8192, 4096, l2_hint="evict_last")


def test_bench_sm_copy_kernel_compiles_without_spills():
    """The layer_norm bench's SM copy (its ceiling column) compiles for sm_90, no spills."""
    pytest.importorskip("cupy")
    from hostir.jobs.layer_norm import SM_COPY_SOURCE
    from runtime import jit

    ck = jit.compile(SM_COPY_SOURCE, ["hostir_sm_copy"], "sm_90")
    assert ck.registers["hostir_sm_copy"] > 0
    assert ck.spill_bytes.get("hostir_sm_copy", 0) == 0


# ------------------------------------------------------------------ autotuning candidates

@pytest.mark.parametrize("hidden", [768, 1024, 1600, 4096, 5140, 12288, 16384, 20480])
@pytest.mark.parametrize("make", ["reference_fusion", "layer_norm", "rms_norm"])
def test_tune_plans_start_with_the_heuristic_and_stay_valid(hidden, make):
    """The tuner's candidates: the heuristic's pick first, no repeats, never one-pass,
    every row geometry of the row-wise kernel among them, and every one a plan the spec
    accepts pinned."""
    from lowering.kernels.normalization import spec_with_plan, tune_plans

    spec = getattr(NormalizationSpec, make)(8192, hidden)
    plans = tune_plans(spec)
    assert plans[0] == spec.plan
    assert len(plans) == len(set(plans)) <= 80
    assert not any(p.one_pass and not p.envelope for p in plans)
    registers = dataclasses.replace(spec, shared_row=False, envelope=False).plan
    rowwise = {dataclasses.replace(p, param_cache="none")
               for p in candidate_plans(hidden, registers.vector_width, 2)}
    assert rowwise and rowwise <= set(plans)
    for p in plans:
        assert spec_with_plan(spec, p).plan == p


def test_tune_plans_hold_the_heuristics_twins():
    """At 1600 the twins of the pick (ring depth, packed row, bulk copy) are
    candidates: side by side its packed twin was 2.5% faster (norm_plan_probe)."""
    from lowering.kernels.normalization import tune_plans

    spec = NormalizationSpec.reference_fusion(8192, 1600)
    pick = spec.plan
    plans = tune_plans(spec)
    names = [p.describe() for p in plans]  # twins differ in their register estimates too
    for twin in (dict(packed=True), dict(stages=1), dict(x_bulk=True)):
        assert dataclasses.replace(pick, **twin).describe() in names, twin
    assert not any(p.l2_hint for p in plans)  # hints: allocation-dependent, see tune_plans
    # other geometries too, each with the tensors in more than one home
    others = {(p.threads_per_row, p.param_cache) for p in plans
              if p.persistent and not p.shared_row and p.threads_per_row != pick.threads_per_row}
    assert any(p.shared_row for p in plans)  # and the shared-row family's
    assert len({t for t, _ in others}) == 2 and len(others) >= 4


def test_spec_with_plan_pins_every_plan_field():
    from lowering.kernels.normalization import PLAN_FIELDS, spec_with_plan

    spec = NormalizationSpec.reference_fusion(8192, 4096)
    pinned = spec_with_plan(spec, spec.plan)
    assert pinned.plan == spec.plan
    assert all(getattr(spec, f) is None for f in PLAN_FIELDS)
    assert pinned.threads_per_row == spec.plan.threads_per_row
    assert dataclasses.replace(pinned, **{f: None for f in PLAN_FIELDS}) == spec


def test_stored_normalization_winner_round_trip(tmp_path, monkeypatch):
    """What the tuner stores comes back for the same problem at any row count, on the
    same device only, and not for a spec with a plan pinned."""
    torch = pytest.importorskip("torch")
    from hostir.options import options, set_options
    from lowering.kernels.normalization import spec_with_plan, tune_plans
    from runtime import autotune
    from runtime import normalization as rn

    saved = options()
    set_options(dataclasses.replace(saved, cache_dir=tmp_path))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Test GPU")
    try:
        spec = NormalizationSpec.reference_fusion(8192, 1600)
        assert rn.stored_winner(spec) is None and rn.choose(spec, 0) is spec
        winner = spec_with_plan(spec, tune_plans(spec)[3])
        from lowering.kernels.normalization import PLAN_FIELDS
        autotune.store_entry(rn._tune_key(spec), {"plan": {f: getattr(winner, f) for f in PLAN_FIELDS}})
        assert rn.stored_winner(spec) == winner
        other_rows = dataclasses.replace(spec, rows=77)
        assert rn.stored_winner(other_rows) == dataclasses.replace(winner, rows=77)
        assert rn.choose(other_rows, 0).plan == winner.plan
        assert rn.choose(other_rows, -1) is other_rows  # not a CUDA tensor: untouched
        pinned = spec_with_plan(spec, spec.plan)
        assert rn.choose(pinned, 0) is pinned
        assert rn.stored_winner(NormalizationSpec.reference_fusion(8192, 1536)) is None
        aligned = dataclasses.replace(spec, alignment=256)  # the same plans as at 16
        assert rn.stored_winner(aligned).plan == winner.plan
        assert rn.stored_winner(dataclasses.replace(spec, alignment=8)) is None
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Other GPU")
        assert rn.stored_winner(spec) is None
        # a stored plan that no longer validates is no winner: tune again
        autotune.store_entry(rn._tune_key(spec), {"plan": {"threads_per_row": 33}})
        assert rn.stored_winner(spec) is None
    finally:
        set_options(saved)


def test_pinned_vector_width_narrows_and_round_trips():
    """``vector_width`` pins a narrower vector than the widest (1280: 8-byte vectors, 320
    of them on t64 b5, no padding); wider than the rows allow, or not a power of two, is
    refused; the host IR's kernel parameters carry it."""
    from lowering.kernels.normalization import padding, spec_from_params, spec_params

    wide = NormalizationSpec.reference_fusion(8192, 1280)
    narrow = NormalizationSpec.reference_fusion(8192, 1280, vector_width=4)
    assert wide.plan.vector_width == 8 and narrow.plan.vector_width == 4
    assert padding(narrow.plan, 1280) < padding(wide.plan, 1280)
    assert spec_from_params(spec_params(narrow)) == narrow
    _check_compiled(narrow, _compile(narrow, "sm_90"))
    for bad in (16, 3, 0):
        with pytest.raises(LoweringError, match="vector_width"):
            NormalizationSpec.reference_fusion(8192, 1280, vector_width=bad)
    with pytest.raises(LoweringError, match="vector_width"):  # 5140 allows 4 at most
        NormalizationSpec.reference_fusion(8192, 5140, vector_width=8)


def test_tune_plans_hold_the_narrower_vectors():
    from lowering.kernels.normalization import tune_plans

    plans = tune_plans(NormalizationSpec.reference_fusion(8192, 1600))
    widths = {p.vector_width for p in plans}
    assert widths == {8, 4}
    assert "persistent/registers t64 b7 v4 r2 prefetch/smem2 packed" in [p.describe() for p in plans]
    # 8-byte vectors at least: 5140's rows take 8-byte ones already, no narrower family
    assert {p.vector_width for p in tune_plans(NormalizationSpec.reference_fusion(8192, 5140))
            if not p.shared_row} == {4}


def test_precompile_fills_the_disk_cache_in_parallel(tmp_path, monkeypatch):
    """The tuner's and the bench's candidates compile on worker threads into the disk
    cache, which a later get() in this process then reads instead of compiling."""
    pytest.importorskip("cupy")
    from hostir.options import options, set_options
    from lowering.kernels.normalization import spec_with_plan, tune_plans
    from runtime import jit
    from runtime.normalization import precompile

    saved = options()
    set_options(dataclasses.replace(saved, cache_dir=tmp_path))  # the workers get it passed
    try:
        spec = NormalizationSpec.reference_fusion(8192, 1600)
        specs = [spec_with_plan(spec, p) for p in tune_plans(spec)[:3]]
        assert precompile(specs, "sm_90") == [None, None, None]
        files = list(tmp_path.rglob("*"))
        assert sum(f.is_file() for f in files) >= 3
        cache = jit.KernelCache(tmp_path / "kernels")
        for s in specs:  # in the cache: read, not compiled again
            key = jit.cache_key(render_normalization(s), [s.kernel_name], "sm_90")
            assert cache._read(key) is not None
        # all on disk: no pool (starting one would fail here), the same answer
        import concurrent.futures
        monkeypatch.setattr(concurrent.futures, "ThreadPoolExecutor", None)
        assert precompile(specs, "sm_90") == [None, None, None]
    finally:
        set_options(saved)


def test_every_kernel_enters_through_the_dependent_launch_wait():
    # the first statement of every generated kernel is the griddepcontrol pair (sm_90+),
    # so a programmatic dependent launch touches no memory before its predecessor is done
    from lowering.kernels.normalization import (
        NormalizationSpec, render_normalization, spec_with_plan, tune_plans)

    base = NormalizationSpec.reference_fusion(8192, 1600, 1e-5)
    specs = [base, dataclasses.replace(base, param_cache="none"),
             NormalizationSpec.rms_norm(8192, 20480, 1e-6)]
    specs += [spec_with_plan(base, p) for p in tune_plans(base)]
    for spec in specs:
        src = render_normalization(spec)
        body = src[src.index("{", src.index(spec.kernel_name + "(")) + 1:]
        assert body.lstrip().startswith("dependent_launch_entry();"), spec.plan.describe()
        helper = src[src.index("void dependent_launch_entry()"):]
        helper = helper[:helper.index("\n}\n")]
        assert "__CUDA_ARCH__ >= 900" in helper
        assert helper.index("griddepcontrol.launch_dependents") < helper.index("griddepcontrol.wait")


def test_dependent_launch_entry_compiles_before_hopper_too():
    pytest.importorskip("cupy")
    from lowering.kernels.normalization import NormalizationSpec, render_normalization
    from runtime import jit

    spec = NormalizationSpec.reference_fusion(8192, 1600, 1e-5)
    for arch in ("sm_80", "sm_90"):
        ck = jit.compile(render_normalization(spec), [spec.kernel_name], arch)
        assert ck.spill_bytes.get(spec.kernel_name, 0) == 0


def test_a_pinned_block_promise_is_the_launch_bounds_and_round_trips():
    import re

    from lowering.kernels.normalization import spec_with_plan

    base = NormalizationSpec.reference_fusion(8192, 4096)
    spec = dataclasses.replace(base, threads_per_row=128, batch=4, param_cache="none",
                               blocks_per_sm=7)
    plan = spec.plan
    assert plan.min_blocks_per_sm == 7 and plan.describe().endswith(" x7")
    assert dataclasses.replace(plan, blocks_per_sm=0).min_blocks_per_sm == 4  # the estimate's
    assert re.search(r"__launch_bounds__\(128, 7\)", render_normalization(spec))
    assert spec_from_params(spec_params(spec)) == spec
    assert spec_with_plan(base, plan).plan == plan
    for bad in (0, 17, 40, True, "7"):  # 17 x 128 threads > 2048
        with pytest.raises(LoweringError, match="blocks_per_sm"):
            dataclasses.replace(spec, blocks_per_sm=bad).plan  # noqa: B018


def test_tune_plans_promise_more_blocks_and_spilling_promises_are_reported():
    """The tuner's promise twins: the heuristic's pick and the row-wise geometries one to
    `PROMISE_STEPS` blocks an SM above their estimate's. ptxas fits the row-wise kernel
    at 4096 (t128 b4, promised 4) in 9 blocks without spills; at 10 it spills, which
    `runtime.normalization.spill_report` says (the tuner never runs such a twin)."""
    pytest.importorskip("cupy")
    from lowering.kernels.normalization import PROMISE_STEPS, tune_plans
    from runtime.normalization import spill_report

    base = NormalizationSpec.reference_fusion(8192, 4096)
    plans = tune_plans(base)
    pick = base.plan
    for extra in range(1, PROMISE_STEPS + 1):
        assert dataclasses.replace(pick, blocks_per_sm=pick.min_blocks_per_sm + extra) in plans
    rowwise = dataclasses.replace(base, threads_per_row=128, batch=4, param_cache="none").plan
    assert rowwise.min_blocks_per_sm == 4
    assert dataclasses.replace(rowwise, blocks_per_sm=9) in plans
    assert spill_report(dataclasses.replace(base, threads_per_row=128, batch=4,
                                            param_cache="none", blocks_per_sm=9)) == ""
    assert "spills" in spill_report(dataclasses.replace(base, threads_per_row=128, batch=4,
                                                        param_cache="none", blocks_per_sm=10))


def test_lean_addresses_use_row_pointers_except_in_global_plans():
    """LaunchPlan.lean_addresses (on by default): x and y by one pointer a row (row-wise
    and persistent kernels), each slot a constant offset; plans with
    param_cache="global" keep per-slot addresses; switched off, every plan does."""
    base = NormalizationSpec.reference_fusion(64, 5140, 1e-5)
    rowwise_spec = dataclasses.replace(base, param_cache="none")
    rowwise = render_normalization(rowwise_spec)
    assert "x_row[i * kThreadsPerRow]" in rowwise and "y_row[i * kThreadsPerRow]" in rowwise
    persistent = render_normalization(base)
    assert base.plan.param_cache == "registers" and base.plan.lean_addresses
    assert "y_row[i * kThreadsPerRow]" in persistent
    assert "+ (size_t)vec * kVec" not in persistent  # stage_row's per-slot address
    glob = dataclasses.replace(base, param_cache="global", x_staged=True, prefetch=True)
    assert glob.plan.param_cache == "global"
    assert "y_row" not in render_normalization(glob)
    for spec in (rowwise_spec, base):
        wide = render_normalization(spec, dataclasses.replace(spec.plan, lean_addresses=False))
        assert "y_row" not in wide and "x_row" not in wide
        assert wide != render_normalization(spec)
    staged = render_normalization(base, dataclasses.replace(base.plan, lean_addresses=False))
    assert "+ (size_t)vec * kVec" in staged


def test_packed_head_switch_changes_only_the_prologue_adds():
    """LaunchPlan.packed_head (on by default): the reference fusion's leading (+ b0,
    16-bit cast) runs as a 16-bit pair add; switched off, as an fp32 add and a cast."""
    base = NormalizationSpec.reference_fusion(64, 5140, 1e-5)
    assert base.plan.packed_head
    packed = render_normalization(base)
    wide = render_normalization(base, dataclasses.replace(base.plan, packed_head=False))
    assert "add2_fp16(h.raw, v_b0.raw);" in packed
    assert "add2_fp16(h.raw" not in wide and "f32_to_f16(a)" in wide
    # a plain layer_norm has no prologue pairs: the switch changes nothing
    plain = NormalizationSpec.layer_norm(64, 5140)
    assert render_normalization(plain) == render_normalization(
        plain, dataclasses.replace(plain.plan, packed_head=False))


def test_render_refuses_a_plan_beyond_the_switches():
    base = NormalizationSpec.reference_fusion(64, 5140, 1e-5)
    other = dataclasses.replace(base.plan, batch=base.plan.batch + 1)
    with pytest.raises(LoweringError, match="beyond the switches"):
        render_normalization(base, other)
    switched = dataclasses.replace(base.plan, balanced_grid=True, lean_addresses=False)
    assert "balanced" in switched.describe() and "slot-addresses" in switched.describe()
    assert base.plan.describe() == dataclasses.replace(base.plan).describe()


@pytest.mark.parametrize("x_dtype,y_dtype", [(torch.bfloat16, torch.bfloat16),
                                             (torch.float16, torch.float32)])
def test_outputs_are_allocated_at_the_inputs_16_byte_phase(x_dtype, y_dtype):
    """y (when the caller passes none) starts as many elements past a 16-byte boundary as
    x: a slice of x off 16 bytes keeps its rows' chunks lined up with y's, so that the
    kernels' stores stay whole vectors."""
    from runtime.normalization import empty_in_phase

    big = torch.zeros(3 * 1001 + 16, dtype=x_dtype)
    for start in range(8):
        x = big[start:start + 3 * 1001].view(3, 1001)
        y = empty_in_phase(x, y_dtype)
        assert y.shape == x.shape and y.dtype == y_dtype and y.is_contiguous()
        x_phase = x.data_ptr() % 16 // x.element_size()
        # a row chunk of x (8 elements from a 16-byte boundary) is whole in y too
        assert (y.data_ptr() // y.element_size() - x_phase) % (16 // y.element_size()) == 0
        y.fill_(1)  # the storage holds every element
