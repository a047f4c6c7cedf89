"""Generated normalization kernels on a GPU: against float64, poisoned outputs, bad inputs."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("cupy")

from hostir.errors import InputMismatchError, LoweringError  # noqa: E402
import dataclasses  # noqa: E402

from lowering.kernels.normalization import (  # noqa: E402
    NormalizationSpec, candidate_plans, persistent_candidates,
)
from runtime import normalization as rn  # noqa: E402

pytestmark = pytest.mark.gpu
HIDDEN = (768, 1024, 1600, 4096, 5140, 20480, 77, 1601, 1026)


def _inputs(rows, hidden, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(rows, hidden, device="cuda", generator=g)
    x[1::5] = x[1::5] * 4 + 500.0  # rows with a large mean: one-pass variance would fail here
    params = [torch.randn(hidden, device="cuda", generator=g) for _ in range(4)]
    return [t.to(dtype) for t in (x, *params)]


def _rel(y, ref):
    assert torch.isfinite(y).all(), "unwritten (NaN-poisoned) or non-finite output"
    return float((y.double() - ref).norm() / ref.norm())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("hidden", HIDDEN)
def test_fused_layer_norm_and_rms_norm_match_float64(hidden, dtype):
    rows = 301  # not a multiple of rows_per_block
    x, b0, b1, w, b2 = _inputs(rows, hidden, dtype, seed=hidden)
    name = rn._NAMES[dtype]
    poison = lambda: torch.full_like(x, float("nan"))  # noqa: E731

    spec = NormalizationSpec.reference_fusion(rows, hidden, 1e-5, name)
    ref = rn.reference(spec, {"x": x, "b0": b0, "b1": b1, "weight": w, "bias": b2})
    assert _rel(rn.layer_norm_fused(x, b0, b1, w, b2, 1e-5, out=poison()), ref) < 1e-2

    ref = rn.reference(NormalizationSpec.layer_norm(rows, hidden, 1e-5, name), {"x": x, "weight": w, "bias": b2})
    assert _rel(rn.layer_norm(x, w, b2, 1e-5, out=poison()), ref) < 1e-2

    ref = rn.reference(NormalizationSpec.rms_norm(rows, hidden, 1e-6, name), {"x": x, "weight": w})
    assert _rel(rn.rms_norm(x, w, 1e-6, out=poison()), ref) < 1e-2


def test_matches_torch_layer_norm_per_row():
    x, _, _, w, b, *_ = _inputs(64, 4096, torch.float16, seed=7)
    got = rn.layer_norm(x, w, b, 1e-5)
    want = torch.nn.functional.layer_norm(x.float(), (4096,), w.float(), b.float(), 1e-5)
    assert (got.float() - want).abs().max() < 2e-2 * want.abs().max()


def test_misaligned_input_on_either_kernel():
    """A base 2 bytes off 16-byte alignment: the default plan (a register kernel for a
    LayerNorm this wide) and the shared-row kernel, pinned."""
    x, b0, b1, w, b2 = _inputs(33, 1025, torch.float16, seed=3)
    xs = x.reshape(-1)[1:1 + 32 * 1025].reshape(32, 1025)  # base no longer 16-byte aligned
    spec = NormalizationSpec.layer_norm(32, 1025, alignment=2)
    ref = rn.reference(spec, {"x": xs, "weight": w, "bias": b2})
    assert _rel(rn.layer_norm(xs, w, b2), ref) < 1e-2
    pinned = dataclasses.replace(spec, shared_row=True)
    assert pinned.plan.shared_row
    y = rn.normalize(pinned, {"x": xs, "weight": w, "bias": b2}, torch.full_like(xs, float("nan")))
    assert _rel(y, ref) < 1e-2


def test_stream_and_leading_dims():
    x, _, _, w, b, *_ = _inputs(48, 2048, torch.float16, seed=5)
    x3 = x.reshape(4, 12, 2048)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())  # the inputs were made on the default stream
    with torch.cuda.stream(s):
        y = rn.layer_norm(x3, w, b)
    s.synchronize()
    assert y.shape == x3.shape
    ref = rn.reference(NormalizationSpec.layer_norm(48, 2048), {"x": x3, "weight": w, "bias": b})
    assert _rel(y, ref) < 1e-2


@pytest.mark.parametrize("bad, message", [
    (lambda x, w, b: (x.float(), w, b), "dtype"),
    (lambda x, w, b: (x, w[:-1], b), "weight: expected shape"),
    (lambda x, w, b: (x, w, b.bfloat16()), "bias: expected dtype"),
    (lambda x, w, b: (x.t(), w, b), "contiguous|shape"),
    (lambda x, w, b: (x.cpu(), w, b), "CUDA"),
])
def test_bad_inputs_are_refused(bad, message):
    x, _, _, w, b, *_ = _inputs(64, 64, torch.float16, seed=1)
    with pytest.raises(InputMismatchError, match=message):
        rn.layer_norm(*bad(x, w, b))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("hidden", [768, 1600, 5140, 16384, 20480, 77])
def test_every_candidate_plan_matches_float64(hidden, dtype):
    """Row-wise and persistent (registers, shared, prefetch into registers or through
    shared memory) plans, on rows that are no multiple of anything, and on a grid
    smaller than the groups (the grid-stride loop runs several rows a block)."""
    rows = 301
    x, b0, b1, w, b2 = _inputs(rows, hidden, dtype, seed=hidden + 1)
    name = rn._NAMES[dtype]
    base = NormalizationSpec.reference_fusion(rows, hidden, 1e-5, name)
    named = {"x": x, "b0": b0, "b1": b1, "weight": w, "bias": b2}
    ref = rn.reference(base, named)
    width = base.plan.vector_width
    specs = [dataclasses.replace(base, threads_per_row=p.threads_per_row, batch=p.batch,
                                 param_cache="none")
             for p in candidate_plans(hidden, width, 2)]
    specs += [dataclasses.replace(base, threads_per_row=p.threads_per_row, batch=p.batch,
                                  rows_per_block=p.rows_per_block, param_cache=p.param_cache,
                                  prefetch=p.prefetch, x_staged=p.x_staged or None,
                                  stages=p.stages if p.x_staged else None,
                                  one_pass=p.one_pass or None, packed=p.packed or None,
                                  x_bulk=p.x_bulk or None,
                                  shared_param_bytes=p.shared_param_bytes or None)
              for p in persistent_candidates(hidden, width, 2, 8, name == "bfloat16", (2, 2, 2, 2))]
    assert [s.plan for s in specs[-len(persistent_candidates(hidden, width, 2, 8, name == "bfloat16", (2, 2, 2, 2))):]] \
        == persistent_candidates(hidden, width, 2, 8, name == "bfloat16", (2, 2, 2, 2))  # packed ones too
    assert len(specs) > 1
    for spec in specs:
        y = torch.full_like(x, float("nan"))
        rn.normalize(spec, named, y)
        assert _rel(y, ref) < 1e-2, spec.plan


@pytest.mark.parametrize("hidden", [1024, 4096, 12288])
@pytest.mark.parametrize("norm", ["layer_norm", "rms_norm"])
def test_deep_ring_and_one_pass_on_rows_with_a_large_mean(hidden, norm):
    """Three rows of x ahead, the one-pass (Chan) reduction, tensors through L2, the L2
    hints on the cp.async of x, on rows
    whose mean is 1000x their spread (where E[x^2] - E[x]^2 would lose every digit), on
    more rows than the grid holds (the ring wraps many times)."""
    rows = 2000
    gen = torch.Generator(device="cuda").manual_seed(hidden)
    x = (torch.randn(rows, hidden, device="cuda", generator=gen) + 1000.0).half()
    w = torch.randn(hidden, device="cuda", generator=gen).half()
    b = torch.randn(hidden, device="cuda", generator=gen).half()
    make = getattr(NormalizationSpec, norm)
    named = {"x": x, "weight": w} if norm == "rms_norm" else {"x": x, "weight": w, "bias": b}
    base = make(rows, hidden)
    ref = rn.reference(base, named)
    t = min(512, hidden // 16)  # two or three 16-byte vectors a thread
    for kw in (dict(param_cache="global", x_staged=True, stages=3, one_pass=True,
                    threads_per_row=t),
               dict(param_cache="shared", x_staged=True, stages=2, one_pass=True),
               dict(param_cache="registers", x_staged=True, stages=2, one_pass=False),
               dict(param_cache="registers", x_staged=True, stages=2, l2_hint="evict_first"),
               dict(param_cache="shared", x_staged=True, l2_hint="prefetch_256b")):
        spec = dataclasses.replace(base, **kw)
        y = torch.full_like(x, float("nan"))
        rn.normalize(spec, named, y)
        assert _rel(y, ref) < 1e-2, spec.plan



@pytest.mark.parametrize("hidden", [768, 1024, 4096, 5140, 12288, 16384, 20480])
def test_resident_blocks_keep_the_plans_promise(hidden):
    """The driver fits at least the blocks per SM the plan promised ptxas (registers and
    shared memory), so the persistent grid is resident at once."""
    spec = NormalizationSpec.reference_fusion(8192, hidden)
    kernel = rn._kernel(spec, torch.cuda.current_device())
    assert rn.resident_blocks(kernel, spec.plan) >= spec.plan.min_blocks_per_sm


def test_bench_sm_copy_copies_and_refuses_odd_sizes():
    from hostir.jobs.layer_norm import sm_copy

    x = torch.randn(513, 1600, device="cuda", dtype=torch.float16)  # not a multiple of the grid
    y = torch.full_like(x, float("nan"))
    sm_copy(x, y)
    torch.cuda.synchronize()
    assert torch.equal(x, y)
    with pytest.raises(ValueError):
        sm_copy(x[:, :5], torch.empty(513, 5, device="cuda", dtype=torch.float16))


def test_bench_side_by_side_times_each_candidate():
    from runtime.autotune import graph_side_by_side

    a = torch.randn(1 << 22, device="cuda")
    b = torch.empty_like(a)
    calls = {"copy": [lambda: b.copy_(a)], "twice": [lambda: (b.copy_(a), b.copy_(a))]}
    us = graph_side_by_side(calls, 4)
    assert set(us) == {"copy", "twice"}
    assert 0 < us["copy"] < us["twice"]  # two copies take longer than one


def test_autotune_checks_times_stores_and_calls_use_the_winner(tmp_path, capsys):
    """tune() checks every candidate against float64, times the finalists and the
    heuristic's pick again side by side, stores the winner; layer_norm_fused then runs
    it (for any row count), and its output still matches float64."""
    from hostir.options import options, set_options
    from lowering.kernels.normalization import tune_plans

    saved = options()
    set_options(dataclasses.replace(saved, cache_dir=tmp_path, dumps=frozenset({"autotune"})))
    rn.clear_caches()
    try:
        spec = NormalizationSpec.reference_fusion(2048, 1600)
        best = rn.tune(spec, first_reps=2, finalists=2, final_reps=2)
        assert best.plan in tune_plans(spec)
        assert rn.stored_winner(spec) == best
        table = capsys.readouterr().out
        assert "timed again side by side" in table and "(heuristic)" in table
        assert table.count("final round") >= 2
        x, b0, b1, w, b2 = _inputs(301, 1600, torch.float16, 7)
        call = rn._spec("fused", 301, 1600, 1e-5, "float16", rn._alignment(x, b0, b1, w, b2, None), 0)
        assert call.plan == best.plan
        y = rn.layer_norm_fused(x, b0, b1, w, b2, 1e-5)
        ref = rn.reference(call, {"x": x, "b0": b0, "b1": b1, "weight": w, "bias": b2})
        assert _rel(y, ref) < 1e-2
    finally:
        set_options(saved)
        rn.clear_caches()


def test_autotune_never_picks_a_wrong_kernel(tmp_path, monkeypatch):
    """A candidate whose output is wrong is marked so and cannot win, even if fastest."""
    from hostir.options import options, set_options

    saved = options()
    set_options(dataclasses.replace(saved, cache_dir=tmp_path))
    spec = NormalizationSpec.reference_fusion(1024, 2048)
    real = rn.normalize
    heuristic = spec.plan

    def broken(s, tensors, out=None):  # every plan but the heuristic's writes zeros
        if s.plan != heuristic:
            out.zero_()
            return out
        return real(s, tensors, out)

    monkeypatch.setattr(rn, "normalize", broken)
    try:
        best = rn.tune(spec, first_reps=1, finalists=2, final_reps=1, store=False)
        assert best.plan == heuristic
        assert rn.stored_winner(spec) is None  # store=False
    finally:
        set_options(saved)


def test_autotune_keeps_the_heuristic_within_the_margin(tmp_path):
    """A plan must beat the heuristic's by the margin to replace it: with a margin of
    100% no plan can, and the heuristic's plan is what tune returns and stores."""
    from hostir.options import options, set_options

    saved = options()
    set_options(dataclasses.replace(saved, cache_dir=tmp_path))
    try:
        spec = NormalizationSpec.reference_fusion(1024, 4096)
        best = rn.tune(spec, first_reps=1, finalists=2, final_reps=1, margin=1.0)
        assert best.plan == spec.plan
        assert rn.stored_winner(spec).plan == spec.plan
    finally:
        set_options(saved)
        rn.clear_caches()


