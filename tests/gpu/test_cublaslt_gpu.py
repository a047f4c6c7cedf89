"""The cuBLASLt binding on one GPU: both GELU epilogues against torch (tanh GELU), bf16
and fp16, odd M and K, strided rows, on a side stream, under CUDA-graph capture, no host
synchronization; shapes it cannot take are refused with a reason and fall back to torch
ops in the interpreter."""

import pytest
import torch
import torch.nn.functional as F

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

TOL = 1e-2

if torch.cuda.is_available():
    from runtime import cublaslt


def _rel(got, ref):
    got, ref = got.double(), ref.double()
    return float((got - ref).norm() / ref.norm())


def _operands(m, k, n, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(m, k, generator=g, device="cuda").to(dtype)
    b = (torch.randn(k, n, generator=g, device="cuda") / k ** 0.5).to(dtype)
    return a, b


SHAPES = [(128, 256, 64), (127, 257, 64), (1, 72, 8), (333, 1000, 136), (2048, 1024, 4096)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m,k,n", SHAPES)
def test_gelu_aux(m, k, n, dtype):
    a, b = _operands(m, k, n, dtype)
    out = torch.empty(m, n, device="cuda", dtype=dtype)
    pre = torch.empty_like(out)
    cublaslt.matmul(a, b, out, "gelu_aux", pre)
    ref = a.double() @ b.double()
    assert _rel(pre, ref) < TOL
    assert _rel(out, F.gelu(ref, approximate="tanh")) < TOL


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m,k,n", SHAPES)
def test_dgelu(m, k, n, dtype):
    a, b = _operands(m, k, n, dtype, seed=1)
    pre = torch.randn(m, n, device="cuda").to(dtype)
    out = torch.empty(m, n, device="cuda", dtype=dtype)
    cublaslt.matmul(a, b, out, "dgelu", pre)
    x = pre.double().requires_grad_()
    F.gelu(x, approximate="tanh").backward(a.double() @ b.double())
    assert _rel(out, x.grad) < TOL


def test_no_epilogue_and_strided_rows():
    a, b = _operands(256, 512, 128, torch.bfloat16)
    big = torch.empty(256, 256, device="cuda", dtype=torch.bfloat16)
    out = big[:, 64:192]  # rows of 128 with a leading dimension of 256
    cublaslt.matmul(a, b, out)
    assert _rel(out, a.double() @ b.double()) < TOL


def test_side_stream_graph_capture_and_no_host_sync():
    a, b = _operands(512, 512, 512, torch.bfloat16)
    out, pre = (torch.empty(512, 512, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    cublaslt.matmul(a, b, out, "gelu_aux", pre)  # plans made outside the checks below
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.cuda.stream(side):
            out2, pre2 = torch.empty_like(out), torch.empty_like(pre)
            cublaslt.matmul(a, b, out2, "gelu_aux", pre2)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.current_stream().wait_stream(side)
    torch.testing.assert_close(out2, out, rtol=0, atol=0)
    torch.testing.assert_close(pre2, pre, rtol=0, atol=0)
    graph, out3, pre3 = torch.cuda.CUDAGraph(), torch.empty_like(out), torch.empty_like(pre)
    with torch.cuda.graph(graph):
        cublaslt.matmul(a, b, out3, "gelu_aux", pre3)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out3, out, rtol=0, atol=0)


def test_plans_are_cached():
    a, b = _operands(64, 64, 64, torch.bfloat16)
    out = torch.empty(64, 64, device="cuda", dtype=torch.bfloat16)
    cublaslt.matmul(a, b, out)
    before = len(cublaslt._PLANS)
    for _ in range(3):
        cublaslt.matmul(a, b, torch.empty_like(out))
    assert len(cublaslt._PLANS) == before


def test_refusals_and_the_interpreter_fallback():
    from runtime.kernels import matmul_epilogue

    a, b = _operands(32, 64, 12, torch.bfloat16)  # N = 12: not a multiple of 8
    out, pre = torch.empty(32, 12, device="cuda", dtype=torch.bfloat16), torch.empty(
        32, 12, device="cuda", dtype=torch.bfloat16)
    assert "multiple of 8" in cublaslt.unsupported(a, b, out, "gelu_aux", pre)
    with pytest.raises(cublaslt.CublasLtError, match="multiple of 8"):
        cublaslt.matmul(a, b, out, "gelu_aux", pre)
    matmul_epilogue(a, b, out, "gelu_aux", pre)  # torch ops instead
    ref = a.double() @ b.double()
    assert _rel(pre, ref) < TOL and _rel(out, F.gelu(ref, approximate="tanh")) < TOL
    a32, b32 = a.float(), b.float()
    out32, pre32 = out.float(), pre.float()
    assert "bfloat16 or float16" in cublaslt.unsupported(a32, b32, out32, "gelu_aux", pre32)


@pytest.mark.parametrize("epilogue", ["gelu_aux", "dgelu"])
def test_interpreter_runs_the_epilogue_on_cublaslt(epilogue):
    """A Matmul statement with an epilogue, run by the CUDA interpreter."""
    from hostir import ir
    from runtime.device import make_backend
    from runtime.interpreter import Interpreter

    m, k, n, dt = 256, 128, 64, "bfloat16"
    A, B = ir.Tensor("T0", (m, k), dt), ir.Tensor("T1", (k, n), dt)
    out, pre = ir.Tensor("T2", (m, n), dt), ir.Tensor("T3", (m, n), dt)
    if epilogue == "gelu_aux":
        p = ir.Program((A, B), (out, pre), (ir.Allocate(out), ir.Allocate(pre),
                                            ir.Matmul(out, A, B, epilogue, pre)))
    else:
        p = ir.Program((A, B, pre), (out,), (ir.Allocate(out), ir.Matmul(out, A, B, epilogue, pre)))
    a, b = _operands(m, k, n, torch.bfloat16, seed=3)
    run = Interpreter(p, make_backend("cuda:0"))
    ref = a.double() @ b.double()
    if epilogue == "gelu_aux":
        got, got_pre = run(a, b)
        assert _rel(got_pre, ref) < TOL and _rel(got, F.gelu(ref, approximate="tanh")) < TOL
    else:
        pre_t = torch.randn(m, n, device="cuda").bfloat16()
        (got,) = run(a, b, pre_t)
        x = pre_t.double().requires_grad_()
        F.gelu(x, approximate="tanh").backward(ref)
        assert _rel(got, x.grad) < TOL
