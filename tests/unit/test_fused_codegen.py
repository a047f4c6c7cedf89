"""Transformer-seam kernels without a GPU: plans, NVRTC compiles (no spills), and the torch
reference path of runtime.fused against float64 autograd of torch's own ops."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch
import torch.nn.functional as F

from hostir.errors import LoweringError
from lowering.kernels import seams as S
from runtime import fused

MAIN_HIDDEN = (768, 4096, 8192)
ODD_HIDDEN = (1, 7, 100, 5140, 12288, 16384, 20000)


# --------------------------------------------------------------------------- plans


@pytest.mark.parametrize("hidden, alignment, vector", [
    (4096, 16, 8), (5140, 16, 4), (7, 16, 1), (100, 16, 4), (4098, 16, 2), (4096, 8, 4),
    (4096, 2, 1), (20000, 16, 8),
])
def test_vector_width_divides_the_row_and_fits_the_alignment(hidden, alignment, vector):
    assert S.vector_width(hidden, alignment) == vector


@pytest.mark.parametrize("hidden", MAIN_HIDDEN + ODD_HIDDEN)
def test_row_plans_cover_the_row(hidden):
    for floats in (S.FORWARD_CACHE_FLOATS,):
        p = S.plan_row(hidden, 16, floats)
        nvec = hidden // p.vector
        assert p.vector * nvec == hidden
        assert p.threads_per_row % 32 == 0 and p.threads_per_row <= S.MAX_THREADS_PER_ROW
        assert p.block_threads >= min(S.MIN_BLOCK_THREADS, p.threads_per_row)
        if p.cached:
            # the thread's K vectors reach every vector of the row, within the budget
            assert p.vectors_per_thread * p.threads_per_row >= nvec
            assert p.vectors_per_thread * p.vector <= floats
        else:
            assert p.threads_per_row == S.MAX_THREADS_PER_ROW
            assert -(-nvec // p.threads_per_row) * p.vector > floats


def test_the_main_widths_hold_rows_in_registers():
    for hidden in (4096, 8192):
        assert S.AddNormForwardSpec("rms_norm", "bf16", hidden, True, False).plan.cached
        p = S.AddNormBackwardSpec("layer_norm", "bf16", hidden, True).plan
        assert p.cluster == 1 and p.vector == 8 and p.hold


@pytest.mark.parametrize("make, message", [
    (lambda: S.AddNormForwardSpec("rms_norm", "fp32", 64, False, False), "dtype"),
    (lambda: S.AddNormForwardSpec("batch_norm", "bf16", 64, False, False), "kind"),
    (lambda: S.AddNormForwardSpec("rms_norm", "bf16", 64, False, True), "bias"),
    (lambda: S.AddNormBackwardSpec("rms_norm", "bf16", 0, False), "hidden"),
    (lambda: S.ColumnReduceSpec("bf16", 3), "sets"),
    (lambda: S.ElementwiseSpec("relu", "bf16"), "op"),
])
def test_specs_refuse_bad_fields(make, message):
    with pytest.raises(LoweringError, match=message):
        make()


def test_sources_include_no_header_and_name_their_kernel():
    for spec in S.every_variant(4096):
        src = S.render(spec)
        assert "#include" not in src
        assert "void __launch_bounds__(" in src and f" {spec.kernel_name}(" in src


def test_kernel_names_differ_between_variants():
    names = [s.kernel_name for s in S.every_variant(4096)]
    assert len(names) == len(set(names))


BACKWARD_WIDTHS = (1, 7, 100, 513, 4096, 4097, 4608, 8192, 16384, 16385, 24575, 33792,
                   40001, 65535, 65536, 131072)
H200 = S.Hardware(dram_bytes_per_s=4.8e12)  # an H100 model but for the bandwidth


def test_thread_registers_follow_the_schedulers_share():
    # a CTA's warps are dealt to 4 schedulers of 16384 registers each
    got = {t: S._thread_registers(t, S.SM90) for t in (32, 128, 320, 384, 416, 512)}
    assert got == {32: 255, 128: 255, 320: 168, 384: 168, 416: 128, 512: 128}


@pytest.mark.parametrize("hw", [S.SM90, H200], ids=["h100", "h200"])
def test_layer_norm_holds_three_vectors_on_fitted_threads(hw):
    """Three 16-byte vectors a thread (96 held floats) fit 352-384 threads' registers, not
    512's: layer norm takes the fitted threads and holds, on one CTA, four or eight, not
    on two, and RMS norm keeps 512 threads."""
    for hidden, cluster in ((8704, 1), (33792, 4), (36864, 4), (66560, 8)):
        p = S.plan_backward(hidden, 16, False, True, hw)
        assert (p.cluster, p.vectors_per_thread, p.hold) == (cluster, 3, True), hidden
        assert p.block_threads < S.BACKWARD_THREADS
        assert S._held_floats(p.vectors_per_thread, p.vector, True) <= S._hold_budget(
            p.block_threads, hw)
        r = S.plan_backward(hidden, 16, False, False, hw)
        assert r.block_threads == S.BACKWARD_THREADS and not r.hold
    for hidden in (17920, 18432):  # two CTAs: 512 threads read the stage again
        p = S.plan_backward(hidden, 16, False, True, hw)
        assert (p.cluster, p.block_threads, p.hold) == (2, S.BACKWARD_THREADS, False)
    # four vectors (128 floats) fit no fitted threads' registers: 512 threads, not held
    p = S.plan_backward(40960, 16, False, True, hw)
    assert (p.block_threads, p.hold) == (S.BACKWARD_THREADS, False)


@pytest.mark.parametrize("hw", [S.SM90, H200], ids=["h100", "h200"])
def test_backward_plans_fit_and_cover_every_width(hw):
    widths = list(range(1, 1100)) + list(range(1100, 131073, 97)) + list(BACKWARD_WIDTHS)
    for hidden, dh, alignment, rule in itertools.product(
            widths, (False, True), (16, 2), ("fewest_clusters", "in_flight")):
        p = S.plan_backward(hidden, alignment, dh, True, hw, rule)
        # the cluster's slices cover the row, none empty
        assert p.cluster * p.slice >= hidden > (p.cluster - 1) * p.slice
        assert p.cluster == 1 or p.rows_per_block == 1
        assert p.vectors_per_thread * p.threads_per_row * p.vector >= p.slice
        # 512 threads, or fewer fitted to the slice where they hold the row (`_hold_if_fitted`)
        assert p.block_threads == S.BACKWARD_THREADS or (
            p.hold and p.block_threads % 32 == 0 and p.block_threads < S.BACKWARD_THREADS)
        assert p.vector == S.vector_width(hidden, alignment)
        assert p.smem_bytes <= hw.smem_per_block and p.stages >= 2
        # one CTA an SM: two blocks never fit one SM's shared memory
        assert 2 * (p.smem_bytes + 1024) > hw.smem_per_sm
        # the tiles in flight nearest the model's bytes in flight (two at least), else
        # as many stages as fit: one stage fewer would keep too few
        used = p.offsets[-1] + 8 * p.stages
        target = hw.in_flight(S.stage_latency(p.vector, p.bulk, p.phased))
        need = max(2, round(target / p.tile_bytes + 1e-9))
        assert (p.lookahead >= need or used + p.tile_bytes > hw.smem_per_block
                or p.stages == S.BACKWARD_MAX_STAGES), (hidden, p)
        assert (p.lookahead < need or S._lookahead(p.stages - 1, p.cluster, p.slack) < need
                or (p.cluster == 1 and p.stages == 4)), (hidden, p)
        # a tile's spans fit their stage whatever their first chunk's offset
        assert p.stream_bytes >= 2 * p.rows_per_block * p.slice + 14
        # tiles of one row are bulk-copied; tiles of 16-byte rows stage each stream on a
        # 128-byte line, but where as many stages would not fit so
        assert p.bulk or p.rows_per_block > 1, (hidden, p)
        if p.vector == 8 and not p.phased and p.stream_bytes % S.STAGE_LINE:
            lined = p.streams * -(-p.stream_bytes // S.STAGE_LINE) * S.STAGE_LINE
            rest = p.offsets[-1] - p.offsets[1] + 8 * S.BACKWARD_MAX_STAGES + 16
            assert p.stages * (lined + 8 * p.rows_per_block) + rest > hw.smem_per_block, (
                hidden, p)
        # the row slots' sums fit the stages at the end
        assert p.stages * p.tile_bytes >= 8 * p.rows_per_block * p.slice
        # the model's bytes in flight, or as many stages as fit or are allowed
        assert p.lookahead >= 1 and p.deferred == (p.stages >= (3 if p.cluster > 1 else 4))
        if rule == "fewest_clusters":  # the default: no cluster larger than in_flight's
            assert p.cluster <= S.plan_backward(hidden, alignment, dh, True, hw,
                                                "in_flight").cluster
        elif 512 <= hidden <= 65536:
            # (the tiles nearest the target: half a tile short of it at most)
            assert (p.lookahead * p.tile_bytes >= target - p.tile_bytes // 2
                    or p.smem_bytes + p.tile_bytes > hw.smem_per_block
                    or p.stages == S.BACKWARD_MAX_STAGES), (hidden, p)
            # at least bandwidth x latency (the target is twice that)
            assert p.lookahead * p.tile_bytes >= target // 2
    with pytest.raises(LoweringError, match="no plan fits"):
        S.plan_backward(2 ** 20, 16, True, True, hw)


@pytest.mark.parametrize("hw", [S.SM90, H200], ids=["h100", "h200"])
def test_a_row_one_cta_cannot_defer_goes_to_a_pair(hw):
    """Rows that one CTA holds in three stages only (no deferral) run on a cluster of two
    that defers; rows that one CTA defers, and rows of 2-byte vectors, stay on one."""
    for hidden, dh in ((13312, False), (14848, False), (15000, False), (16384, False),
                       (9216, True), (12800, True), (15000, True)):
        p = S.plan_backward(hidden, 16, dh, True, hw)
        assert (p.cluster, p.deferred) == (2, True), (hidden, dh, p.describe())
    for hidden, dh, alignment in ((8704, False, 16), (10752, False, 16), (12800, False, 16),
                                  (14001, False, 2), (15001, True, 2)):
        p = S.plan_backward(hidden, alignment, dh, True, hw)
        assert p.cluster == 1, (hidden, dh, p.describe())
    for hidden in range(8, 16897, 8):
        for dh in (False, True):
            p = S.plan_backward(hidden, 16, dh, False, hw)
            if p.cluster == 1 and not p.deferred:  # no pair that defers existed
                streams = 3 if dh else 2
                pairs = [S._backward_layout(hidden, 8, 2, streams, False, hw, held)
                         for held in S.BACKWARD_HELDS]
                pair = next((q for q in pairs if q is not None), None)
                assert pair is None or not pair.deferred, (hidden, dh)


@pytest.mark.parametrize("hw", [S.SM90, H200], ids=["h100", "h200"])
def test_a_cluster_with_one_tile_in_flight_spreads_over_more_ctas(hw):
    """A cluster's rows of 16-byte vectors with one tile in flight go to the next cluster
    size where it keeps two in flight at 12 columns a thread or more; with fewer (the
    residual's gradient at 18944 on four CTAs, 37376 on eight), or on 2-byte vectors, they
    stay."""
    for hidden, dh, cluster in ((29184, False, 4), (31232, False, 4), (51712, False, 8),
                                (65536, False, 8), (27136, True, 4), (55808, True, 8)):
        p = S.plan_backward(hidden, 16, dh, True, hw)
        assert (p.cluster, p.lookahead >= 2) == (cluster, True), (hidden, dh, p.describe())
    # thin slices; rows of 2-byte vectors with one tile in flight (28001: two CTAs of
    # three stages; 55001: four)
    for hidden, dh, cluster in ((18944, True, 2), (37376, True, 4), (28001, False, 2),
                                (55001, False, 4)):
        p = S.plan_backward(hidden, 16, dh, True, hw)
        assert p.cluster == cluster, (hidden, dh, p.describe())
        assert hidden % 8 == 0 or p.lookahead == 1, (hidden, p.describe())
    for hidden in range(8, 65537, 8 * 61):
        for dh in (False, True):
            p = S.plan_backward(hidden, 16, dh, False, hw)
            if p.cluster > 1 and p.lookahead < 2:  # no larger cluster qualified
                q = S._fewest_clusters(hidden, 8, S.BACKWARD_CLUSTERS, 3 if dh else 2, False,
                                       hw, least=p.cluster + 1)
                assert (q is None or q.lookahead < 2
                        or q.slice < S.BACKWARD_SPREAD_COLUMNS * q.threads_per_row), hidden


@pytest.mark.parametrize("hw", [S.SM90, H200], ids=["h100", "h200"])
def test_an_rms_norm_pair_that_cannot_hold_spreads_over_four(hw):
    """An RMS norm's rows on two CTAs of three or four vectors a thread (not held) go to
    four CTAs that hold them where each thread keeps 12 columns (from 24552), without the
    residual's gradient (with it they spread from 24552 for their one tile in flight);
    layer norm and thinner slices stay on two."""
    for hidden in (24576, 25088, 25600):
        p = S.plan_backward(hidden, 16, False, False, hw)
        assert (p.cluster, p.hold, p.lookahead >= 2) == (4, True, True), hidden
        assert p.slice >= S.BACKWARD_SPREAD_COLUMNS * p.threads_per_row
        assert S.plan_backward(hidden, 16, False, True, hw).cluster == 2, hidden
    for hidden in (20480, 23552):  # 10-11.5 columns a thread on four
        p = S.plan_backward(hidden, 16, False, False, hw)
        assert (p.cluster, p.hold) == (2, False), hidden


@pytest.mark.parametrize("hw", [S.SM90, H200])
def test_sparse_one_row_tiles_take_two_rows_of_three_vectors(hw):
    """One CTA's row a tile of 512 threads at two vectors, a quarter or more of the second
    vectors' slots empty (513-768 vectors), becomes two rows a tile of 256 threads at
    three; full slots, the residual's gradient and wider rows keep their plans."""
    for hidden in (4104, 4608, 5120, 6144):
        for layer in (True, False):
            p = S.plan_backward(hidden, 16, False, layer, hw)
            assert (p.cluster, p.threads_per_row, p.rows_per_block,
                    p.vectors_per_thread) == (1, 256, 2, 3), (hidden, layer)
            assert p.threads_per_row * p.vectors_per_thread * p.vector >= hidden
    for hidden, dh in ((4096, False), (6152, False), (3072, False), (4608, True)):
        p = S.plan_backward(hidden, 16, dh, True, hw)
        assert p.rows_per_block * p.vectors_per_thread != 6, (hidden, dh)


def test_backward_plans_transfer_between_devices():
    """The H100 and H200 models differ in bandwidth only: the same layout of a row, the
    H200 at least as many stages (its bytes in flight are more)."""
    for hidden in list(range(1, 600)) + list(range(600, 131073, 61)):
        for dh in (False, True):
            a = S.plan_backward(hidden, 16, dh, True, S.SM90)
            b = S.plan_backward(hidden, 16, dh, True, H200)
            assert dataclasses.replace(b, stages=a.stages, offsets=a.offsets,
                                       smem_bytes=a.smem_bytes) == a, hidden
            assert b.stages >= a.stages, hidden
    # without clusters (an A100 model) the widest rows have no plan: the torch path
    assert S.plan_backward(8192, 16, True, True, S.SM80).cluster == 1
    with pytest.raises(LoweringError):
        S.plan_backward(65536, 16, True, True, S.SM80)


# --------------------------------------------------------------------------- NVRTC

def _assert_compiles_clean(spec, arch):
    pytest.importorskip("cupy")  # NVRTC through CuPy; the rest of this file needs neither
    from runtime import jit

    ck = jit.compile(S.render(spec), [spec.kernel_name], arch)
    sym = ck.lowered[spec.kernel_name]
    assert ck.registers[sym] > 0, ck.log
    assert ck.spill_bytes.get(sym, 0) == 0, (spec, ck.log)
    assert ck.local_bytes.get(sym, 0) == 0, (spec, ck.log)
    return ck


@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
@pytest.mark.parametrize("dtype", S.DTYPES)
@pytest.mark.parametrize("hidden", MAIN_HIDDEN)
def test_main_widths_compile_without_spills(arch, dtype, hidden):
    for spec in S.every_variant(hidden, dtype):
        if isinstance(spec, (S.AddNormForwardSpec, S.AddNormBackwardSpec)):
            _assert_compiles_clean(spec, arch)


@pytest.mark.parametrize("dtype, hidden", [("bf16", h) for h in ODD_HIDDEN] + [("fp16", 7)])
def test_odd_widths_compile(dtype, hidden):
    for spec in S.every_variant(hidden, dtype):
        if isinstance(spec, (S.AddNormForwardSpec, S.AddNormBackwardSpec)):
            _assert_compiles_clean(spec, "sm_90")


@pytest.mark.parametrize("dtype", S.DTYPES)
@pytest.mark.parametrize("hidden", BACKWARD_WIDTHS)
def test_every_backward_plan_compiles_without_spills(dtype, hidden):
    for kind in S.NORM_KINDS:
        for dh in (False, True):
            for alignment in ((16, 2) if hidden % 8 == 0 else (16,)):
                _assert_compiles_clean(S.AddNormBackwardSpec(kind, dtype, hidden, dh, alignment),
                                       "sm_90")


def test_fewest_clusters_rule_takes_fewer_ctas_a_row_and_still_fits():
    """The default backward rule: never a larger cluster than ``in_flight`` (the bench's
    --sweep times that one beside it), fewer where ``in_flight`` splits a row it could
    hold at twice the columns a thread; every plan fits and covers its row."""
    assert S.DEFAULT_BACKWARD_RULE == "fewest_clusters"
    fewer = 0
    for hidden in list(range(512, 131073, 512)) + [8705, 16897, 33281, 100003]:
        for dh in (False, True):
            a = S.plan_backward(hidden, 16, dh, True, S.SM90, "in_flight")
            b = S.plan_backward(hidden, 16, dh, True, S.SM90)
            assert b.cluster <= a.cluster
            fewer += b.cluster < a.cluster
            assert b.cluster * b.slice >= hidden > (b.cluster - 1) * b.slice
            assert b.vectors_per_thread * b.threads_per_row * b.vector >= b.slice
            assert b.smem_bytes <= S.SM90.smem_per_block and b.stages >= 2
            assert b.vectors_per_thread * b.vector <= 2 * S.BACKWARD_HELD_FLOATS
    assert fewer > 100
    assert S.plan_backward(8704, 16, True, False, S.SM90, "fewest_clusters").cluster == 1
    with pytest.raises(LoweringError, match="rule"):
        S.AddNormBackwardSpec("rms_norm", "bf16", 4096, True, rule="most")


def test_fitted_rule_fills_the_slots_it_plans():
    """The third backward rule: the default's clusters, threads (a multiple of 32, at most
    `BACKWARD_THREADS` a block) sized so that the slice's vectors fill their slots; where
    the default's slots are full it plans as the default does, but for the hold (and the
    default's two-row tiles, `_two_rows_if_sparse`)."""
    for hidden in list(range(512, 131073, 512)) + [7, 100, 768, 4097, 5140, 8705, 100003]:
        for dh in (False, True):
            a = S.plan_backward(hidden, 16, dh, True, S.SM90)
            b = S.plan_backward(hidden, 16, dh, True, S.SM90, "fitted")
            assert b.cluster * b.slice >= hidden > (b.cluster - 1) * b.slice
            assert b.threads_per_row % 32 == 0 and b.block_threads <= S.BACKWARD_THREADS
            assert b.rows_per_block == 1 or b.cluster == 1
            slots = b.vectors_per_thread * b.threads_per_row * b.vector
            assert slots >= b.slice and b.smem_bytes <= S.SM90.smem_per_block
            a_slots = a.vectors_per_thread * a.threads_per_row * a.vector
            assert slots - b.slice <= a_slots - a.slice or b.cluster != a.cluster
            two_rows = (a.rows_per_block, a.vectors_per_thread) == (2, 3)  # 6144: its own rule
            if a.cluster == b.cluster and a_slots == a.slice and not two_rows:
                # (the default holds a layer norm's rows on fitted threads: `_hold_if_fitted`)
                assert b == a or (a.hold and dataclasses.replace(b, hold=True) == a), hidden
    fitted = S.plan_backward(8704, 16, True, False, S.SM90, "fitted")
    assert (fitted.cluster, fitted.threads_per_row, fitted.vectors_per_thread) == (2, 288, 2)
    assert S.plan_backward(2560, 16, True, False, S.SM90, "fitted").block == (160, 3, 1)


@pytest.mark.parametrize("hidden, alignment", [
    (768, 16), (2560, 16), (4608, 16), (8704, 16), (12800, 16), (16896, 16), (33280, 16),
    (65536, 16), (5140, 16), (768, 2), (8704, 2), (2560, 4)])  # 2, 4: single values, pairs
@pytest.mark.parametrize("rule", ["fewest_clusters", "fitted"])
def test_other_rules_plans_compile_without_spills(hidden, alignment, rule):
    for kind in S.NORM_KINDS:
        for dh in (False, True):
            spec = S.AddNormBackwardSpec(kind, "bf16", hidden, dh, alignment, rule=rule)
            ck = _assert_compiles_clean(spec, "sm_90")
            # one CTA an SM: at most 64 K registers a block
            assert ck.registers[ck.lowered[spec.kernel_name]] * spec.plan.block_threads <= 65536


@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
@pytest.mark.parametrize("dtype", S.DTYPES)
def test_elementwise_and_reduce_kernels_compile(arch, dtype):
    for alignment in ((16, 8, 4, 2) if (arch, dtype) == ("sm_90", "bf16") else (16,)):
        for op in S.ELEMENTWISE_OPS:
            spec = S.ElementwiseSpec(op, dtype, alignment)
            assert spec.vector == {16: 8, 8: 4, 4: 2, 2: 1}[alignment]
            _assert_compiles_clean(spec, arch)
    for sets in (1, 2):
        _assert_compiles_clean(S.ColumnReduceSpec(dtype, sets), arch)


def test_misaligned_rows_compile_with_narrow_vectors():
    for alignment in (8, 4, 2):
        spec = S.AddNormBackwardSpec("layer_norm", "fp16", 4096, True, alignment)
        assert spec.plan.vector == alignment // 2
        _assert_compiles_clean(spec, "sm_90")


# --------------------------------------------------------------------------- the torch path


def _torch_norm(h, w, b, eps, kind):
    if kind == "rms_norm":
        return F.rms_norm(h, (h.shape[-1],), w, eps)
    return F.layer_norm(h, (h.shape[-1],), w, b, eps)


def _inputs(shape, dtype, seed, residual=True):
    g = torch.Generator().manual_seed(seed)
    width = shape[-1]
    x = torch.randn(shape, generator=g, dtype=torch.float64)
    x[..., ::3, :] += 20.0  # a large mean in some rows: the centered variance matters
    r = torch.randn(shape, generator=g, dtype=torch.float64) if residual else None
    w = torch.rand(width, generator=g, dtype=torch.float64) + 0.5
    b = torch.randn(width, generator=g, dtype=torch.float64)
    dy = torch.randn(shape, generator=g, dtype=torch.float64)
    dh = torch.randn(shape, generator=g, dtype=torch.float64)
    cast = lambda t: None if t is None else t.to(dtype)  # noqa: E731
    return [cast(t) for t in (x, r, w, b, dy, dh)]


TOL = {torch.float32: 2e-5, torch.float64: 1e-10}


def _close(got, want, dtype):
    err = (got.double() - want).abs().max().item()
    scale = want.abs().max().item() + 1e-30
    assert err <= TOL[dtype] * scale, (err, scale)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kind", fused.NORM_KINDS)
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("with_dh", [False, True])
def test_add_norm_reference_matches_float64_autograd(dtype, kind, residual, with_dh):
    eps = 1e-5
    x, r, w, b, dy, dh = _inputs((2, 9, 48), dtype, seed=3, residual=residual)
    bias = b if kind == "layer_norm" else None
    y, h, mean, rstd = fused.add_norm_forward(x, r, w, bias, eps, kind)
    assert y.dtype == dtype and h.dtype == dtype and rstd.dtype == torch.float32
    assert rstd.shape == x.shape[:-1] and (mean is None) == (kind == "rms_norm")

    # float64 autograd through torch's own norm
    leaves = [t.double().requires_grad_() for t in (x, w)]
    x64, w64 = leaves
    r64 = None if r is None else r.double().requires_grad_()
    b64 = None if bias is None else bias.double().requires_grad_()
    h64 = x64 if r64 is None else x64 + r64
    y64 = _torch_norm(h64, w64, b64, eps, kind)
    loss = (y64 * dy.double()).sum() + ((h64 * dh.double()).sum() if with_dh else 0)
    loss.backward()
    _close(y, y64.detach(), dtype)
    _close(h, h64.detach(), dtype)
    h_mean = h64.detach().mean(-1)
    centered = h64.detach() - (h_mean.unsqueeze(-1) if kind == "layer_norm" else 0)
    want_rstd = torch.rsqrt(centered.pow(2).mean(-1) + eps)
    assert (rstd.double() - want_rstd).abs().max() <= 1e-5 * want_rstd.abs().max()
    if mean is not None:
        assert (mean.double() - h_mean).abs().max() <= 1e-5 * h_mean.abs().max()

    dx, dw, db = fused.add_norm_backward(dy, h, w, mean, rstd, kind, dh if with_dh else None)
    # rstd / mean are saved in float32: the float64 path carries their rounding too (a mean
    # near 20 is off by up to 20 * 2^-24 ~ 1.2e-6, and so is every centered value)
    tol = 2e-5 if dtype == torch.float32 else 2e-6
    for got, want in ((dx, x64.grad), (dw, w64.grad)):
        err = (got.double() - want).abs().max().item()
        assert err <= tol * want.abs().max().item(), (err, want.abs().max())
    if r64 is not None:
        assert torch.equal(r64.grad, x64.grad)  # the same gradient reaches both summands
    if kind == "layer_norm":
        err = (db.double() - b64.grad).abs().max().item()
        assert err <= tol * b64.grad.abs().max().item()
    else:
        assert db is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_swiglu_and_gelu_reference_match_float64_autograd(dtype):
    g = torch.Generator().manual_seed(5)
    gate, up, x, d = (torch.randn(3, 67, generator=g, dtype=torch.float64) * 4 for _ in range(4))
    gate64, up64, x64 = (t.clone().requires_grad_() for t in (gate, up, x))
    a64 = F.silu(gate64) * up64
    (a64 * d).sum().backward()
    a = fused.swiglu_forward(gate.to(dtype), up.to(dtype))
    dgate, dup = fused.swiglu_backward(d.to(dtype), gate.to(dtype), up.to(dtype))
    _close(a, a64.detach(), dtype)
    _close(dgate, gate64.grad, dtype)
    _close(dup, up64.grad, dtype)

    y64 = F.gelu(x64, approximate="tanh")
    (y64 * d).sum().backward()
    _close(fused.gelu_forward(x.to(dtype)), y64.detach(), dtype)
    _close(fused.gelu_backward(d.to(dtype), x.to(dtype)), x64.grad, dtype)


def test_cpu_calls_take_the_torch_path():
    x, r, w, b, dy, dh = _inputs((4, 16), torch.bfloat16, seed=1)
    assert not fused.kernel_path("add_norm_forward", x, r, w, b, 1e-5, "layer_norm")
    assert not fused.kernel_path("swiglu_forward", x, r)
    y, h, mean, rstd = fused.add_norm_forward(x, r, w, b, 1e-5, "layer_norm")
    ry, rh, rmean, rrstd = fused.add_norm_forward_reference(x, r, w, b, 1e-5, "layer_norm")
    assert torch.equal(y, ry) and torch.equal(h, rh) and torch.equal(rstd, rrstd)
    assert y.dtype == torch.bfloat16


def test_unknown_norm_kind_is_refused():
    x = torch.randn(2, 8)
    with pytest.raises(ValueError, match="norm kind"):
        fused.add_norm_forward(x, None, torch.ones(8), None, 1e-5, "group_norm")
    with pytest.raises(ValueError, match="op"):
        fused.kernel_path("softmax", x)


# --------------------------------------------------------------------------- on the host
#
# The kernels' logic (indexing, the row loops, the shuffle / shared-memory sums, the
# workspace and its column reduce, the scalar tail) run on the CPU: the rendered source is
# compiled as C++ by the host compiler against a few definitions of CUDA's built-ins (a
# block's threads are std::threads meeting at std::barriers, a warp's shuffle an exchange
# through memory; blocks run one after another, so a `static` stands for `__shared__`).
# What only the GPU can say (timing, the PTX conversions, alignment faults) is
# tests/gpu/test_fused_gpu.py's.

from . import host_emulation  # noqa: E402

_HOST_BUILDS: dict = {}


def _host_kernel(spec, render=None):
    """``spec``'s kernel built for the host: a ctypes function host_launch(grid, bx, by,
    *the kernel's arguments). ``render``: its renderer, if not the seams'."""
    if spec not in _HOST_BUILDS:
        plan = spec.plan if isinstance(spec, S.AddNormBackwardSpec) else None
        _HOST_BUILDS[spec] = host_emulation.build(
            (render or S.render)(spec), spec.kernel_name, spec.params(),
            plan.cluster if plan else 1, plan.smem_bytes if plan else 0)
    return _HOST_BUILDS[spec]


def _p(t):
    return None if t is None else t.data_ptr()


HOST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _host_close(name, got, want, dtype):
    want = want.double()
    err = (got.double() - want).abs()
    rtol = {torch.bfloat16: 2 ** -7, torch.float16: 2 ** -10}[dtype]
    bound = rtol * want.abs() + 2e-3 * want.abs().max()
    assert (err <= bound).all(), (name, (err - bound).max().item())


@pytest.mark.parametrize("dtype, hidden, rows, grid, kind, residual", [
    ("bf16", 4096, 5, 2, "layer_norm", True),    # register-held, a block of 128 a row
    ("fp16", 7, 11, 2, "rms_norm", True),        # single values, 4 rows a block
    ("bf16", 100, 9, 1, "layer_norm", False),    # 8-byte vectors, no residual
    ("bf16", 20000, 3, 2, "rms_norm", True),     # streamed (the row read again)
    ("fp16", 20000, 2, 1, "layer_norm", True),
])
def test_forward_runs_on_the_host(dtype, hidden, rows, grid, kind, residual):
    tdt = HOST_DTYPES[dtype]
    g = torch.Generator().manual_seed(hidden + rows)
    x = (torch.randn(rows, hidden, generator=g) * 2 + 30 * (torch.arange(rows) % 2)[:, None]).to(tdt)
    r = torch.randn(rows, hidden, generator=g).to(tdt) if residual else None
    w = (torch.rand(hidden, generator=g) + 0.5).to(tdt)
    b = torch.randn(hidden, generator=g).to(tdt) if kind == "layer_norm" else None
    spec = S.AddNormForwardSpec(kind, dtype, hidden, residual, b is not None)
    h = torch.empty_like(x) if residual else None
    y = torch.full_like(x, float("nan"))
    mean = torch.full((rows,), float("nan"))
    rstd = torch.full((rows,), float("nan"))
    plan = spec.plan
    _host_kernel(spec)(grid, *plan.block[:2], _p(x), _p(r), _p(w), _p(b), _p(h), _p(y),
                       _p(mean), _p(rstd), 1e-5, rows)
    # the norm of the residual stream as stored (x + r rounded to the dtype)
    stream = x if r is None else x + r
    ry, _, rmean, rrstd = fused.add_norm_forward_reference(
        stream.double(), None, w.double(), None if b is None else b.double(), 1e-5, kind)
    if residual:
        assert torch.equal(h, x + r)
    _host_close("y", y, ry, tdt)
    assert torch.allclose(rstd.double(), rrstd.double(), rtol=1e-5)
    if kind == "layer_norm":
        assert torch.allclose(mean.double(), rmean.double(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype, hidden, rows, teams, kind, with_dh, offset, vector, rule", [
    ("bf16", 4096, 5, 2, "layer_norm", True, 0, 8, "in_flight"),   # 2 rows a tile, 16-byte vectors
    ("fp16", 768, 9, 3, "rms_norm", False, 0, 8, "in_flight"),     # 4 rows a tile
    ("bf16", 7, 40, 2, "layer_norm", False, 0, 1, "in_flight"),    # single values, 16 rows a tile
    ("bf16", 1, 300, 2, "layer_norm", False, 0, 1, "in_flight"),   # one value a row
    ("fp16", 1, 50, 3, "rms_norm", True, 0, 1, "in_flight"),
    ("bf16", 4097, 7, 2, "rms_norm", True, 0, 1, "in_flight"),     # rows at every 2-byte offset
    ("bf16", 5140, 5, 2, "layer_norm", True, 0, 4, "in_flight"),   # rows 8- or 16-byte aligned
    ("fp16", 4098, 4, 1, "layer_norm", False, 0, 2, "in_flight"),
    # bases 2 bytes off: single values
    ("bf16", 512, 37, 2, "layer_norm", True, 1, 1, "in_flight"),
    ("bf16", 1024, 9, 2, "rms_norm", True, 2, 2, "in_flight"),     # 4 bytes off: pairs, shifted
    ("bf16", 16384, 3, 2, "layer_norm", True, 0, 8, "in_flight"),  # a cluster of 2
    ("fp16", 16385, 3, 1, "rms_norm", True, 0, 1, "in_flight"),    # a cluster of 4, single values
    # a cluster of 4 whose last slice is shorter: its copies take the general loop, the
    # others' the unrolled one
    ("bf16", 16392, 3, 1, "rms_norm", True, 0, 8, "in_flight"),
    # a cluster with 2 stages: no defer
    ("bf16", 16384, 4, 1, "layer_norm", True, -1, 8, "in_flight"),
    # the fewest_clusters rule: one CTA, three vectors a thread, n and g read again
    ("bf16", 8704, 5, 2, "layer_norm", True, 0, 8, "fewest_clusters"),
    ("fp16", 16896, 3, 1, "rms_norm", True, 0, 8, "fewest_clusters"),  # a cluster of 2, k3
    # a cluster's share slots reused, each slot's mbarrier through several phases, shares
    # landing before their slot is armed; teams of unequal row counts
    ("fp16", 16896, 19, 1, "rms_norm", False, 0, 8, "fewest_clusters"),
    ("bf16", 33280, 11, 2, "layer_norm", True, 0, 8, "fewest_clusters"),
    # one CTA of three stages: not deferred, two tiles in flight
    ("bf16", 16384, 4, 2, "rms_norm", False, 0, 8, "fewest_clusters"),
    ("bf16", 9216, 5, 2, "layer_norm", True, 0, 8, "fewest_clusters"),
    # the fitted rule: 96 threads x 5 rows, 160 x 3, and a cluster of 2 CTAs of 288 threads
    ("bf16", 768, 12, 2, "layer_norm", True, 0, 8, "fitted"),
    ("fp16", 2560, 8, 2, "rms_norm", False, 0, 8, "fitted"),
    ("bf16", 8704, 3, 2, "layer_norm", True, 0, 8, "fitted"),
    ("bf16", 768, 6, 2, "layer_norm", True, 1, 1, "fitted"),  # bases 2 bytes off: v1 k12
    # rows on 16 bytes at every 16-byte phase of a 128-byte line: one CTA's spans
    # bulk-copied from their lines (`BackwardPlan.line`), a base 16 bytes into a line
    ("bf16", 8200, 5, 2, "rms_norm", True, 0, 8, "fewest_clusters"),
    ("bf16", 8200, 4, 2, "layer_norm", False, 8, 8, "fewest_clusters"),
    # 48 bytes past 64 (torch's CPU buffers are on 64 bytes: 48 or 112 into a line)
    ("bf16", 8200, 3, 2, "rms_norm", False, 24, 8, "fewest_clusters"),
    ("bf16", 12296, 3, 2, "layer_norm", True, 0, 8, "fewest_clusters"),
    # a cluster's shorter last slice (a width that does not split evenly), bulk-copied at
    # its own length: two CTAs of 10248 and 10240 columns (16392 above: four, with dh)
    ("bf16", 20488, 5, 2, "layer_norm", False, 0, 8, "fewest_clusters"),
])
def test_backward_and_column_reduce_run_on_the_host(dtype, hidden, rows, teams, kind, with_dh,
                                                    offset, vector, rule):
    _backward_on_the_host(dtype, hidden, rows, teams, kind, with_dh, offset, vector, rule)


@pytest.mark.parametrize("dtype, hidden, rows, teams, kind, with_dh, offset, plan", [
    # rows off 16 bytes at their phase: PERIOD 8 (odd widths), every phase; one CTA
    ("bf16", 6001, 19, 8, "rms_norm", True, 0, "v8 t512x1 k2 c1 s4 hold phased"),
    ("bf16", 7001, 13, 9, "layer_norm", False, 1, "v8 t512x1 k2 c1 s4 hold phased"),
    ("fp16", 9999, 11, 8, "layer_norm", False, 3, "v8 t512x1 k3 c1 s4 phased"),  # n, g read again
    ("bf16", 6002, 9, 4, "layer_norm", True, 0, "v8 t512x1 k2 c1 s4 hold phased"),  # PERIOD 4
    ("bf16", 4620, 7, 3, "rms_norm", False, 2, "v8 t512x1 k2 c1 s5 hold phased"),   # PERIOD 2
    # clusters: each CTA's slice at the row's phase
    ("bf16", 20001, 9, 8, "layer_norm", True, 0, "v8 t512x1 k3 c2 s3 phased"),
    ("bf16", 30001, 5, 8, "rms_norm", False, 1, "v8 t512x1 k2 c4 s4 hold phased"),
    # PERIOD 1: a width of 16-byte rows on a base 2 bytes off; one CTA, not deferred
    ("bf16", 8184, 7, 3, "rms_norm", True, 1, "v8 t512x1 k2 c1 s4 hold phased"),
    ("bf16", 16369, 5, 8, "layer_norm", False, 2, "v8 t512x1 k4 c1 s3 phased"),
])
def test_backward_at_the_rows_phase_runs_on_the_host(dtype, hidden, rows, teams, kind,
                                                     with_dh, offset, plan):
    _backward_on_the_host(dtype, hidden, rows, teams, kind, with_dh, offset, 8,
                          "fewest_clusters", plan)


def _backward_on_the_host(dtype, hidden, rows, teams, kind, with_dh, offset, vector, rule,
                          phased_plan=None):
    """The backward's row kernel and its column reduce, host-compiled, against float64:
    ``phased_plan``, the plan of dy, h, dh and dx at one phase (the one described)."""
    tdt = HOST_DTYPES[dtype]
    g = torch.Generator().manual_seed(hidden * 3 + rows)

    lead = 64 + max(0, offset)  # values of a buffer before its view (`make`)

    def make(t):  # `offset` values into a larger buffer: the base off 16-byte alignment
        # (NaN around it, a 128-byte line either side: a kernel reading the 16-byte cover
        # or the line of a row must not use it)
        buf = torch.full((lead + t.numel() + 64,), float("nan"), dtype=tdt)
        view = buf[lead:lead + t.numel()].view(t.shape)
        view.copy_(t)
        return view

    h0 = torch.randn(rows, hidden, generator=g)
    h = make((h0 + 10 * (torch.arange(rows) % 3)[:, None]).to(tdt))
    w = make((torch.rand(hidden, generator=g) + 0.5).to(tdt))
    # dy along the row's normalized values, scaled and offset per row: each row's two sums
    # (sum g n, sum g) are of the order of the width and differ from row to row, so a
    # share of the wrong row, or a lost one, moves dx well past the tolerance
    scale = (1 + torch.arange(rows) % 5)[:, None].float()
    dy = make((0.5 * torch.randn(rows, hidden, generator=g) + scale * (h0 + 0.3)).to(tdt))
    dh = make(torch.randn(rows, hidden, generator=g).to(tdt)) if with_dh else None
    _, _, mean, rstd = fused.add_norm_forward_reference(h, None, w, None, 1e-5, kind)
    # offset -1: aligned, on a GPU of 120 kB of shared memory a block (and a bandwidth
    # that two stages serve)
    hw = S.Hardware(smem_per_block=120000, dram_bytes_per_s=1e9) if offset < 0 else S.SM90
    spec = S.AddNormBackwardSpec(kind, dtype, hidden, with_dh, fused._alignment(dy, h, dh, w),
                                 hw, rule, phased_plan is not None)
    assert (spec.plan.stages == 2) == (offset < 0)
    plan = spec.plan
    assert plan.vector == vector
    assert plan.describe() == phased_plan if phased_plan else not plan.phased
    parts = teams
    if plan.phased:  # a team for each class of rows (the runtime's grid keeps it so)
        assert teams >= S.phase_period(hidden) or rows <= teams
    ws = torch.full((spec.sets * parts * hidden,), float("nan"))
    dx = make(torch.full((rows, hidden), float("nan")).to(tdt))
    _host_kernel(spec)(teams * plan.cluster, *plan.block[:2], _p(dy), _p(h), _p(w), _p(mean),
                       _p(rstd), _p(dh), _p(dx), _p(ws), rows)
    assert not ws.isnan().any()  # every slot wrote its whole row, rows met or not
    spare = dx._base  # nothing written around dx (its buffer's NaN padding)
    assert spare[:lead].isnan().all() and spare[lead + dx.numel():].isnan().all()
    dw = torch.full_like(w, float("nan"))
    db = torch.full_like(w, float("nan")) if kind == "layer_norm" else None
    red = S.ColumnReduceSpec(dtype, spec.sets)
    _host_kernel(red)(red.grid(hidden)[0], *S.REDUCE_BLOCK[:2], _p(ws), _p(dw),
                      _p(db), parts, hidden)
    want = fused.add_norm_backward_reference(dy.double(), h.double(), w.double(),
                                             None if mean is None else mean.double(),
                                             rstd.double(), kind,
                                             None if dh is None else dh.double())
    _host_close("dx", dx, want[0], tdt)
    _host_close("dweight", dw, want[1], tdt)
    if kind == "layer_norm":
        _host_close("dbias", db, want[2], tdt)


@pytest.mark.parametrize("sets, parts, hidden", [
    (1, 130, 100),  # the four-loads loop (more than 96 parts) and its tail; ragged columns
    (2, 130, 100),
    (2, 97, 64),
    (2, 5, 33),     # fewer parts than lanes
])
def test_column_reduce_runs_on_the_host(sets, parts, hidden):
    g = torch.Generator().manual_seed(parts * 7 + hidden)
    ws = torch.randn(sets, parts, hidden, generator=g)
    outs = [torch.full((hidden,), float("nan"), dtype=torch.bfloat16) for _ in range(2)]
    red = S.ColumnReduceSpec("bf16", sets)
    _host_kernel(red)(red.grid(hidden)[0], *S.REDUCE_BLOCK[:2], _p(ws.reshape(-1)),
                      _p(outs[0]), _p(outs[1]), parts, hidden)
    want = ws.double().sum(1)
    for s in range(sets):
        _host_close(f"set {s}", outs[s], want[s], torch.bfloat16)
    if sets == 1:
        assert outs[1].isnan().all()  # no second set: its output untouched


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("op", sorted(S.ELEMENTWISE_OPS))
@pytest.mark.parametrize("n, alignment", [(1003, 16), (37, 2)])
def test_elementwise_runs_on_the_host(dtype, op, n, alignment):
    tdt = HOST_DTYPES[dtype]
    g = torch.Generator().manual_seed(n)
    nin, nout = S.ELEMENTWISE_OPS[op]
    ins = [(torch.randn(n, generator=g) * 3).to(tdt) for _ in range(nin)]
    outs = [torch.full((n,), float("nan"), dtype=tdt) for _ in range(nout)]
    spec = S.ElementwiseSpec(op, dtype, alignment)
    _host_kernel(spec)(3, S.ELEMENTWISE_THREADS, 1, *(_p(t) for t in ins + outs), n)
    ref = getattr(fused, op + "_reference")(*(t.double() for t in ins))
    ref = ref if isinstance(ref, tuple) else (ref,)
    for k, (got, want) in enumerate(zip(outs, ref)):
        _host_close(f"{op}[{k}]", got, want, tdt)


class _NoKernel:
    """The loaded kernel of a launch record built without a GPU."""

    def ensure_smem(self, nbytes):
        pass


def _host_dispatch(monkeypatch, sm_count=3):
    """runtime.fused's launches sent to the host builds (CPU tensors; launch records built
    for a device of ``sm_count`` SMs holding one CTA each): the arguments it packs must
    be the kernel's parameters, in order, and its grids must cover the work."""
    from lowering.kernels import rotary as rotary_kernels

    def launch(*launches):
        for record, grid, args in launches:
            spec = record.spec
            values = [a.item() if a.dtype.kind in "iuf" else a for a in args]
            values = [None if (isinstance(v, int) and v == 0 and t.endswith("*")) else v
                      for v, (t, _) in zip(values, spec.params())]
            render = rotary_kernels.render if isinstance(spec, rotary_kernels.RotarySpec) else None
            _host_kernel(spec, render)(grid[0], *record.block[:2], *values)

    monkeypatch.setattr(fused, "_RECORDS", {})
    monkeypatch.setattr(fused, "_launch", launch)
    monkeypatch.setattr(fused, "_kernel", lambda spec, index, render=None: _NoKernel())
    monkeypatch.setattr(fused, "_resident_blocks", lambda kernel, threads, smem=0: 1)
    monkeypatch.setattr(fused, "_active_clusters", lambda kernel, cluster, threads, smem: 0)
    monkeypatch.setattr(fused, "_sm_count", lambda index: sm_count)
    monkeypatch.setattr(fused, "device_hardware", lambda index: S.SM90)
    monkeypatch.setattr(fused, "_dependent_launch", lambda index: True)


@pytest.mark.parametrize("kind", fused.NORM_KINDS)
def test_dispatch_packs_the_kernels_arguments(monkeypatch, kind):
    _host_dispatch(monkeypatch)
    rows, hidden, dt = 6, 256, torch.bfloat16
    g = torch.Generator().manual_seed(2)
    x, r, dy, dh = (torch.randn(2, rows // 2, hidden, generator=g).to(dt) for _ in range(4))
    w = (torch.rand(hidden, generator=g) + 0.5).to(dt)
    b = torch.randn(hidden, generator=g).to(dt) if kind == "layer_norm" else None
    y, h, mean, rstd = fused.add_norm_forward_fused(x, r, w, b, 1e-5, kind)
    assert torch.equal(h, x + r) and rstd.shape == (2, rows // 2)
    ry, _, rmean, rrstd = fused.add_norm_forward_reference(h.double(), None, w.double(),
                                                           None if b is None else b.double(),
                                                           1e-5, kind)
    _host_close("y", y, ry, dt)
    assert torch.allclose(rstd.double(), rrstd.double(), rtol=1e-5)
    dx, dw, db = fused.add_norm_backward_fused(dy, h, w, mean, rstd, kind, dh)
    want = fused.add_norm_backward_reference(dy.double(), h.double(), w.double(),
                                             None if mean is None else mean.double(),
                                             rstd.double(), kind, dh.double())
    _host_close("dx", dx, want[0], dt)
    _host_close("dweight", dw, want[1], dt)
    assert (db is None) == (kind == "rms_norm")
    if db is not None:
        _host_close("dbias", db, want[2], dt)


def test_dispatch_packs_the_elementwise_arguments(monkeypatch):
    _host_dispatch(monkeypatch, sm_count=2)
    monkeypatch.setattr(fused, "_usable", lambda *tensors: True)
    g = torch.Generator().manual_seed(4)
    gate, up, d = (torch.randn(5, 41, generator=g).to(torch.float16) for _ in range(3))
    _host_close("swiglu", fused.swiglu_forward(gate, up),
                fused.swiglu_forward_reference(gate.double(), up.double()), torch.float16)
    for got, want in zip(fused.swiglu_backward(d, gate, up),
                         fused.swiglu_backward_reference(d.double(), gate.double(), up.double())):
        _host_close("dswiglu", got, want, torch.float16)
    _host_close("gelu", fused.gelu_forward(gate), fused.gelu_forward_reference(gate.double()),
                torch.float16)
    _host_close("dgelu", fused.gelu_backward(d, gate),
                fused.gelu_backward_reference(d.double(), gate.double()), torch.float16)


@pytest.mark.parametrize("dtype, hq, hkv, d, pad", [("bf16", 4, 2, 16, 0),
                                                    ("fp16", 3, 1, 12, 2)])
def test_rotary_runs_on_the_host_through_the_seam_launcher(monkeypatch, dtype, hq, hkv, d, pad):
    """`runtime.rotary`'s launches (through `runtime.fused._launch`, its own renderer):
    both directions against float64, a qkv with a row pitch, outputs poisoned first."""
    from hostir.nn.transformer import rotary_tables
    from runtime import rotary

    _host_dispatch(monkeypatch, sm_count=1)
    tdt, t = HOST_DTYPES[dtype], 5
    g = torch.Generator().manual_seed(d + pad)
    width = (hq + 2 * hkv) * d
    qkv = torch.randn(t, width + pad, generator=g).to(tdt)[:, :width]
    cos, sin = rotary_tables(t, d, 10000.0, "cpu", tdt)
    tables = cos.reshape(t, d).contiguous(), sin.reshape(t, d).contiguous()
    outs = tuple(torch.full((t, h, d), float("nan"), dtype=tdt) for h in (hq, hkv, hkv))
    rotary._launch(False, qkv, outs, *tables, hq, hkv)
    want = rotary.rotary_forward_reference(qkv.double(), cos.double(), sin.double(), hq, hkv)
    for name, got, ref in zip("qkv", outs, want):
        _host_close(name, got, ref, tdt)
    grads = [torch.randn(o.shape, generator=g).to(tdt) for o in outs]
    d_qkv = torch.full((t, width), float("nan"), dtype=tdt)
    rotary._launch(True, d_qkv, grads, *tables, hq, hkv)
    ref = rotary.rotary_backward_reference(*(x.double() for x in grads), cos.double(),
                                           sin.double(), hq, hkv)
    _host_close("d_qkv", d_qkv, ref, tdt)