@pytest.mark.parametrize("hidden", [768, 1600, 12288])
@pytest.mark.parametrize("graph", [False, True])
def test_dependent_launches_read_what_the_launch_before_wrote(hidden, graph):
    """A chain y[k+1] = layer_norm(y[k]) enqueued back to back, each a programmatic
    dependent launch on sm_90+: every kernel reads its predecessor's output, poisoned with
    NaN until written, so a kernel touching x before ``griddepcontrol.wait`` returned
    would read NaN or a half-written row. Each step is checked against float64 from the
    y it read; also captured in a CUDA graph (programmatic edges) and replayed."""
    dev = torch.cuda.current_device()
    assert rn.dependent_launch(dev) == (torch.cuda.get_device_capability(dev)[0] >= 9)
    rows, steps = 4096, 8
    x, _, _, w, b = _inputs(rows, hidden, torch.float16, seed=hidden + 3)
    ys = [x] + [torch.full_like(x, float("nan")) for _ in range(steps)]

    def chain():
        for k in range(steps):
            rn.layer_norm(ys[k], w, b, 1e-5, out=ys[k + 1])

    if graph:
        chain()  # compile, load and prepare outside the capture
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            chain()
        for y in ys[1:]:
            y.fill_(float("nan"))
        torch.cuda.synchronize()
        g.replay()
    else:
        chain()
    torch.cuda.synchronize()
    spec = NormalizationSpec.layer_norm(rows, hidden, 1e-5)
    for k in range(steps):
        ref = rn.reference(spec, {"x": ys[k], "weight": w, "bias": b})
        assert _rel(ys[k + 1], ref) < 1e-2, f"step {k}"


