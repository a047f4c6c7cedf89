"""The envelope kernel, its rows on one block and split over a cluster, run on the host.

The generated CUDA C++ is compiled by the host compiler with the seams' host emulation
(`host_emulation.HOST_PRELUDE`, as the seams' tests: a std::thread per GPU thread, a cluster's CTAs side
by side, shared memory per CTA, mbarriers with their phases and transaction bytes,
asynchronous stores into another CTA's memory), so the exchange of a row's sums between
the CTAs of a cluster, the reuse of its two sets of share slots and mbarriers, and the
ring that copies the next row ahead are checked against float64 without a GPU. The
emulation makes a cluster's odd CTAs lag on every wait for the others' shares, so a share
written into a slot still to be read would show as a wrong row.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from lowering.kernels.normalization import NormalizationSpec, render_normalization  # noqa: E402
from runtime import normalization as rn  # noqa: E402

from . import host_emulation  # noqa: E402

# what the normalization kernels use beyond the seams' kernels, as plain host code
HOST_EXTRAS = r"""
#include <algorithm>
using std::min;
#define __noinline__ __attribute__((noinline))
#define __align__(n) alignas(n)
#include <cstdio>
#include <cstdlib>
// a 16-byte access off 16 bytes faults on the GPU: here it ends the process, loudly
template <class T> static void aligned_or_abort(const T* p) {
  if (sizeof(T) >= 16 && ((size_t)p & 15)) {
    fprintf(stderr, "host emulation: misaligned %zu-byte access at %p\n", sizeof(T), (const void*)p);
    abort();
  }
}
template <class T> static T __ldcs(const T* p) { aligned_or_abort(p); return *p; }
template <class T> static T __ldg(const T* p) { aligned_or_abort(p); return *p; }
template <class T> static void __stcs(T* p, const T v) { aligned_or_abort(p); *p = v; }
static uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
static unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned shift) {
  return (unsigned)((((unsigned long long)hi << 32) | lo) >> (shift & 31));
}
static unsigned __cvta_generic_to_shared(const void*) { return 0; }  // unused helpers' asm
static const int lag_odd_warps = (g_sync_lag_us = 300, 0);  // see host_emulation
"""

_BUILDS: dict = {}


def _host_kernel(spec):
    """``spec``'s kernel built for the host: host_launch(grid, bx, by, tensors..., rows)."""
    if spec not in _BUILDS:
        plan = spec.plan
        assert all(d in ("bfloat16", "float16") for d in spec.parameter_dtypes())
        params = [("const unsigned short*", f"in_{n}") for n in spec.parameter_names()[:-1]]
        params += [("unsigned short*", "out_y"), ("int", "rows")]
        _BUILDS[spec] = host_emulation.build(render_normalization(spec), spec.kernel_name,
                                             params, plan.cluster, plan.dynamic_shared_bytes,
                                             HOST_EXTRAS)
    return _BUILDS[spec]


@pytest.mark.parametrize("kind, dtype, hidden, cluster, rows, teams, offset, threads", [
    ("layer_norm", "bfloat16", 2048, 2, 7, 2, 0, None),   # aligned rows, a team's rows of both parities
    ("rms_norm", "float16", 2560, 4, 9, 2, 0, None),
    ("layer_norm", "bfloat16", 2001, 3, 10, 2, 0, None),  # rows at every 2-byte phase of a granule
    ("rms_norm", "bfloat16", 1999, 2, 6, 1, 1, None),     # x and y 2 bytes off their allocations
    ("layer_norm", "float16", 8100, 8, 5, 1, 3, None),    # a last CTA with a short slice
    ("layer_norm", "bfloat16", 2048, 2, 1, 2, 0, None),   # fewer rows than teams: a team without rows
    # blocks of several warps (their sums through shared memory, by the row's parity; the
    # odd warps leave each block barrier late)
    ("layer_norm", "bfloat16", 6144, 2, 6, 1, 0, 96),
    ("rms_norm", "float16", 8191, 3, 5, 2, 0, 64),
    ("layer_norm", "float16", 16384, 4, 4, 1, 1, 128),
    # rows on 16 bytes but off a 128-byte line (the envelope then starts at the line:
    # `LaunchPlan.envelope_line`, chunks before the row in slot 0), at every 16-byte
    # phase of a line, the first 80 or 48 bytes into one
    ("layer_norm", "bfloat16", 2120, 2, 7, 2, 40, None),
    ("rms_norm", "float16", 2568, 4, 9, 2, 24, None),
    ("layer_norm", "bfloat16", 2056, 2, 9, 2, 8, None),
])
def test_cluster_rows_match_float64_on_the_host(kind, dtype, hidden, cluster, rows, teams, offset,
                                                threads):
    spec = getattr(NormalizationSpec, kind)(rows, hidden, 1e-5, dtype, envelope=True,
                                            cluster=cluster, alignment=16 if offset % 8 == 0 else 2,
                                            threads_per_row=threads)
    plan = spec.plan
    assert plan.cluster == cluster and plan.rows_per_block == 1
    assert plan.threads_per_row == (threads or 32)
    assert plan.one_pass == (kind == "layer_norm")
    # rows off 16 bytes read the weight (and bias) from the CTA's staged copies
    assert plan.staged == (0 if spec.rows_aligned else 2 * len(spec.tensor_sizes()))
    if hidden % 64 and offset % 8 == 0:
        assert plan.envelope_line == 128 and "kLine = 128;" in render_normalization(spec)
    _check_on_the_host(spec, teams * cluster, offset)


