"""Transformer-seam kernels on a GPU (runtime.fused): every op in fp16 and bf16 at several
widths against float64, the residual stream bit for bit, misaligned and odd widths."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("cupy")

from runtime import fused  # noqa: E402

pytestmark = pytest.mark.gpu

DTYPES = (torch.float16, torch.bfloat16)
# (width, rows): odd widths (scalar vectors, 8-byte vectors), the model widths, one past the
# register-held range (streamed); rows past the persistent grid at the narrow widths
SHAPES = ((1, 3000), (7, 2500), (100, 5000), (768, 3000), (4096, 1000), (5140, 300),
          (8192, 300), (20000, 64))
# |got - want| <= RTOL * |want| + ATOL * max|want|: half an ulp of the dtype plus the fp32
# math's error on the row's largest terms (dx subtracts row means of similar size)
RTOL = {torch.float16: 2 ** -10, torch.bfloat16: 2 ** -7}
ATOL = {torch.float16: 1e-3, torch.bfloat16: 4e-3}


def _check(name, got, want, dtype, rtol_scale=1.0):
    assert got.dtype == dtype, (name, got.dtype)
    assert torch.isfinite(got).all(), name
    want = want.double()
    err = (got.double() - want).abs()
    bound = RTOL[dtype] * rtol_scale * want.abs() + ATOL[dtype] * want.abs().max()
    worst = (err - bound).argmax()
    assert (err <= bound).all(), (name, err.flatten()[worst].item(), want.flatten()[worst].item())


def _randn(shape, gen, dtype, scale=1.0, shift=0.0):
    return (torch.randn(shape, device="cuda", generator=gen) * scale + shift).to(dtype)


def _norm64(h64, w64, b64, eps, kind):
    if kind == "rms_norm":
        rstd = torch.rsqrt(h64.pow(2).mean(-1, keepdim=True) + eps)
        return h64 * rstd * w64, None, rstd.squeeze(-1)
    mean = h64.mean(-1, keepdim=True)
    rstd = torch.rsqrt((h64 - mean).pow(2).mean(-1, keepdim=True) + eps)
    y = (h64 - mean) * rstd * w64
    return (y + b64 if b64 is not None else y), mean.squeeze(-1), rstd.squeeze(-1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width, rows", SHAPES)
@pytest.mark.parametrize("kind", fused.NORM_KINDS)
def test_add_norm_forward_and_backward_against_float64(dtype, width, rows, kind):
    gen = torch.Generator(device="cuda").manual_seed(width * 7 + rows)
    eps = 1e-5
    x = _randn((rows, width), gen, dtype)
    x[1::5] = x[1::5] * 3 + 40.0  # rows with a large mean: a one-pass variance would fail
    r = _randn((rows, width), gen, dtype)
    w = _randn(width, gen, dtype, 0.3, 1.0)
    b = _randn(width, gen, dtype) if kind == "layer_norm" else None
    dy = _randn((rows, width), gen, dtype)
    dh = _randn((rows, width), gen, dtype)
    assert fused.kernel_path("add_norm_forward", x, r, w, b, eps, kind)

    y, h, mean, rstd = fused.add_norm_forward(x, r, w, b, eps, kind)
    # the residual stream: x + r rounded once, as torch's own add gives it
    assert torch.equal(h, x + r)
    h64 = h.double()
    y64, mean64, rstd64 = _norm64(h64, w.double(), None if b is None else b.double(), eps, kind)
    _check("y", y, y64, dtype)
    assert rstd.dtype == torch.float32 and rstd.shape == (rows,)
    assert torch.allclose(rstd.double(), rstd64, rtol=2e-5, atol=0)
    if kind == "layer_norm":
        assert torch.allclose(mean.double(), mean64, rtol=1e-5, atol=1e-5)
    else:
        assert mean is None

    # no residual: h is x itself, and the same norm
    y1, h1, _, _ = fused.add_norm_forward(h, None, w, b, eps, kind)
    assert h1 is h
    assert torch.equal(y1, y)

    for with_dh in (False, True):
        dx, dw, db = fused.add_norm_backward(dy, h, w, mean, rstd, kind, dh if with_dh else None)
        # float64 autograd through the same math
        h_leaf = h64.clone().requires_grad_()
        w_leaf = w.double().requires_grad_()
        b_leaf = None if b is None else b.double().requires_grad_()
        out, _, _ = _norm64(h_leaf, w_leaf, b_leaf, eps, kind)
        (out * dy.double()).sum().backward()
        want_dx = h_leaf.grad + (dh.double() if with_dh else 0)
        _check("dx", dx, want_dx, dtype)
        # a sum over `rows` fp32 partials, then rounded once
        _check("dweight", dw, w_leaf.grad, dtype)
        if kind == "layer_norm":
            _check("dbias", db, b_leaf.grad, dtype)
        else:
            assert db is None


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", fused.NORM_KINDS)
def test_add_norm_on_misaligned_tensors(dtype, kind):
    """Rows that start 2 bytes past a 16-byte boundary: the kernel takes narrow vectors."""
    rows, width = 33, 4096
    gen = torch.Generator(device="cuda").manual_seed(11)
    buf = _randn(rows * width + 1, gen, dtype)
    x = buf[1:].view(rows, width)
    r = _randn((rows, width), gen, dtype)
    w = _randn(width + 1, gen, dtype, 0.3, 1.0)[1:]
    b = _randn(width, gen, dtype) if kind == "layer_norm" else None
    assert x.data_ptr() % 16 and fused.kernel_path("add_norm_forward", x, r, w, b, 1e-6, kind)
    y, h, mean, rstd = fused.add_norm_forward(x, r, w, b, 1e-6, kind)
    assert torch.equal(h, x + r)
    y64, _, _ = _norm64(h.double(), w.double(), None if b is None else b.double(), 1e-6, kind)
    _check("y", y, y64, dtype)
    dy = _randn((rows, width), gen, dtype)
    dx, dw, db = fused.add_norm_backward(dy, h, w, mean, rstd, kind)
    want = fused.add_norm_backward_reference(dy.double(), h.double(), w.double(),
                                             None if mean is None else mean.double(),
                                             rstd.double(), kind)
    _check("dx", dx, want[0], dtype)
    _check("dweight", dw, want[1], dtype)


# Every kind of backward plan: single values (odd widths, any row offset), 16-byte
# vectors, 2-16 rows a tile (4608: two of three vectors a thread), clusters of 2, 4 and
# 8 CTAs (past 8192 columns), twice the held columns at the widest.
# 5140, 6001, 6002, 9999, 20001, 30001: rows off 16 bytes taken at their phase (two, eight,
# four classes of rows; one CTA, clusters of two and four)
# 8200, 20488, 40008: rows on 16 bytes at every 16-byte phase of a 128-byte line (one
# CTA's spans copied from their line); 20488, 40008 split unevenly over clusters of two
# and four, the shorter last slice bulk-copied at its own length
BACKWARD_WIDTHS = (1, 7, 100, 513, 4096, 4097, 4608, 5140, 6001, 6002, 8192, 8200, 9999,
                   16384, 16385, 20001, 20488, 24575, 30001, 40001, 40008, 65535, 65536,
                   131072)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", BACKWARD_WIDTHS)
@pytest.mark.parametrize("kind", fused.NORM_KINDS)
def test_add_norm_backward_at_every_width_against_float64(dtype, width, kind):
    rows = 777 if width <= 8192 else 37  # a last tile part full
    gen = torch.Generator(device="cuda").manual_seed(width * 5 + 1)
    h = _randn((rows, width), gen, dtype)
    h[2::7] = h[2::7] * 2 + 20.0
    w = _randn(width, gen, dtype, 0.3, 1.0)
    dy = _randn((rows, width), gen, dtype)
    dh = _randn((rows, width), gen, dtype)
    _, _, mean, rstd = fused.add_norm_forward_reference(h, None, w, None, 1e-5, kind)
    assert fused.kernel_path("add_norm_backward", dy, h, w, mean, rstd, kind, dh)
    for extra in (None, dh):
        dx, dw, db = fused.add_norm_backward(dy, h, w, mean, rstd, kind, extra)
        want = fused.add_norm_backward_reference(
            dy.double(), h.double(), w.double(), None if mean is None else mean.double(),
            rstd.double(), kind, None if extra is None else extra.double())
        _check("dx", dx, want[0], dtype)
        _check("dweight", dw, want[1], dtype)
        if kind == "layer_norm":
            _check("dbias", db, want[2], dtype)
        again = fused.add_norm_backward(dy, h, w, mean, rstd, kind, extra)
        assert torch.equal(again[0], dx) and torch.equal(again[1], dw)  # no atomics


@pytest.mark.parametrize("rule", ("fewest_clusters", "fitted"))
@pytest.mark.parametrize("width", (768, 2560, 4608, 8704, 16896, 33280))
def test_each_backward_plan_rule_against_float64(width, rule):
    """The plan rules that `seams_bench.py --sweep` times beside the default: the same
    results, on the hardware (real cp.async stages and cluster barriers)."""
    dtype, rows, kind = torch.bfloat16, 301, "layer_norm"
    gen = torch.Generator(device="cuda").manual_seed(width + 11)
    h = _randn((rows, width), gen, dtype, shift=3.0)
    w = _randn(width, gen, dtype, 0.3, 1.0)
    dy = _randn((rows, width), gen, dtype)
    dh = _randn((rows, width), gen, dtype)
    _, _, mean, rstd = fused.add_norm_forward_reference(h, None, w, None, 1e-5, kind)
    dx, dw, db = fused.add_norm_backward_fused(dy, h, w, mean, rstd, kind, dh, rule=rule)
    want = fused.add_norm_backward_reference(dy.double(), h.double(), w.double(),
                                             mean.double(), rstd.double(), kind, dh.double())
    _check("dx", dx, want[0], dtype)
    _check("dweight", dw, want[1], dtype)
    _check("dbias", db, want[2], dtype)


@pytest.mark.parametrize("width", (512, 4096, 8184, 16385, 20000, 65536))
def test_add_norm_backward_on_misaligned_rows_at_wide_widths(width):
    """Bases 2 bytes past a 16-byte boundary (a view into a larger buffer): the staged
    copies take the 16-byte cover of every span and read it at its offset."""
    dtype, rows, kind = torch.bfloat16, 19, "layer_norm"
    gen = torch.Generator(device="cuda").manual_seed(width)
    h = _randn(rows * width + 1, gen, dtype)[1:].view(rows, width)
    dy = _randn(rows * width + 1, gen, dtype)[1:].view(rows, width)
    dh = _randn(rows * width + 1, gen, dtype)[1:].view(rows, width)
    w = _randn(width + 1, gen, dtype, 0.3, 1.0)[1:]
    _, _, mean, rstd = fused.add_norm_forward_reference(h, None, w, None, 1e-5, kind)
    assert h.data_ptr() % 16 and fused.kernel_path("add_norm_backward", dy, h, w, mean, rstd,
                                                   kind, dh)
    dx, dw, db = fused.add_norm_backward(dy, h, w, mean, rstd, kind, dh)
    want = fused.add_norm_backward_reference(dy.double(), h.double(), w.double(),
                                             mean.double(), rstd.double(), kind, dh.double())
    _check("dx", dx, want[0], dtype)
    _check("dweight", dw, want[1], dtype)
    _check("dbias", db, want[2], dtype)


def test_recording_autograd_or_fp32_takes_the_torch_path():
    x = torch.randn(8, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.ones(64, device="cuda", dtype=torch.bfloat16)
    assert not fused.kernel_path("add_norm_forward", x, None, w, None, 1e-6, "rms_norm")
    y, _, _, _ = fused.add_norm_forward(x, None, w, None, 1e-6, "rms_norm")
    assert y.requires_grad  # the reference path keeps the graph
    with torch.no_grad():
        assert fused.kernel_path("add_norm_forward", x, None, w, None, 1e-6, "rms_norm")
    x32 = torch.randn(8, 64, device="cuda")
    assert not fused.kernel_path("gelu_forward", x32)
    assert torch.equal(fused.gelu_forward(x32), fused.gelu_forward_reference(x32))
    # a bias on rms_norm is outside the kernels' contract: the reference adds it
    b = torch.randn(64, device="cuda", dtype=torch.bfloat16)
    xs = x.detach()
    assert not fused.kernel_path("add_norm_forward", xs, None, w, b, 1e-6, "rms_norm")


ELEMENTWISE_SIZES = ((1,), (7,), (3, 100), (8192, 4096), (5, 20000), (1000, 5140), (13, 1001))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", ELEMENTWISE_SIZES)
def test_swiglu_and_gelu_against_float64(dtype, shape):
    gen = torch.Generator(device="cuda").manual_seed(sum(shape))
    gate, up, x, d = (_randn(shape, gen, dtype, 3.0) for _ in range(4))
    assert fused.kernel_path("swiglu_backward", d, gate, up)
    g64, u64, x64, d64 = (t.double() for t in (gate, up, x, d))
    sig = torch.sigmoid(g64)
    _check("swiglu", fused.swiglu_forward(gate, up), g64 * sig * u64, dtype)
    dgate, dup = fused.swiglu_backward(d, gate, up)
    _check("dgate", dgate, d64 * u64 * sig * (1 + g64 * (1 - sig)), dtype)
    _check("dup", dup, d64 * g64 * sig, dtype)
    x_leaf = x64.clone().requires_grad_()
    y64 = torch.nn.functional.gelu(x_leaf, approximate="tanh")
    (y64 * d64).sum().backward()
    _check("gelu", fused.gelu_forward(x), y64.detach(), dtype)
    _check("dgelu", fused.gelu_backward(d, x), x_leaf.grad, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, width", [(4096, 5504), (333, 1000), (7, 13), (64, 4)])
def test_swiglu_on_the_halves_of_a_fused_gate_up_output(dtype, rows, width):
    """Gate and up as the column halves of one [rows, 2 width] tensor (row pitch 2 width),
    the gradients written straight into the halves of another: the rows kernels."""
    gen = torch.Generator(device="cuda").manual_seed(rows + width)
    gate_up, da = _randn((rows, 2 * width), gen, dtype, 3.0), _randn((rows, width), gen, dtype, 3.0)
    gate, up = gate_up.chunk(2, dim=1)
    assert not fused.kernel_path("swiglu_forward", gate, up) and fused._rows_usable(gate, up)
    g64, u64, d64 = gate.double(), up.double(), da.double()
    sig = torch.sigmoid(g64)
    _check("swiglu rows", fused.swiglu_forward(gate, up), g64 * sig * u64, dtype)
    grad = torch.full_like(gate_up, float("nan"))
    fused.swiglu_backward(da, gate, up, out=grad.chunk(2, dim=1))
    _check("dgate rows", grad[:, :width], d64 * u64 * sig * (1 + g64 * (1 - sig)), dtype)
    _check("dup rows", grad[:, width:], d64 * g64 * sig, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_elementwise_on_misaligned_views_and_extremes(dtype):
    gen = torch.Generator(device="cuda").manual_seed(3)
    n = 10001
    buf = _randn(n + 3, gen, dtype, 4.0)
    x = buf[3:]  # 6 bytes past the allocation: single-value vectors
    big = 1e30 if dtype == torch.bfloat16 else 6e4
    x[:4] = torch.tensor([-big, big, 0.0, -0.0], dtype=dtype)
    d = _randn(n, gen, dtype)
    assert x.data_ptr() % 4 and fused.kernel_path("gelu_backward", d, x)
    y = fused.gelu_forward(x)
    dx = fused.gelu_backward(d, x)
    assert torch.isfinite(y).all() and torch.isfinite(dx).all()
    # saturated: gelu(-big) = 0, gelu(big) = big, slope 0 and 1
    assert y[:4].double().tolist() == [0.0, x[1].item(), 0.0, 0.0]
    assert dx[0] == 0 and dx[1] == d[1]
    x64 = x[4:].double().requires_grad_()
    y64 = torch.nn.functional.gelu(x64, approximate="tanh")
    (y64 * d[4:].double()).sum().backward()
    _check("gelu", y[4:], y64.detach(), dtype)
    _check("dgelu", dx[4:], x64.grad, dtype)


def test_launches_follow_the_current_stream():
    """A call on a side stream is ordered after work queued on that stream."""
    width, rows = 4096, 512
    x = torch.zeros(rows, width, device="cuda", dtype=torch.bfloat16)
    w = torch.ones(width, device="cuda", dtype=torch.bfloat16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(2_000_000)
        x.fill_(2.0)
        y, _, _, rstd = fused.add_norm_forward(x, None, w, None, 0.0, "rms_norm")
    torch.cuda.current_stream().wait_stream(side)
    assert torch.all(y == 1.0)
    assert torch.allclose(rstd, torch.full_like(rstd, 0.5))


@pytest.mark.parametrize("width", (4096, 65536))
def test_add_norm_backward_replays_in_a_cuda_graph(width):
    """Captured (the benches time graph replays) and replayed on new inputs, the staged
    backward (a cluster at 65536) gives what an eager call gives."""
    rows, kind, dtype = 64, "layer_norm", torch.bfloat16
    gen = torch.Generator(device="cuda").manual_seed(3)
    h = _randn((rows, width), gen, dtype)
    w = _randn(width, gen, dtype, 0.3, 1.0)
    dy = _randn((rows, width), gen, dtype)
    _, _, mean, rstd = fused.add_norm_forward_reference(h, None, w, None, 1e-5, kind)
    fused.add_norm_backward(dy, h, w, mean, rstd, kind)  # compiled and planned outside
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fused.add_norm_backward(dy, h, w, mean, rstd, kind)
    dy.copy_(_randn((rows, width), gen, dtype))
    graph.replay()
    torch.cuda.synchronize()
    want = fused.add_norm_backward(dy, h, w, mean, rstd, kind)
    for got, ref in zip(out, want):
        assert torch.equal(got, ref)


def test_warmup_of_a_transformer_leaves_its_norms_nothing_to_compile(tmp_path):
    """``warmup train_transformer`` plans the seam kernels with this GPU's model (the norm
    backward's stages follow its bandwidth: an H200's differ from an H100's at 2560), so
    a later process's norm forward and backward, both kinds, compile nothing."""
    from tests.gpu.warm_cache import compiles_after_warmup

    calls = (
        "import torch\n"
        "from runtime import fused\n"
        "for h in (2560, 8192):\n"
        "    x = torch.randn(512, h, device='cuda', dtype=torch.bfloat16)\n"
        "    dy = torch.randn_like(x)\n"
        "    w = torch.randn(h, device='cuda', dtype=torch.bfloat16)\n"
        "    for kind in ('layer_norm', 'rms_norm'):\n"
        "        _, _, mean, rstd = fused.add_norm_forward(x, None, w, None, 1e-5, kind)\n"
        "        fused.add_norm_backward(dy, x, w, mean, rstd, kind)\n")
    compiles, disk_hits = compiles_after_warmup(
        tmp_path, [["train_transformer", "--hidden", "2560,8192"]], calls)
    assert compiles == 0 and disk_hits >= 8, (compiles, disk_hits)
