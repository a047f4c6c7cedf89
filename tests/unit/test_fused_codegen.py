"""Transformer-seam kernels without a GPU: plans, NVRTC compiles (no spills), and the torch
reference path of runtime.fused against float64 autograd of torch's own ops."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hostir.errors import LoweringError
from lowering.kernels import seams as S
from runtime import fused

MAIN_HIDDEN = (768, 4096, 8192)
ODD_HIDDEN = (1, 7, 100, 5140, 16384, 20000)


# --------------------------------------------------------------------------- plans


@pytest.mark.parametrize("hidden, alignment, vector", [
    (4096, 16, 8), (5140, 16, 4), (7, 16, 1), (100, 16, 4), (4098, 16, 2), (4096, 8, 4),
    (4096, 2, 1), (20000, 16, 8),
])
def test_vector_width_divides_the_row_and_fits_the_alignment(hidden, alignment, vector):
    assert S.vector_width(hidden, alignment) == vector


@pytest.mark.parametrize("hidden", MAIN_HIDDEN + ODD_HIDDEN)
def test_row_plans_cover_the_row(hidden):
    for floats in (S.FORWARD_CACHE_FLOATS, S.BACKWARD_CACHE_FLOATS):
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
        assert S.AddNormBackwardSpec("layer_norm", "bf16", hidden, True).plan.cached
    assert not S.AddNormBackwardSpec("rms_norm", "bf16", 20000, False).plan.cached


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


# --------------------------------------------------------------------------- NVRTC

cupy = pytest.importorskip("cupy")
from runtime import jit  # noqa: E402


def _assert_compiles_clean(spec, arch):
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


@pytest.mark.parametrize("dtype", S.DTYPES)
@pytest.mark.parametrize("hidden", ODD_HIDDEN)
def test_odd_widths_compile(dtype, hidden):
    for spec in S.every_variant(hidden, dtype):
        if isinstance(spec, (S.AddNormForwardSpec, S.AddNormBackwardSpec)):
            _assert_compiles_clean(spec, "sm_90")


@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
@pytest.mark.parametrize("dtype", S.DTYPES)
def test_elementwise_and_reduce_kernels_compile(arch, dtype):
    for alignment in (16, 8, 4, 2):
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
