"""The normalization planner's pick is always among the plans the layer_norm bench sweeps.

`python -m hostir.run layer_norm --bench` times, at each of its sizes, the heuristic's plan
side by side with every candidate plan of the sweep (`hostir.jobs.layer_norm.sweep_specs`):
that is how the planner's rules are judged against measured bandwidth. If the planner picked
a plan outside that set, the bench could no longer say whether a rival is faster. So, at
every benchmark size, the pick is one of the swept plans (the same geometry, field by field)
and appears once, and no two swept plans describe alike.
"""

from __future__ import annotations

import pytest

from hostir.jobs.layer_norm import HIDDEN, sweep_specs
from lowering.kernels.normalization import NormalizationSpec

ROWS = 8192
GEOMETRY = ("threads_per_row", "batch", "rows_per_block", "vector_width", "param_cache",
            "prefetch", "x_staged", "stages", "one_pass")


@pytest.mark.parametrize("hidden", HIDDEN)
def test_planner_pick_is_among_the_swept_plans(hidden):
    spec = NormalizationSpec.reference_fusion(ROWS, hidden)
    swept = [s.plan for s in sweep_specs(spec)]
    assert len(swept) > 1, "the sweep must time rivals beside the pick"
    matches = [p for p in swept if p.describe() == spec.plan.describe()]
    assert len(matches) == 1, (hidden, spec.plan.describe(), len(matches))
    for field in GEOMETRY:
        assert getattr(matches[0], field) == getattr(spec.plan, field), (hidden, field)


@pytest.mark.parametrize("hidden", HIDDEN)
def test_swept_plans_are_distinct(hidden):
    """Each swept plan is timed once: two plans that describe alike would be one column
    measured twice and another not at all."""
    spec = NormalizationSpec.reference_fusion(ROWS, hidden)
    described = [s.plan.describe() for s in sweep_specs(spec)]
    assert len(described) == len(set(described)), hidden


# --------------------------------------------------------------------------- every width

import dataclasses  # noqa: E402

from hostir.errors import LoweringError  # noqa: E402
from lowering.kernels.normalization import (  # noqa: E402
    MAX_SHARED_ROW_SLOTS, SHARED_PER_BLOCK, render_normalization, row_chunks,
)

# the widths the issue names, and the edges of each plan family
WIDTHS = (1, 7, 100, 513, 4097, 16385, 24575, 25088, 40001, 65535, 65536, 98304, 131072)
KINDS = {"layer_norm": NormalizationSpec.layer_norm, "rms_norm": NormalizationSpec.rms_norm}


def _sampled_widths():
    """Every width to 1100, then a stride over the rest to 131072 with both of its
    neighbours (the alignments differ by one), and the issue's widths."""
    ws = set(range(1, 1101))
    for w in range(1101, 131073, 997):
        ws.update((w - 1, w, w + 1))
    ws.update(WIDTHS)
    ws.update((131071, 131072))
    return sorted(w for w in ws if w <= 131072)


def test_the_planner_never_raises_from_1_to_131072():
    """Every width has a default plan, for both kinds, both 16-bit dtypes, and both
    alignments of the base pointers the runtime sees (torch's 256, a slice's 2)."""
    failed = []
    for hidden in _sampled_widths():
        for make in KINDS.values():
            for dtype, alignment in (("bfloat16", 16), ("float16", 16), ("bfloat16", 2)):
                try:
                    plan = make(ROWS, hidden, dtype=dtype, alignment=alignment).plan
                except LoweringError as e:
                    failed.append((hidden, make.__name__, dtype, alignment, str(e)[:80]))
                    continue
                assert plan.block_threads <= 1024
                assert plan.dynamic_shared_bytes + plan.shared_bytes <= SHARED_PER_BLOCK
    assert not failed, failed[:10]


@pytest.mark.parametrize("hidden", [513, 1601, 4097, 7001, 16385, 20001, 40001, 65535])
def test_rows_that_are_not_16_byte_aligned_take_16_byte_chunks(hidden):
    """Odd widths (the register kernels would use 2-byte vectors) get 16-byte chunks:
    the envelope kernel, two or more blocks an SM, while one block holds the row (RMS
    norms always, layer norms from `ENVELOPE_LAYER_MIN`: shorter ones keep the register
    kernels' narrow vectors); past that a layer norm's row is split over a cluster, an
    RMS norm's only where the shared-row plan would hold one block an SM."""
    from lowering.kernels.normalization import planner

    for name, make in KINDS.items():
        plan = make(ROWS, hidden, dtype="bfloat16").plan
        if name == "layer_norm" and hidden < planner.ENVELOPE_LAYER_MIN:
            assert not plan.shared_row and not plan.envelope, (hidden, plan.describe())
            continue
        if plan.shared_row:
            assert name == "rms_norm" and plan.min_blocks_per_sm >= 2, (hidden, plan.describe())
            continue
        assert plan.envelope and plan.blocks_per_sm >= 2, (hidden, plan.describe())
        assert plan.one_pass == (name == "layer_norm")
        one_block = planner.rank_envelope(planner.envelope_candidates(hidden, name == "layer_norm"))
        assert (plan.cluster > 1) == (not one_block), (hidden, plan.describe())
        assert plan.row_chunks == row_chunks(hidden, 2, rows_aligned=False)