@pytest.mark.parametrize("kind, hidden, cluster, offset, tensor_offset, y_offset", [
    ("layer_norm", 2001, 3, 0, 3, 0),   # rows at every phase; weight and bias at others
    ("rms_norm", 1999, 2, 1, 5, 1),
    ("rms_norm", 1999, 2, 1, 0, 4),     # y off x's phase: the staged kernel's own store test
])
def test_staged_cluster_rows_with_tensors_off_16_bytes_match_float64(kind, hidden, cluster,
                                                                      offset, tensor_offset,
                                                                      y_offset):
    """`LaunchPlan.staged`: a cluster on rows off 16 bytes copies its columns of the
    weight (and bias) into shared memory at one phase, whatever the tensors' own (here
    each at another), and reads them there."""
    spec = getattr(NormalizationSpec, kind)(7, hidden, 1e-5, "bfloat16", envelope=True,
                                            cluster=cluster, alignment=2)
    assert spec.plan.staged and "s_weight" in render_normalization(spec)
    _check_on_the_host(spec, 2 * cluster, offset, tensor_offset, y_offset)


@pytest.mark.parametrize("kind, hidden, rows, offset, one_pass, y_offset", [
    ("layer_norm", 2001, 9, 0, True, 0),    # one row a block of 96 threads, rows at every phase
    ("layer_norm", 7001, 5, 1, None, 1),    # the two-pass statistics, bases 2 bytes off
    ("rms_norm", 513, 10, 0, None, 0),      # four rows a block, one warp each
    ("rms_norm", 100, 7, 3, None, 3),       # one chunk a thread: every chunk partial or whole
    # the row's last chunk in either of two slots (kEdgeA != kEdgeB: ceil(hidden / 8) a
    # multiple of the threads), rows of the last block past the end
    ("rms_norm", 250, 9, 1, None, 1),
    ("layer_norm", 253, 9, 1, None, 1),
    ("rms_norm", 5, 9, 1, None, 1),         # one chunk a row, first and last at once
    ("layer_norm", 2001, 9, 0, True, 3),    # y off x's phase: the generic path's stores
])
def test_one_block_envelope_rows_match_float64_on_the_host(kind, hidden, rows, offset, one_pass,
                                                           y_offset):
    """The envelope kernel without a cluster (one row on a block's threads, or several rows
    a block), which the GPU tests alone ran before."""
    spec = getattr(NormalizationSpec, kind)(rows, hidden, 1e-5, "bfloat16", envelope=True,
                                            alignment=16 if offset == 0 else 2, one_pass=one_pass)
    plan = spec.plan
    assert plan.envelope and plan.cluster == 1
    _check_on_the_host(spec, -(-rows // plan.rows_per_block), offset, y_offset=y_offset)


def _check_on_the_host(spec, grid: int, offset: int, tensor_offset: int = 0,
                       y_offset: int | None = None) -> None:
    """Runs ``spec``'s kernel on the host over ``grid`` blocks, x ``offset`` elements into
    its buffer and y ``y_offset`` (default: ``offset``, x's phase) into its own, the weight
    ``tensor_offset`` (the bias one more if any), and checks y against float64 and that
    nothing around it was written. A 16-byte access off 16 bytes aborts (HOST_EXTRAS)."""
    y_offset = offset if y_offset is None else y_offset
    plan, rows, hidden = spec.plan, spec.rows, spec.hidden
    tdt = {"bfloat16": torch.bfloat16, "float16": torch.float16}[spec.input_dtype]
    g = torch.Generator().manual_seed(hidden + rows + plan.cluster)

    def placed(t, at=offset):  # ``at`` elements into a larger buffer
        buf = torch.full((t.numel() + 64,), float("nan"), dtype=tdt)
        view = buf[at:at + t.numel()].view(t.shape)
        view.copy_(t)
        return buf, view

    # rows of different means and scales (a large mean: the shifted one-pass statistics),
    # so that a row's shares taken for another's show
    x0 = (torch.randn(rows, hidden, generator=g) * (1 + torch.arange(rows) % 4)[:, None]
          + 40 * (torch.arange(rows) % 3)[:, None])
    _, x = placed(x0.to(tdt))
    _, w = placed((torch.rand(hidden, generator=g) + 0.5).to(tdt), tensor_offset)
    _, b = placed(torch.randn(hidden, generator=g).to(tdt), tensor_offset and tensor_offset + 1)
    ybuf, y = placed(torch.full((rows, hidden), float("nan")).to(tdt), y_offset)
    guard = ybuf.clone()
    layer = "bias" in spec.parameter_names()
    tensors = {"x": x, "weight": w, "bias": b} if layer else {"x": x, "weight": w}
    args = [t.data_ptr() for t in tensors.values()] + [y.data_ptr(), rows]
    _host_kernel(spec)(grid, plan.block_threads, 1, *args)
    ref = rn.reference(spec, tensors)
    err = (y.double() - ref).abs()
    rtol = 2 ** -7 if tdt == torch.bfloat16 else 2 ** -10
    bound = rtol * ref.abs() + 2e-3 * ref.abs().max()
    assert (err <= bound).all(), (err - bound).max().item()
    # nothing written outside the rows (the envelope's partial granules are shared)
    inside = torch.zeros_like(ybuf, dtype=torch.bool)
    inside[y_offset:y_offset + rows * hidden] = True
    assert torch.equal(ybuf[~inside].isnan(), guard[~inside].isnan())


def test_line_envelope_layer_norm_on_rows_of_a_large_mean():
    """The chunks before a row on the line envelope (kLine 128: up to 56 values) stay out
    of a layer norm's shifted sums. Counted in as zeros with their -shift taken back out,
    rows of mean 1000 and spread 1 lost 7e-3 of their scale where 56 values lay before
    them (fp16, rows at 112, 0, 16 and 32 bytes into a line)."""
    rows, hidden = 4, 2120
    spec = NormalizationSpec.layer_norm(rows, hidden, 1e-5, "float16", envelope=True,
                                        cluster=2, alignment=16, threads_per_row=32)
    assert spec.plan.envelope_line == 128
    g = torch.Generator().manual_seed(7)

    def placed(t, phase_bytes):  # t's first element ``phase_bytes`` into a 128-byte line
        buf = torch.full((t.numel() + 256,), float("nan"), dtype=torch.float16)
        at = ((phase_bytes - buf.data_ptr()) % 128) // 2
        view = buf[at:at + t.numel()].view(t.shape)
        view.copy_(t)
        return view

    x = placed((1000 + torch.randn(rows, hidden, generator=g)).half(), 112)
    w = placed((torch.rand(hidden, generator=g) + 0.5).half(), 0)
    b = placed(torch.randn(hidden, generator=g).half(), 0)
    y = placed(torch.full((rows, hidden), float("nan")).half(), 112)
    assert {(x[r].data_ptr() & 127) for r in range(rows)} == {112, 0, 16, 32}
    _host_kernel(spec)(2, spec.plan.block_threads, 1, x.data_ptr(), w.data_ptr(),
                       b.data_ptr(), y.data_ptr(), rows)
    ref = rn.reference(spec, {"x": x, "weight": w, "bias": b})
    err = (y.double() - ref).abs().max() / ref.abs().max()
    assert err < 1e-3, err.item()
