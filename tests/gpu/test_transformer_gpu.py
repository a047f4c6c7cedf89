"""ParallelTransformerBlock on one GPU (world size 1) in bf16, forward and backward, against
the unsharded LlamaBlock in float64: outputs, the input's gradient and every parameter's."""

from __future__ import annotations

import copy
import socket

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from hostir.nn import parallelize  # noqa: E402
from hostir.nn.llama import shard_state_dict  # noqa: E402
from tests.numerics import rel_err as _err  # noqa: E402
from tests.numerics import reference_block  # noqa: E402

pytestmark = pytest.mark.gpu
TOL = 3e-2  # bf16 weights, activations and GEMM outputs; float32 norms and softmax


@pytest.fixture(scope="module")
def group():
    """A one-rank NCCL group (the caller's torch.distributed group, as torchrun gives)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                                world_size=1)
    return None


def _reference(style, hidden, heads, kv_heads, ffn):
    return reference_block(hidden, heads, kv_heads, ffn, style)


@pytest.mark.parametrize("style", ["llama", "gpt2"])
@pytest.mark.parametrize("hidden,heads,kv_heads,ffn,tokens", [
    (256, 8, 2, 768, 128), (1024, 8, 8, 2816, 512)])
def test_block_bf16_matches_float64(group, style, hidden, heads, kv_heads, ffn, tokens):
    ref = _reference(style, hidden, heads, kv_heads, ffn)
    block = parallelize(copy.deepcopy(ref).cuda().bfloat16(), comm="torch")
    g = torch.Generator().manual_seed(1)
    x = torch.randn(tokens, hidden, generator=g)
    dy = torch.randn(tokens, hidden, generator=g)
    xb = x.cuda().bfloat16().requires_grad_()
    y = block(xb)
    y.backward(dy.cuda().bfloat16())
    ref64 = ref.cuda().double()
    # The reference sees the bf16-rounded weights and inputs: what the block computes on.
    with torch.no_grad():
        for p, q in zip(ref64.parameters(), copy.deepcopy(ref).bfloat16().parameters()):
            p.copy_(q.double())
    xr = xb.detach().double().requires_grad_()
    yr = ref64(xr[None])[0]
    yr.backward(dy.cuda().bfloat16().double())
    assert y.dtype == torch.bfloat16 and y.shape == (tokens, hidden)
    assert _err(y, yr) < TOL
    assert _err(xb.grad, xr.grad) < TOL
    want = shard_state_dict({n: p.grad for n, p in ref64.named_parameters()}, block)
    for name, p in block.named_parameters():
        assert p.grad is not None and p.grad.dtype == torch.bfloat16, name
        assert _err(p.grad, want[name]) < TOL, name


def test_captured_blocks_train_like_eager_ones(group):
    """hostir.nn.capture_blocks: three AdamW steps of two graphed blocks give the losses
    and weights of the same blocks run eagerly (the graphs replay the same kernels)."""
    from hostir.nn import capture_blocks

    hidden, heads, kv, ffn, tokens = 256, 8, 2, 768, 128
    refs = [_reference("llama", hidden, heads, kv, ffn) for _ in range(2)]
    models = [torch.nn.Sequential(*[parallelize(copy.deepcopy(r).cuda().bfloat16(), comm="torch")
                                    for r in refs]) for _ in range(2)]
    g = torch.Generator().manual_seed(2)
    x = torch.randn(tokens, hidden, generator=g).cuda().bfloat16()
    target = torch.randn(tokens, hidden, generator=g).cuda().bfloat16()
    models[1] = capture_blocks(models[1], x)
    losses = [[], []]
    for model, out in zip(models, losses):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for _ in range(3):
            opt.zero_grad()
            loss = ((model(x).float() - target.float()) ** 2).mean()
            loss.backward()
            opt.step()
            out.append(float(loss))
    assert losses[0][-1] < losses[0][0]  # it trains
    assert losses[1] == pytest.approx(losses[0], rel=1e-3), losses
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        assert _err(b.double(), a.double()) < 1e-2


def test_capture_refuses_several_ranks_and_passes_cpu_through():
    from hostir.errors import LoweringError
    from hostir.nn import capture_blocks

    block = torch.nn.Linear(4, 4)
    cpu = capture_blocks([block], torch.randn(2, 4))
    assert list(cpu) == [block]
    block.world_size = 2
    with pytest.raises(LoweringError, match="one rank only"):
        capture_blocks([block], torch.randn(2, 4, device="cuda"))