@pytest.mark.parametrize("hidden", [25088, 32768, 65536, 98304, 131072])
def test_rows_wider_than_one_block_split_over_the_smallest_cluster(hidden):
    """The default of a row no block holds at two blocks an SM: the envelope kernel on
    the smallest cluster that does (a CTA's slice of the row on each), every CTA's slice
    holding chunks of the row, for layer and RMS norms alike; the shared-row family still
    plans the row when asked."""
    from lowering.kernels.normalization import envelope_candidates, rank_envelope

    for name, make in KINDS.items():
        plan = make(ROWS, hidden, dtype="bfloat16").plan
        assert plan.envelope and plan.cluster > 1 and plan.rows_per_block == 1
        assert plan.blocks_per_sm >= 2 and plan.one_pass == (name == "layer_norm")
        per_cta = plan.threads_per_row * plan.batch
        assert plan.cluster * per_cta >= plan.row_chunks > (plan.cluster - 1) * per_cta
        assert plan.dynamic_shared_bytes >= per_cta * 16  # the next row's chunks, the shares
        smaller = envelope_candidates(hidden, name == "layer_norm", cluster=plan.cluster - 1)
        assert not rank_envelope(smaller)
        grid = plan.grid(ROWS, 132, 2)
        assert grid % plan.cluster == 0 and grid // plan.cluster <= 132 * 2 // plan.cluster
        plan = make(ROWS, hidden, dtype="bfloat16", envelope=False).plan
        assert plan.shared_row and plan.row_chunks == hidden // 8
        slots = -(-plan.row_chunks // plan.threads_per_row)
        assert slots <= MAX_SHARED_ROW_SLOTS
        # the row in shared memory, what does not fit (past 227 KiB) in registers
        assert plan.batch * plan.threads_per_row * 16 <= SHARED_PER_BLOCK
        assert plan.register_slots == slots - plan.batch
        assert (plan.register_slots > 0) == (hidden * 2 > SHARED_PER_BLOCK - 256)


def test_the_reference_fusion_keeps_its_register_plan_where_l2_would_bound_it():
    """Its four 1-D tensors (two re-read in every pass) would be four times the row's own
    bytes of L2 traffic in the shared-row kernel: its register plans stay."""
    for hidden in (4096, 8192, 12288, 16384):
        assert not NormalizationSpec.reference_fusion(ROWS, hidden).plan.shared_row
        assert not NormalizationSpec.reference_fusion(ROWS, hidden, dtype="bfloat16").plan.shared_row


def test_one_block_register_plans_give_way_to_two_shared_row_blocks():
    """The model: a register plan with one block an SM (16896 plain RMS norm, past the
    plain row-wise plans, with the envelope kernel off) loses to a shared-row plan with
    two or more; rows one warp covers keep the row-wise kernel; a layer norm keeps its
    register plan (measured slower in the shared-row kernel)."""
    plan = NormalizationSpec.rms_norm(ROWS, 16896, dtype="bfloat16", envelope=False).plan
    assert plan.shared_row and plan.min_blocks_per_sm >= 2
    assert NormalizationSpec.rms_norm(ROWS, 16896, dtype="bfloat16").plan.envelope
    register = NormalizationSpec.rms_norm(ROWS, 16896, dtype="bfloat16", shared_row=False).plan
    assert not register.shared_row and register.min_blocks_per_sm == 1
    assert not NormalizationSpec.rms_norm(ROWS, 1024, dtype="bfloat16").plan.shared_row
    assert not NormalizationSpec.layer_norm(ROWS, 16896, dtype="bfloat16").plan.shared_row


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_plain_norms_take_the_row_wise_kernel_with_a_promise_of_two_blocks_and_1024_threads(dtype):
    """`planner._plain_rowwise`: plain norms' aligned rows between one warp's and the
    widths where two blocks of 1024+ threads no longer fit take the row-wise kernel at
    about 24 values a thread; fusions with prologue tensors, unaligned rows and rows one
    warp covers keep their rules."""
    from lowering.kernels.normalization import planner

    picks = {}
    for kind in ("layer_norm", "rms_norm"):
        for hidden in range(1536, 24577, 512):
            plan = KINDS[kind](ROWS, hidden, dtype=dtype).plan
            if (not plan.persistent and not plan.shared_row and not plan.envelope
                    and plan.blocks_per_sm):
                values = plan.batch * plan.vector_width
                assert 16 <= values <= (24 if kind == "layer_norm" else 32), plan.describe()
                assert plan.blocks_per_sm >= 2, plan.describe()
                assert plan.blocks_per_sm * plan.block_threads >= planner.PLAIN_ROWWISE_THREADS
                picks[kind, hidden] = plan.describe()
    assert picks["rms_norm", 4608] == "rowwise t192 b3 v8 r1 x6"
    assert ("layer_norm", 1536) in picks and ("rms_norm", 9216) in picks
    # the envelope kernel takes layer norms from 2048 values (and shorter rows the
    # row-wise plan pads), RMS norms from 8192 whose row-wise plan holds fewer than three
    # blocks an SM (`planner._envelope_over`)
    assert not any(h >= 2048 for k, h in picks if k == "layer_norm")
    assert NormalizationSpec.layer_norm(ROWS, 1032, dtype=dtype).plan.envelope
    assert not NormalizationSpec.layer_norm(ROWS, 1024, dtype=dtype).plan.envelope
    assert ("rms_norm", 9728) not in picks and ("rms_norm", 13824) not in picks
    assert NormalizationSpec.reference_fusion(ROWS, 4608, dtype=dtype).plan.persistent
    assert NormalizationSpec.rms_norm(ROWS, 4604, dtype=dtype).plan.shared_row  # 8-byte rows
    assert NormalizationSpec.rms_norm(ROWS, 4608, dtype=dtype, alignment=8).plan.shared_row
    assert NormalizationSpec.rms_norm(ROWS, 4608, dtype=dtype, alignment=4).plan.envelope
    assert NormalizationSpec.rms_norm(ROWS, 1024, dtype=dtype).plan.describe() == "rowwise t32 b4 v8 r4"
    try:
        planner.PLAIN_ROWWISE = False
        off = NormalizationSpec.rms_norm(ROWS, 4608, dtype=dtype, eps=1e-4)._make_plan()
    finally:
        planner.PLAIN_ROWWISE = True
    assert off.persistent


def test_the_model_reads_the_hardware():
    """Little's law: the bytes an SM must keep requested grow with the bandwidth, and
    a smaller shared memory a block shrinks what a shared-row block may cache."""
    from lowering.kernels.normalization import SM90

    h200 = dataclasses.replace(SM90, bandwidth=4.8e12)
    assert h200.in_flight_per_sm > SM90.in_flight_per_sm > 16 * 1024
    small = dataclasses.replace(SM90, shared_per_block=96 * 1024, shared_per_sm=100 * 1024)
    plan = NormalizationSpec.rms_norm(ROWS, 65536, dtype="bfloat16", hardware=small,
                                      envelope=False).plan
    assert plan.shared_row and plan.batch * plan.threads_per_row * 16 <= 96 * 1024
    assert plan.register_slots > 0
    # without thread-block clusters (before sm_90) the widest rows take the shared-row family
    old = dataclasses.replace(SM90, clusters=False)
    assert NormalizationSpec.rms_norm(ROWS, 65536, dtype="bfloat16").plan.cluster > 1
    assert NormalizationSpec.rms_norm(ROWS, 65536, dtype="bfloat16", hardware=old).plan.shared_row
    with pytest.raises(LoweringError, match="cluster 2"):
        NormalizationSpec.rms_norm(ROWS, 65536, hardware=old, envelope=True, cluster=2).plan


def _compile(spec):
    pytest.importorskip("cupy")
    from runtime import jit

    return jit.compile(render_normalization(spec), [spec.kernel_name], "sm_90")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("hidden", WIDTHS + (34990, 131071))
def test_default_plan_compiles_without_spills(hidden, kind, dtype):
    """34990: an unaligned layer norm that spilled when its plan promised 56 registers."""
    spec = KINDS[kind](ROWS, hidden, dtype=dtype)
    ck = _compile(spec)
    name, plan = spec.kernel_name, spec.plan
    assert ck.spill_bytes.get(name, 0) == 0, (plan.describe(), ck.log)
    assert ck.local_bytes.get(name, 0) == 0, (plan.describe(), ck.log)
    assert ck.registers[name] * plan.block_threads * plan.min_blocks_per_sm <= 65536


@pytest.mark.parametrize("hidden", [4097, 65535])
def test_shared_row_fusions_and_fp32_outputs_compile_without_spills(hidden):
    """The prologue's tensors (recomputed in every pass), fp32 1-D tensors and an fp32
    output, on rows that are not aligned."""
    from lowering.kernels.normalization import AddBroadcast, Cast, LayerNorm

    specs = [NormalizationSpec.reference_fusion(ROWS, hidden, dtype="bfloat16", shared_row=True),
             NormalizationSpec(ROWS, hidden, LayerNorm(weight_dtype="float32", bias_dtype="float32"),
                               input_dtype="float16", output_dtype="float32",
                               prologue=(AddBroadcast("float32", "b0"), Cast("float16")),
                               epilogue=(AddBroadcast("float16", "b2"),), shared_row=True)]
    for spec in specs:
        assert spec.plan.shared_row
        ck = _compile(spec)
        assert ck.spill_bytes.get(spec.kernel_name, 0) == 0, ck.log
        assert ck.local_bytes.get(spec.kernel_name, 0) == 0, ck.log


# ------------------------------------------------ the shared-row kernel's index math, in Python


def _edge_slots(hidden, threads, slots):
    """(0, kEdgeA, kEdgeB): the slots that may hold a partial chunk, as the kernel's
    constants reckon them (chunk c is slot (c % (T * K)) / T)."""
    last = (hidden + 7) // 8 - 1
    return (0, (last % (threads * slots)) // threads, ((last + 1) % (threads * slots)) // threads)


def _chunks_of_row(hidden, hx, threads, slots):
    """(thread, slot, chunk, first column, lo, hi) of every chunk the kernel touches for
    a row whose first element sits ``hx`` elements into its 16-byte granule: the
    kernel's own arithmetic (c = i * T + tid; col0 = 8c - hx; lo; hi)."""
    nch = (hx + hidden + 7) >> 3
    for tid in range(threads):
        for i in range(slots):
            c = i * threads + tid
            if c < nch:
                col0 = 8 * c - hx
                yield tid, i, c, col0, hx if c == 0 else 0, min(8, hidden - col0)


@pytest.mark.parametrize("hidden", [1, 7, 9, 513, 1601, 4097, 16385, 65535])
def test_shared_row_chunks_cover_every_column_once_at_any_alignment(hidden):
    """For each offset of a row in its granule (the rows of an odd width take all of
    them), the chunks a plan gives its threads cover columns 0..hidden-1 exactly once,
    no masked lane lies inside the row, and no chunk is past the plan's bound."""
    plan = NormalizationSpec.layer_norm(ROWS, max(hidden, 513), dtype="bfloat16",
                                        shared_row=True).plan
    chunks = row_chunks(hidden, 2, rows_aligned=False)
    threads = plan.threads_per_row
    slots = -(-chunks // threads)
    for hx in range(8):
        seen = []
        for _, _, c, col0, lo, hi in _chunks_of_row(hidden, hx, threads, slots):
            assert c < chunks and 0 <= lo < hi <= 8
            seen += [col0 + e for e in range(lo, hi)]
        assert sorted(seen) == list(range(hidden)), (hidden, hx)


def _funnel(lo_words, hi_words, sh):
    """cols16's shift of two aligned 16-byte vectors by ``sh`` elements, word by word as
    the kernel does it (select by k = sh >> 1, funnel shift by 16 when sh is odd)."""
    w = list(lo_words) + list(hi_words)
    k, f = sh >> 1, (sh & 1) * 16
    s = []
    for m in range(5):
        v = w[m]
        v = w[m + 1] if k == 1 else v
        v = w[m + 2] if k == 2 else v
        v = w[m + 3] if k == 3 else v
        s.append(v)
    return [(((s[j + 1] << 32) | s[j]) >> f) & 0xFFFFFFFF for j in range(4)]


def test_funnel_shift_of_unaligned_1d_tensor_chunks():
    """Columns col0..col0+7 of a 16-bit tensor from the two aligned vectors around them,
    for every misalignment 1..7: the same eight elements a scalar read gives."""
    elements = list(range(0x100, 0x100 + 16))  # two granules, element k = 0x100 + k

    def words(es):
        return [es[2 * j] | (es[2 * j + 1] << 16) for j in range(4)]

    for sh in range(1, 8):
        out = _funnel(words(elements[:8]), words(elements[8:]), sh)
        got = [half for word in out for half in (word & 0xFFFF, word >> 16)]
        assert got == elements[sh:sh + 8], sh


def test_device_hardware_without_a_device_is_the_sm90_default():
    pytest.importorskip("torch")
    from lowering.kernels.normalization import SM90
    from runtime import normalization as rn

    assert rn.device_hardware(-1) is SM90
    spec = rn._spec("rms_norm", 8192, 65536, 1e-6, "bfloat16", 16, -1)
    assert spec.hardware is SM90 and spec.plan.envelope and spec.plan.cluster > 1


def test_one_block_layer_norms_take_their_statistics_in_one_pass():
    """With one block an SM (rows past ~57K values) nothing covers a second pass over the
    row and its barrier: the layer norm merges each chunk's (count, mean, M2) instead;
    with more blocks, and for rms_norm, the two-pass statistics stay."""
    wide = NormalizationSpec.layer_norm(ROWS, 65536, dtype="bfloat16", envelope=False)
    assert wide.plan.one_pass and wide.plan.min_blocks_per_sm == 1
    src = render_normalization(wide)
    assert "block_stats(n, m, q, partials, parity)" in src and "chan_merge" in src
    narrower = NormalizationSpec.layer_norm(ROWS, 32768, dtype="bfloat16", envelope=False)
    assert narrower.plan.min_blocks_per_sm > 1 and not narrower.plan.one_pass
    assert not NormalizationSpec.rms_norm(ROWS, 65536, dtype="bfloat16",
                                          envelope=False).plan.one_pass


def test_one_pass_merge_matches_float64_on_rows_with_a_large_mean():
    """The kernel's order of Chan merges (each chunk's exact triple into its thread's,
    then the warp's butterfly and the block's), in float32, on an unaligned row."""
    np = pytest.importorskip("numpy")
    f = np.float32

    def merge(a, b):
        n, m, q = a
        n2, m2, q2 = b
        nn = f(n + n2)
        if nn > 0:
            d, fr = f(m2 - m), f(n2 / nn)
            m, q, n = f(m + d * fr), f(q + q2 + d * d * n * fr), nn
        return n, m, q

    def butterfly(vals):
        off = 16
        while off:
            vals = [merge(vals[lane], vals[lane ^ off]) for lane in range(32)]
            off //= 2
        return vals[0]

    hidden, threads, hx = 20001, 256, 5
    x = (np.random.default_rng(1).standard_normal(hidden) * 4 + 500).astype(np.float32)
    nch = (hx + hidden + 7) >> 3
    per_thread = []
    for tid in range(threads):
        acc = (f(0), f(0), f(0))
        for i in range(-(-nch // threads)):
            c = i * threads + tid
            if c >= nch:
                continue
            col0, lo = 8 * c - hx, hx if c == 0 else 0
            hi = min(8, hidden - col0)
            v = np.array([x[col0 + e] for e in range(lo, hi)], dtype=np.float32)
            cm = f(v.sum(dtype=np.float32) / f(hi - lo))
            acc = merge(acc, (f(hi - lo), cm, f(((v - cm) ** 2).sum(dtype=np.float32))))
        per_thread.append(acc)
    warps = [butterfly(per_thread[w * 32:(w + 1) * 32]) for w in range(threads // 32)]
    n, m, q = butterfly(warps + [(f(0), f(0), f(0))] * (32 - len(warps)))
    assert n == hidden
    assert abs(m - x.astype(np.float64).mean()) < 1e-4
    assert abs(q / hidden - x.astype(np.float64).var()) < 1e-4 * x.astype(np.float64).var()


# --------------------------------------------------------------- the envelope row-wise kernel

ENVELOPE_WIDTHS = (513, 1001, 2050, 4097, 7001, 9999, 12345, 14848, 16385, 16896, 20001, 23040)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("hidden", ENVELOPE_WIDTHS)
def test_envelope_default_plans_compile_within_their_promise(hidden, dtype):
    """Every default envelope plan: no spills, no stack frame (an array passed to the
    out-of-line partial chunk once put every chunk's values in local memory, halving the
    bandwidth), and the promised blocks' registers within the SM's."""
    for kind, make in KINDS.items():
        spec = make(ROWS, hidden, dtype=dtype)
        plan = spec.plan
        if not plan.envelope:
            continue
        ck = _compile(spec)
        name = spec.kernel_name
        # the kernel's and its out-of-line partial chunk's
        assert sum(ck.spill_bytes.values()) == 0, (plan.describe(), ck.log)
        assert sum(ck.local_bytes.values()) == 0, (plan.describe(), ck.log)
        assert ck.registers[name] * plan.block_threads * plan.min_blocks_per_sm <= 65536


def test_envelope_kernel_shape_by_alignment():
    """Unaligned rows: the masked ends, the output pass instantiated for each word shift
    of the 1-D tensors and the out-of-line partial chunks; aligned rows: none of those.
    Layer norms' default: the shifted one-pass statistics."""
    odd = NormalizationSpec.layer_norm(ROWS, 7001, dtype="bfloat16")
    even = NormalizationSpec.rms_norm(ROWS, 16896, dtype="bfloat16")
    assert odd.plan.envelope and odd.plan.one_pass and even.plan.envelope
    src, src_even = render_normalization(odd), render_normalization(even)
    assert "constexpr bool kRowsAligned = false;" in src
    assert all(f"output_pass<{k}>(" in src for k in (0, 1, 2, 3, -1))
    assert "mask_chunk(xr[i]" in src and "const float shift" in src
    # whole chunks' y stores: one 16-byte store where the dispatch found y at x's phase;
    # a cluster's staged tensors never take the generic path (it reads global memory)
    assert "(((size_t)y - (size_t)hx * sizeof(*y)) & 15) == 0" in src
    assert "store16<kFull, true>(y" in src
    from lowering.kernels.normalization import LayerNorm
    wide_out = NormalizationSpec(ROWS, 7001, LayerNorm(weight_dtype="bfloat16", bias_dtype="bfloat16"),
                                 input_dtype="bfloat16", output_dtype="float32", envelope=True)
    src_wide = render_normalization(wide_out)  # fp32 y: the same test, in its own elements
    assert "sizeof(*y)" in src_wide and "store32<kFull, true>(y" in src_wide
    staged = NormalizationSpec.layer_norm(ROWS, 40001, dtype="bfloat16")
    assert staged.plan.staged and staged.plan.cluster > 1
    src_staged = render_normalization(staged)
    assert "sizeof(*y)" not in src_staged and "store16<kFull, true>(y" not in src_staged
    assert "switch ((true) ? sh >> 1 : -1)" in src_staged
    assert "constexpr bool kRowsAligned = true;" in src_even
    assert "switch" not in src_even.split("extern \"C\"")[1]
    assert "const float shift" not in src_even


@pytest.mark.parametrize("kw, message", [
    ({"param_cache": "registers"}, "envelope is its own kernel"),
    ({"shared_row": True}, "envelope is its own kernel"),
    ({"one_pass": True, "prefetch": True}, "envelope is its own kernel"),
    ({"one_pass": False, "x_staged": False}, "envelope is its own kernel"),
    ({"rows_per_block": 0}, "expected an int >= 1"),
    ({"rows_per_block": 40}, "no envelope plan covers"),
    ({"batch": 40}, "no envelope plan covers"),
    ({"threads_per_row": 48}, "no envelope plan covers"),
])
def test_envelope_pins_are_checked(kw, message):
    with pytest.raises(LoweringError, match=message):
        NormalizationSpec.rms_norm(ROWS, 4097, dtype="bfloat16", envelope=True, **kw)


def test_envelope_takes_plain_norms_only():
    """Pinned on a fusion it is refused; by default, specs with a prologue (casts alone
    included), epilogue tensors or fp32 tensors take the other kernels."""
    from lowering.kernels.normalization import AddBroadcast, Cast, RmsNorm

    with pytest.raises(LoweringError, match="plain norms"):
        NormalizationSpec.reference_fusion(ROWS, 4097, dtype="bfloat16", envelope=True)
    cast = NormalizationSpec(ROWS, 7001, RmsNorm(weight_dtype="bfloat16"), "bfloat16",
                             "bfloat16", prologue=(Cast("float16"),))
    assert not cast.plan.envelope and render_normalization(cast)
    with pytest.raises(LoweringError, match="plain norms"):
        dataclasses.replace(cast, envelope=True)
    tail = NormalizationSpec.rms_norm(ROWS, 7001, dtype="bfloat16", epilogue=(
        AddBroadcast("bfloat16", "b2"),))
    assert not tail.plan.envelope
    assert NormalizationSpec.rms_norm(ROWS, 7001, dtype="bfloat16").plan.envelope


def test_envelope_promise_follows_a_pinned_rows_per_block():
    """Two rows a block: the block promise is the one for blocks twice as large (a
    one-row promise kept would cap ptxas below what the kernel needs)."""
    one = NormalizationSpec.layer_norm(ROWS, 7001, dtype="bfloat16", envelope=True,
                                       threads_per_row=224)
    two = dataclasses.replace(one, rows_per_block=2)
    assert two.plan.block_threads == 2 * one.plan.block_threads
    assert two.plan.blocks_per_sm <= one.plan.blocks_per_sm // 2 + 1
    ck = _compile(two)
    assert sum(ck.spill_bytes.values()) == 0, ck.log


@pytest.mark.parametrize("hidden", [513, 4097, 16896])
def test_envelope_plans_round_trip_and_cover_the_row(hidden):
    """spec_with_plan pins an envelope plan field by field; every candidate covers the
    envelope with no slot empty for every thread."""
    from lowering.kernels.normalization import envelope_candidates, spec_params, spec_from_params
    from lowering.kernels.normalization import spec_with_plan

    spec = NormalizationSpec.layer_norm(ROWS, hidden, dtype="bfloat16")
    for plan in envelope_candidates(hidden, True):
        assert plan.threads_per_row * plan.batch >= plan.row_chunks
        assert (plan.batch - 1) * plan.threads_per_row < plan.row_chunks
        pinned = spec_with_plan(spec, dataclasses.replace(plan, one_pass=True))
        assert pinned.plan == dataclasses.replace(plan, one_pass=True)
        assert spec_from_params(spec_params(pinned)).plan == pinned.plan


# ------------------------------------------- the envelope kernel's index math, in Python


def _mask(raw, lo, hi):
    """mask_chunk: the 8 raw elements of a chunk with those outside lanes [lo, hi) 0."""
    return [v if lo <= e < hi else 0 for e, v in enumerate(raw)]


@pytest.mark.parametrize("hidden", [1, 7, 9, 100, 513, 1601, 4097])
def test_envelope_chunks_masks_and_shifts_at_every_phase(hidden):
    """The envelope kernel's arithmetic for every phase of a row in its granule (hx) and
    of the weight in its own (wp): the chunks a plan's threads hold cover the row once;
    a chunk is whole exactly when the kernel takes its fast path; masking the ends at
    load leaves the row's own sum and, with the masked count taken back out, its
    shifted one-pass statistics equal to the two-pass ones; and every whole chunk's
    weight columns sit (wp - hx) & 7 elements into their granule, the one shift the
    row's output pass is instantiated for, read without a granule past the tensor."""
    import random

    rng = random.Random(hidden)
    plan = NormalizationSpec.rms_norm(ROWS, max(hidden, 513), dtype="bfloat16",
                                      envelope=True).plan
    threads = plan.threads_per_row
    chunks = row_chunks(hidden, 2, rows_aligned=False)
    slots = -(-chunks // threads)
    for hx in range(8):
        # the flat buffer around the row: neighbours' elements in the granules it shares
        flat = [rng.uniform(-3, 3) + 50.0 for _ in range(8 * (chunks + 2))]
        row = flat[hx:hx + hidden]
        nch = (hx + hidden + 7) >> 3
        seen, total, masked, s, q = [], 0.0, 0, 0.0, 0.0
        shift = row[0]
        edges = _edge_slots(hidden, threads, slots)
        for tid, i, c, col0, lo, hi in _chunks_of_row(hidden, hx, threads, slots):
            whole = (c != 0 or hx == 0) and col0 + 8 <= hidden
            assert whole == (lo == 0 and hi == 8), (hidden, hx, c)
            if not whole:  # only the slots the output pass tests, and stores after its loop
                assert i in edges, (hidden, hx, c, i, edges)
                if c == 0:  # the first: thread 0's slot 0, where the kernel's test holds
                    assert tid == 0 and i == 0
                    assert hx != 0 or (nch == 1 and (hx + hidden) % 8 != 0)
                else:  # the last chunk: slot kEdgeA's or kEdgeB's, of the kernel's thread
                    last_a = (hidden + 7) // 8 - 1
                    assert (c, i) in ((last_a, edges[1]), (last_a + 1, edges[2]))
                    assert tid == c - i * threads
            raw = _mask(flat[8 * c:8 * c + 8], lo, hi)
            masked += 8 - (hi - lo)
            total += sum(raw)
            s += sum(v - shift for v in raw)
            q += sum((v - shift) ** 2 for v in raw)
            seen += [col0 + e for e in range(lo, hi)]
            for wp in range(8):
                sh = (wp - hx) & 7
                if whole:
                    assert (wp + col0) % 8 == sh  # the row's one shift fits every chunk
                    if sh:  # the granule after holds the chunk's last column
                        assert (wp + col0 + 7) // 8 == (wp + col0) // 8 + 1
                        assert col0 + 7 < hidden
        assert sorted(seen) == list(range(hidden)) and nch <= chunks
        assert total == pytest.approx(sum(row), rel=1e-12)
        s += masked * shift
        q -= masked * shift * shift
        mean = sum(row) / hidden
        var = sum((v - mean) ** 2 for v in row) / hidden
        assert shift + s / hidden == pytest.approx(mean, rel=1e-9)
        assert q / hidden - (s / hidden) ** 2 == pytest.approx(var, rel=1e-6, abs=1e-9)


@pytest.mark.parametrize("hidden, alignment", [(24575, 2), (30008, 16), (40001, 2),
                                               (60008, 16), (65535, 2), (100008, 16)])
def test_a_clusters_line_envelope_covers_the_row_at_every_phase_of_a_line(hidden, alignment):
    """`LaunchPlan.envelope_line` 128 (the kernel's kLine): the envelope starts at the
    128-byte line holding the row's first value, hx of its values before the row (0-63).
    At every hx the cluster's chunks hold the row's columns once and every chunk the
    kernel touches (nch of them) has a thread; the chunks before the row (hx / 8 of them)
    and the row's first partial chunk lie in slot 0 of rank 0's first warp; the last
    partial chunk in slot kEdgeA or kEdgeB (from kLastA and kLastB), whichever side of
    kPastA it falls, its holder the thread the kernel shuffles from; and a staged tensor's
    columns (from kLine / 16 granules before the CTA's first chunk) cover every vector a
    chunk reads."""
    for make in KINDS.values():
        spec = make(ROWS, hidden, dtype="bfloat16", alignment=alignment)
        plan = spec.plan
        assert plan.cluster > 1 and plan.envelope_line == 128, plan.describe()
        assert "constexpr int kLine = 128;" in render_normalization(spec)
        t, k, cl = plan.threads_per_row, plan.batch, plan.cluster
        last_a = (hidden + 7) // 8 - 1
        last_b = (hidden + 64 - 2) // 8
        edge_a, edge_b = (last_a % (t * k)) // t, (last_b % (t * k)) // t
        past_a = (last_a // t + 1) * t
        staged = 8 * (t * k + 1 + 8)  # kStagedColumns
        for hx in range(0, 64, 8 if hidden % 8 == 0 else 1):
            nch = (hx + hidden + 7) >> 3
            assert nch <= t * k * cl
            cols = []
            for r in range(cl):
                lo_col = 8 * (r * t * k - 8)  # staged_lo
                for thread in range(t):
                    tid = thread + r * t * k
                    for i in range(k):
                        c = i * t + tid
                        if c >= nch:
                            continue
                        col0 = 8 * c - hx
                        if col0 + 8 <= 0:  # before the row: slot 0, neither read nor stored
                            assert i == 0 and r == 0 and thread < 8
                            continue
                        first = c == hx >> 3 and hx & 7
                        last = col0 + 8 > hidden
                        if first:
                            assert i == 0 and r == 0 and tid == hx >> 3
                        if last and not first:
                            in_a = c < past_a
                            assert i == (edge_a if in_a else edge_b)
                            assert tid == c - i * t
                        lo, hi = max(0, -col0), min(8, hidden - col0)
                        cols += [col0 + e for e in range(lo, hi)]
                        # a whole chunk's tensor vectors: the granule at col0 and the next
                        g = (col0 // 8) * 8
                        assert lo_col <= g and g + 16 <= lo_col + staged
            assert sorted(cols) == list(range(hidden)), (hidden, hx)


@pytest.mark.parametrize("hidden", [20001, 24576, 40001, 65535, 131072])
def test_a_clusters_ctas_hold_every_chunk_of_the_row_once(hidden):
    """kernel_cluster's arithmetic: CTA r's thread t holds chunk i * T + t + r * T * K of
    slot i, so the cluster's CTAs cover the row's envelope once at every phase (hx), each
    CTA's slice a contiguous run; the exchange (each CTA's sum into every CTA's slot r,
    added in rank order) gives every CTA the row's sum, the same in each."""
    for name, make in KINDS.items():
        plan = make(ROWS, hidden, dtype="bfloat16", alignment=2).plan
        t, k, cl = plan.threads_per_row, plan.batch, plan.cluster
        if not plan.envelope or cl == 1:  # one block, or the shared-row family, holds it
            plan = make(ROWS, hidden, dtype="bfloat16", alignment=2, envelope=True).plan
            t, k, cl = plan.threads_per_row, plan.batch, plan.cluster
            if cl == 1:
                continue
        for hx in (0, 3, 7):
            nch = (hx + hidden + 7) >> 3
            owner = {}
            for r in range(cl):
                for thread in range(t):
                    tid = thread + r * t * k
                    for i in range(k):
                        c = i * t + tid
                        if c < nch:
                            assert c not in owner
                            owner[c] = r
                            col0 = 8 * c - hx
                            if (c == 0 and hx != 0) or col0 + 8 > hidden:  # a partial chunk
                                assert i in _edge_slots(hidden, t, k), (hidden, hx, c)
            assert sorted(owner) == list(range(nch))
            assert all(owner[c] <= owner[c + 1] for c in range(nch - 1))
            assert set(owner.values()) == set(range(cl))  # no CTA without chunks
            sums = [float(sum(c for c in owner if owner[c] == r)) for r in range(cl)]
            slots = [[None] * cl for _ in range(cl)]
            for r in range(cl):  # share_push into every CTA's slot r
                for dst in range(cl):
                    slots[dst][r] = sums[r]
            totals = {sum(slots[dst]) for dst in range(cl)}
            assert totals == {float(sum(range(nch)))}


def test_cluster_plans_pin_round_trip_and_are_checked():
    """A cluster plan pins and round-trips through the kernel parameters; its kernel
    exchanges each row's sums by asynchronous stores on mbarriers, no cluster barrier a
    row, and prefetches the next row into shared memory; what cannot run is refused."""
    from lowering.kernels.normalization import spec_from_params, spec_params, spec_with_plan

    for make in KINDS.values():
        spec = make(ROWS, 65536, dtype="bfloat16")
        pinned = spec_with_plan(spec, spec.plan)
        assert pinned.cluster == spec.plan.cluster > 1 and pinned.plan == spec.plan
        assert spec_from_params(spec_params(pinned)).plan == spec.plan
        four = make(ROWS, 49664, dtype="bfloat16", envelope=True, cluster=4).plan
        assert four.cluster == 4 and four.threads_per_row * four.batch * 4 >= four.row_chunks
        src = render_normalization(make(ROWS, 65536, dtype="bfloat16"))
        assert "__cluster_dims__" in src and "share_push(" in src
        assert "mbar_wait_cluster(" in src and "prefetch(row + teams, set ^ 1)" in src
        body = src[src.index("__cluster_dims__"):]
        assert "cluster_sync()" in body and body.count("cluster_sync()") == 1  # entry only
    # the tuner's candidates: envelope plans of the same cluster, then the other families
    from lowering.kernels.normalization import tune_plans

    spec = NormalizationSpec.layer_norm(ROWS, 33280, dtype="bfloat16")
    plans = tune_plans(spec)
    assert plans[0] == spec.plan and any(p.shared_row for p in plans)
    assert all(p.cluster == spec.plan.cluster for p in plans if p.envelope)
    assert len([p for p in plans if p.envelope]) > 1
    # a pinned one-block envelope plan (cluster 1) taken to another family
    narrow = NormalizationSpec.layer_norm(ROWS, 8192, dtype="bfloat16", alignment=2)
    pinned = spec_with_plan(narrow, narrow.plan)
    assert pinned.cluster == 1 and dataclasses.replace(
        pinned, envelope=False, threads_per_row=None, batch=None, rows_per_block=None,
        one_pass=None, blocks_per_sm=None).plan.persistent
    with pytest.raises(LoweringError, match="pin envelope=True"):
        NormalizationSpec.rms_norm(ROWS, 49664, cluster=2).plan
    with pytest.raises(LoweringError, match="cluster 9"):
        NormalizationSpec.rms_norm(ROWS, 49664, envelope=True, cluster=9).plan
    with pytest.raises(LoweringError, match="one pass"):
        NormalizationSpec.layer_norm(ROWS, 49664, envelope=True, cluster=4, one_pass=False).plan
    with pytest.raises(LoweringError, match="no envelope plan"):
        NormalizationSpec.rms_norm(ROWS, 131072, envelope=True, cluster=2).plan


@pytest.mark.parametrize("sh", range(8))
def test_envelope_static_funnel_shift_of_1d_tensor_chunks(sh):
    """cols16k<k = sh >> 1> with f = (sh & 1) * 16: words k..k+4 of the two aligned
    vectors funnel-shifted by f give the eight elements from sh on (k and f known for
    the row; no select chain)."""
    elements = list(range(0x100, 0x100 + 16))
    w = [elements[2 * j] | (elements[2 * j + 1] << 16) for j in range(8)]
    k, f = sh >> 1, (sh & 1) * 16
    out = [(((w[k + j + 1] << 32) | w[k + j]) >> f) & 0xFFFFFFFF for j in range(4)]
    assert [h for word in out for h in (word & 0xFFFF, word >> 16)] == elements[sh:sh + 8]


def test_envelope_with_fp32_tensors_and_an_epilogue_compiles():
    """fp32 weight and bias (read whole, as the shared-row kernel reads them), an fp32
    output and an epilogue tensor on the envelope kernel, unaligned and aligned."""
    from lowering.kernels.normalization import AddBroadcast, LayerNorm

    for hidden in (7001, 16896):
        spec = NormalizationSpec(ROWS, hidden, LayerNorm(weight_dtype="float32", bias_dtype="float32"),
                                 input_dtype="bfloat16", output_dtype="float32",
                                 epilogue=(AddBroadcast("bfloat16", "b2"),), envelope=True)
        assert spec.plan.envelope
        ck = _compile(spec)
        assert ck.spill_bytes.get(spec.kernel_name, 0) == 0, ck.log
        assert ck.local_bytes.get(spec.kernel_name, 0) == 0, ck.log


@pytest.mark.parametrize("hidden", [38928, 54272, 92215, 131071])
@pytest.mark.parametrize("dtype, alignment", [("bfloat16", 16), ("bfloat16", 2),
                                              ("float16", 16), ("float16", 2)])
def test_cluster_layer_norms_compile_without_spills(hidden, dtype, alignment):
    """A cluster's layer norm of fp16 values, or on base pointers off 16 bytes, takes more
    registers than the bf16 estimate (`ENVELOPE_CLUSTER_SPARE`): spilled 8-16 bytes at
    these widths before it counted them (131071 then fits no cluster's two blocks an SM
    but bf16 on aligned bases': the shared-row family)."""
    spec = NormalizationSpec.layer_norm(ROWS, hidden, dtype=dtype, alignment=alignment)
    assert spec.plan.cluster > 1 or (hidden == 131071 and spec.plan.shared_row)
    ck = _compile(spec)
    assert sum(ck.spill_bytes.values()) == 0 and sum(ck.local_bytes.values()) == 0, ck.log


@pytest.mark.parametrize("kind", ["layer_norm", "rms_norm"])
def test_aligned_cluster_norms_promise_three_blocks_on_rows_of_up_to_416_threads(kind):
    """`ENVELOPE_LAYER_CLUSTER_HELD` / `_LEAST`: a plain 16-bit norm on a cluster, its
    rows aligned, promises three blocks an SM where 48-56 registers a thread fit them
    (rows of up to 416 threads: 56 up to 384, 48 at 416; three ran 1-7% faster on the
    H200 at 320-384, 2-10% at 416), four where 56 fit them; on two CTAs a row too long
    for three blocks, two held to 48-56 (448-640 threads: the smallest cluster, 2-4%
    faster than three CTAs of three blocks; past 60928 at seven chunks a thread); three or
    more CTAs a row keep three blocks.
    fp16 values take the same plans (side by side on an H200, fp16 on the bf16 plans ran
    0.91-0.93 of copy bandwidth at 33280-57856 against 0.83-0.88 on its own). RMS norms
    take the layer norm's plans (H200: 46080-65536 0.92-0.94 against 0.89-0.92 on three or
    four CTAs); rows off 16 bytes keep their estimates. The held plans compile without
    spills."""
    make = KINDS[kind]
    three, two = [], []
    for hidden in range(24576, 65537, 512):
        plan = make(ROWS, hidden, dtype="bfloat16").plan
        if plan.cluster > 1 and plan.envelope:
            assert (plan.blocks_per_sm >= 3) == (plan.threads_per_row <= 416), plan.describe()
            assert plan.blocks_per_sm >= (2 if plan.cluster == 2 else 3), plan.describe()
            assert plan.register_estimate <= 56, plan.describe()
            three += [hidden] * (plan.blocks_per_sm >= 3)
            two += [hidden] * (plan.blocks_per_sm == 2)
    # with six chunks a thread preferred on a cluster (`rank_envelope`'s most_chunks), rows
    # to 39424 fit three blocks of two CTAs; 39936-60928 two blocks of two CTAs; 61440-65536
    # too, at seven chunks (`MAX_HELD_ENVELOPE_CHUNKS`: not six on four CTAs)
    assert 37376 in three and 39424 in three and 33280 in three
    assert two == list(range(39936, 65537, 512)), two
    assert make(ROWS, 33280, dtype="bfloat16").plan.batch == 6
    assert [make(ROWS, h, dtype="bfloat16").plan.batch
            for h in (59904, 60928, 61440, 65536)] == [6, 6, 7, 7]
    wider = make(ROWS, 71680, dtype="bfloat16").plan
    assert (wider.cluster, wider.batch, wider.blocks_per_sm) == (4, 6, 3), wider.describe()
    for spec in (make(ROWS, 37376, dtype="bfloat16", alignment=2),
                 make(ROWS, 40001, dtype="bfloat16")):
        assert spec.plan.cluster > 1 and spec.plan.blocks_per_sm == 2, spec.plan.describe()
    # (an RMS norm's bf16 rows of 79872-128512 keep two blocks of four to six CTAs on its
    # own estimate, where its fp16 estimate's spare registers move them one CTA wider, to
    # the held three blocks)
    for hidden in range(24576, 131073 if kind == "layer_norm" else 65537, 512):
        bf16 = make(ROWS, hidden, dtype="bfloat16").plan
        assert make(ROWS, hidden, dtype="float16").plan == bf16
    for hidden in (37376, 40960, 49664, 59904, 64000, 65536):
        for dtype in ("bfloat16", "float16"):
            ck = _compile(make(ROWS, hidden, dtype=dtype))
            assert sum(ck.spill_bytes.values()) == 0 and sum(ck.local_bytes.values()) == 0, ck.log
