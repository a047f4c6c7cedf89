"""The fused QKV rotary kernels (runtime.rotary) on a GPU against float64, fp16 and bf16,
head widths that take 16-, 8- and 2-byte vectors, a qkv with a row pitch, and the kernel
path actually taken."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("cupy")

from hostir.nn.transformer import rotary_tables  # noqa: E402
from lowering.kernels.rotary import RotarySpec  # noqa: E402
from runtime import fused, rotary  # noqa: E402

pytestmark = pytest.mark.gpu

# one rounding of a float32 result: half an ulp, plus the float32 products' error
RTOL = {torch.float16: 2 ** -10, torch.bfloat16: 2 ** -7}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("t,hq,hkv,d,pad", [(4096, 32, 8, 128, 0), (300, 4, 2, 64, 8),
                                            (77, 3, 3, 12, 2), (5, 2, 1, 6, 0)])
def test_forward_and_backward_against_float64(dtype, t, hq, hkv, d, pad):
    g = torch.Generator(device="cuda").manual_seed(t + d)
    width = (hq + 2 * hkv) * d
    base = torch.randn(t, width + pad, generator=g, device="cuda", dtype=dtype)
    qkv = base[:, :width]  # a row pitch of width + pad
    cos, sin = rotary_tables(t, d, 10000.0, "cuda", dtype)
    fused._RECORDS.clear()  # launch records hold their kernels: a cold path loads anew
    for key in [k for k in fused._KERNELS if isinstance(k[0], RotarySpec)]:
        del fused._KERNELS[key]
    got = rotary.rotary_forward(qkv, cos, sin, hq, hkv)
    assert any(isinstance(k[0], RotarySpec) for k in fused._KERNELS), \
        "the kernel path was not taken"
    want = rotary.rotary_forward_reference(qkv.double(), cos.double(), sin.double(), hq, hkv)
    for a, b in zip(got, want):
        assert a.dtype == dtype and a.is_contiguous()
        torch.testing.assert_close(a.double(), b, rtol=RTOL[dtype], atol=RTOL[dtype] * 2)
    grads = [torch.randn(w.shape, generator=g, device="cuda", dtype=dtype) for w in want]
    # the allocator hands this block to d_qkv: a value the kernel leaves unwritten shows
    del got
    torch.full((t, width), float("nan"), device="cuda", dtype=dtype)
    d_qkv = rotary.rotary_backward(*grads, cos, sin, hq, hkv)
    ref = rotary.rotary_backward_reference(*(x.double() for x in grads), cos.double(),
                                           sin.double(), hq, hkv)
    assert d_qkv.shape == (t, width) and d_qkv.dtype == dtype
    torch.testing.assert_close(d_qkv.double(), ref, rtol=RTOL[dtype], atol=RTOL[dtype] * 2)
