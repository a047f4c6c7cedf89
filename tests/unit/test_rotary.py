"""The fused QKV rotary embedding: the torch path against autograd through the block's
rotate-half form, and every generated kernel compiled (NVRTC, no GPU needed)."""

from __future__ import annotations

import pytest
import torch

from hostir.errors import LoweringError
from hostir.nn.transformer import apply_rotary, rotary_tables
from lowering.kernels import rotary as kernels
from runtime import rotary


@pytest.mark.parametrize("hq,hkv,d", [(4, 2, 8), (2, 2, 6), (8, 1, 16)])
def test_reference_matches_autograd_of_the_rotate_half_form(hq, hkv, d):
    t = 5
    g = torch.Generator().manual_seed(hq * 100 + d)
    qkv = torch.randn(t, (hq + 2 * hkv) * d, generator=g, dtype=torch.float64,
                      requires_grad=True)
    cos, sin = rotary_tables(t, d, 10000.0, "cpu", torch.float64)
    q, k, v = qkv.split([hq * d, hkv * d, hkv * d], 1)
    want = (apply_rotary(q.reshape(t, hq, d), cos, sin),
            apply_rotary(k.reshape(t, hkv, d), cos, sin), v.reshape(t, hkv, d))
    got = rotary.rotary_forward(qkv.detach(), cos, sin, hq, hkv)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
    grads = [torch.randn(w.shape, generator=g, dtype=torch.float64) for w in want]
    (expected,) = torch.autograd.grad(want, qkv, grads)
    torch.testing.assert_close(rotary.rotary_backward(*grads, cos, sin, hq, hkv), expected)


def test_block_gradient_flows_through_the_fused_rotary():
    from hostir.nn.transformer import _QKVRotary

    t, hq, hkv, d = 3, 2, 1, 4
    qkv = torch.randn(t, (hq + 2 * hkv) * d, dtype=torch.float64, requires_grad=True)
    cos, sin = rotary_tables(t, d, 10000.0, "cpu", torch.float64)
    assert torch.autograd.gradcheck(lambda x: _QKVRotary.apply(x, cos, sin, hq, hkv), (qkv,))


@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
@pytest.mark.parametrize("dtype,head_dim", [("bf16", 128), ("fp16", 64), ("bf16", 6)])
def test_every_kernel_compiles_without_spills(arch, dtype, head_dim):
    pytest.importorskip("cupy")  # NVRTC through CuPy
    from runtime import jit

    for spec in kernels.every_variant(head_dim, dtype):
        ck = jit.compile(kernels.render(spec), [spec.kernel_name], arch)
        sym = ck.lowered[spec.kernel_name]
        assert ck.registers[sym] > 0, ck.log
        assert ck.spill_bytes.get(sym, 0) == 0 and ck.local_bytes.get(sym, 0) == 0, (spec, ck.log)


def test_bad_specs_are_refused():
    with pytest.raises(LoweringError, match="even"):
        kernels.RotarySpec("bf16", 7, 1, False)
    with pytest.raises(LoweringError, match="does not divide"):
        kernels.RotarySpec("bf16", 12, 4, False)
    assert kernels.vector_width(128) == 8 and kernels.vector_width(128, 4) == 2