def test_dependent_launch_can_be_disabled():
    from hostir.options import options, set_options

    saved = options()
    set_options(dataclasses.replace(saved, disabled=saved.disabled | {"dependent_launch"}))
    rn.clear_caches()
    try:
        dev = torch.cuda.current_device()
        assert not rn.dependent_launch(dev)
        spec = NormalizationSpec.layer_norm(64, 1600, 1e-5)
        p = rn._prepare(spec, dev)
        assert p.dependent is False
        x, _, _, w, b = _inputs(64, 1600, torch.float16, seed=5)
        ref = rn.reference(spec, {"x": x, "weight": w, "bias": b})
        assert _rel(rn.layer_norm(x, w, b, 1e-5), ref) < 1e-2
    finally:
        set_options(saved)
        rn.clear_caches()


# ------------------------------------------------------------ every width, the shared-row family

WIDTHS = (1, 7, 100, 513, 4097, 16385, 24575, 25088, 40001, 65535, 65536, 98304, 131072)


def _rows_for(hidden):
    """Rows enough for several rounds of the persistent row loop (the refill of each
    chunk with the block's next row runs: 513 has 32 x 132 blocks), within ~48 MB of x."""
    return max(3, min(20000, (24 << 20) // hidden))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("hidden", WIDTHS)
def test_default_plans_of_every_width_match_float64(hidden, dtype):
    rows = _rows_for(hidden)
    x, _, _, w, b = _inputs(rows, hidden, dtype, seed=hidden + 11)
    name = rn._NAMES[dtype]
    poison = lambda: torch.full_like(x, float("nan"))  # noqa: E731
    spec = NormalizationSpec.layer_norm(rows, hidden, 1e-5, name)
    ref = rn.reference(spec, {"x": x, "weight": w, "bias": b})
    assert _rel(rn.layer_norm(x, w, b, 1e-5, out=poison()), ref) < 1e-2, spec.plan.describe()
    spec = NormalizationSpec.rms_norm(rows, hidden, 1e-6, name)
    ref = rn.reference(spec, {"x": x, "weight": w})
    assert _rel(rn.rms_norm(x, w, 1e-6, out=poison()), ref) < 1e-2, spec.plan.describe()


@pytest.mark.parametrize("hidden", [513, 4097, 40001, 65536, 131072])
@pytest.mark.parametrize("offset", [1, 3, 8])
def test_shared_row_plans_on_unaligned_slices(hidden, offset):
    """x, w and out at offsets of 2-16 bytes from their allocations: the shared-row
    kernel reads the granules around each row and writes only the row's elements (the
    guard columns either side of out stay as they were)."""
    rows = min(64, _rows_for(hidden))
    x, _, _, w, b = _inputs(rows + 1, hidden + 1, torch.bfloat16, seed=offset)
    xs = x.reshape(-1)[offset:offset + rows * hidden].reshape(rows, hidden)
    ws, bs = w[1:], b[:-1]
    big = torch.full((rows * hidden + 2 * 16,), 7.0, device="cuda", dtype=torch.bfloat16)
    out = big[16 - offset % 8:16 - offset % 8 + rows * hidden].reshape(rows, hidden)
    spec = NormalizationSpec.layer_norm(rows, hidden, 1e-5, "bfloat16")
    ref = rn.reference(spec, {"x": xs, "weight": ws, "bias": bs})
    assert _rel(rn.layer_norm(xs, ws, bs, 1e-5, out=out), ref) < 1e-2
    start = 16 - offset % 8
    assert (big[:start] == 7.0).all() and (big[start + rows * hidden:] == 7.0).all()


@pytest.mark.parametrize("hidden", [4097, 30001])
def test_shared_row_fusion_matches_float64(hidden):
    """The prologue's tensors (recomputed in each pass) on the shared-row kernel."""
    rows = 301
    x, b0, b1, w, b2 = _inputs(rows, hidden, torch.bfloat16, seed=hidden)
    spec = dataclasses.replace(NormalizationSpec.reference_fusion(rows, hidden, 1e-5, "bfloat16"),
                               shared_row=True)  # pinned: LayerNorms take it only where needed
    assert spec.plan.shared_row
    inputs = {"x": x, "b0": b0, "b1": b1, "weight": w, "bias": b2}
    ref = rn.reference(spec, inputs)
    assert _rel(rn.normalize(spec, inputs, torch.full_like(x, float("nan"))), ref) < 1e-2
    assert _rel(rn.layer_norm_fused(x, b0, b1, w, b2, 1e-5), ref) < 1e-2  # the default plan


@pytest.mark.parametrize("hidden", [12288, 4097, 65536])
def test_every_shared_row_candidate_matches_float64(hidden):
    """Every block size the shared-row family may take for a row, pinned."""
    from lowering.kernels.normalization import shared_row_candidates

    rows = 2 * 132 * 4 + 7
    x, _, _, w, b = _inputs(rows, hidden, torch.float16, seed=5)
    base = NormalizationSpec.rms_norm(rows, hidden, 1e-6, "float16")
    ref = rn.reference(base, {"x": x, "weight": w})
    for plan in shared_row_candidates(hidden, 2, 2, base.rows_aligned)[::3]:
        spec = dataclasses.replace(base, shared_row=True, threads_per_row=plan.threads_per_row)
        y = rn.normalize(spec, {"x": x, "weight": w}, torch.full_like(x, float("nan")))
        assert _rel(y, ref) < 1e-2, plan.describe()


@pytest.mark.parametrize("hidden", [513, 4097, 12288, 65536, 131072])
def test_shared_row_blocks_keep_the_plans_promise(hidden):
    """The driver fits the shared-row plan's promised blocks an SM, with its dynamic
    shared memory (up to 224 KiB a block: the opt-in attribute is set)."""
    spec = dataclasses.replace(NormalizationSpec.layer_norm(8192, hidden, dtype="bfloat16"),
                               shared_row=True)
    assert spec.plan.shared_row
    kernel = rn._kernel(spec, torch.cuda.current_device())
    assert rn.resident_blocks(kernel, spec.plan) >= spec.plan.min_blocks_per_sm


# ------------------------------------------------------------ the envelope row-wise kernel


@pytest.mark.parametrize("hidden", [7, 513, 1001, 4097, 8191, 12345, 16384])
@pytest.mark.parametrize("norm", ["layer_norm", "rms_norm"])
def test_every_envelope_candidate_matches_float64(hidden, norm):
    """Every other chunk count the envelope kernel may take for a row, pinned (layer
    norms with two passes and with the shifted one-pass statistics, on rows with a large
    mean); rows not a multiple of a block's rows (the last block's spare rows load and
    store nothing)."""
    from lowering.kernels.normalization.planner import envelope_candidates

    rows = 1031
    x, _, _, w, b = _inputs(rows, hidden, torch.bfloat16, seed=hidden)
    base = getattr(NormalizationSpec, norm)(rows, hidden, 1e-5, "bfloat16")
    inputs = {"x": x, "weight": w} if norm == "rms_norm" else {"x": x, "weight": w, "bias": b}
    ref = rn.reference(base, inputs)
    plans = envelope_candidates(hidden, norm == "layer_norm")
    assert plans
    for plan in plans[::2]:
        for one_pass in ((None, True) if norm == "layer_norm" else (None,)):
            spec = dataclasses.replace(base, envelope=True, threads_per_row=plan.threads_per_row,
                                       batch=plan.batch, one_pass=one_pass)
            assert spec.plan.envelope
            y = rn.normalize(spec, inputs, torch.full_like(x, float("nan")))
            assert _rel(y, ref) < 1e-2, spec.plan.describe()


@pytest.mark.parametrize("hidden", [33280, 40001, 30008])
@pytest.mark.parametrize("norm", ["layer_norm", "rms_norm"])
def test_every_cluster_size_matches_float64(hidden, norm):
    """The envelope kernel's row split over clusters of 2-8 CTAs, pinned: many rows a
    cluster (its two sets of share slots and mbarriers reused in turn, the ring refilled
    a row ahead), and fewer rows than clusters; rows with a large mean (the layer norm's
    shifted one-pass statistics); rows at every 16-byte phase of a 128-byte line (30008:
    the envelope starts at the line, `LaunchPlan.envelope_line`)."""
    for rows in (1031, 3):
        x, _, _, w, b = _inputs(rows, hidden, torch.bfloat16, seed=hidden + rows)
        base = getattr(NormalizationSpec, norm)(rows, hidden, 1e-5, "bfloat16")
        inputs = {"x": x, "weight": w} if norm == "rms_norm" else {"x": x, "weight": w, "bias": b}
        ref = rn.reference(base, inputs)
        for cluster in range(2, 9):
            try:
                spec = dataclasses.replace(base, envelope=True, cluster=cluster)
                spec.plan  # noqa: B018
            except LoweringError:
                continue  # no plan of this many CTAs covers the row
            for _ in range(2):  # each row on its own: a lost or stale share moves one row
                y = rn.normalize(spec, inputs, torch.full_like(x, float("nan")))
                assert torch.isfinite(y).all(), spec.plan.describe()
                rows_err = (y.double() - ref).norm(dim=1) / ref.norm(dim=1)
                assert rows_err.max() < 1e-2, (spec.plan.describe(), rows_err.argmax().item())


@pytest.mark.parametrize("hidden", [513, 4097, 9999, 16385, 40001])
@pytest.mark.parametrize("offsets", [(1, 1), (3, 5), (8, 2)])
@pytest.mark.parametrize("norm", ["layer_norm", "rms_norm"])
def test_envelope_plans_on_unaligned_slices(hidden, offsets, norm):
    """x and out at their own offsets of 2-16 bytes (y's chunks then straddle other
    granules than x's: stored element by element), w and b unaligned: the default plan
    (the envelope kernel) writes only the rows' elements."""
    xo, yo = offsets
    rows = 300
    x, _, _, w, b = _inputs(rows + 1, hidden + 1, torch.bfloat16, seed=xo)
    xs = x.reshape(-1)[xo:xo + rows * hidden].reshape(rows, hidden)
    ws, bs = w[1:], b[:-1]
    big = torch.full((rows * hidden + 32,), 7.0, device="cuda", dtype=torch.bfloat16)
    out = big[16 - yo:16 - yo + rows * hidden].reshape(rows, hidden)
    spec = getattr(NormalizationSpec, norm)(rows, hidden, 1e-5, "bfloat16", alignment=2)
    # (rows past one block's at two an SM: split over a cluster, planner._envelope_rowwise)
    if norm == "rms_norm" or hidden >= 6144:
        assert spec.plan.envelope, spec.plan.describe()
    if norm == "layer_norm":
        ref = rn.reference(spec, {"x": xs, "weight": ws, "bias": bs})
        y = rn.layer_norm(xs, ws, bs, 1e-5, out=out)
    else:
        ref = rn.reference(spec, {"x": xs, "weight": ws})
        y = rn.rms_norm(xs, ws, 1e-5, out=out)
    assert _rel(y, ref) < 1e-2
    start = 16 - yo
    assert (big[:start] == 7.0).all() and (big[start + rows * hidden:] == 7.0).all()


def test_warmup_leaves_a_first_call_nothing_to_compile(tmp_path):
    """``warmup layer_norm|rms_norm`` on this GPU compiles the kernels that a later
    process's calls run (their specs planned with this device's model, a cluster plan
    among them): that process compiles none."""
    from tests.gpu.warm_cache import compiles_after_warmup

    widths = "4096,12345,40000"
    calls = (
        "import torch\n"
        "from runtime import normalization as rn\n"
        f"for h in ({widths},):\n"
        "    x = torch.randn(64, h, device='cuda', dtype=torch.bfloat16)\n"
        "    w = torch.randn(h, device='cuda', dtype=torch.bfloat16)\n"
        "    b = torch.randn(h, device='cuda', dtype=torch.bfloat16)\n"
        "    rn.layer_norm(x, w, b)\n"
        "    rn.rms_norm(x, w)\n")
    compiles, disk_hits = compiles_after_warmup(
        tmp_path, [[kind, "--hidden", widths, "--dtype", "bfloat16"]
                   for kind in ("layer_norm", "rms_norm")], calls, warmup_timeout=300)
    assert (compiles, disk_hits) == (0, 6)


@pytest.mark.parametrize("hidden", [4097, 24575])
def test_output_of_a_slice_off_16_bytes_lines_up_with_it(hidden):
    """x a batch cut from a wider tensor (its base 6 bytes past a 16-byte boundary): the
    output the call allocates has the same phase (whole-vector stores) and the values."""
    rows = 257
    x, _, _, w, b = _inputs(rows + 1, hidden, torch.bfloat16, seed=hidden)
    xs = x.reshape(-1)[3:3 + rows * hidden].view(rows, hidden)
    for y, ref in ((rn.rms_norm(xs, w, 1e-5), torch.nn.functional.rms_norm(
                        xs.double(), (hidden,), w.double(), 1e-5)),
                   (rn.layer_norm(xs, w, b, 1e-5), torch.nn.functional.layer_norm(
                        xs.double(), (hidden,), w.double(), b.double(), 1e-5))):
        assert y.data_ptr() % 16 == xs.data_ptr() % 16
        assert _rel(y, ref) < 1e-2
