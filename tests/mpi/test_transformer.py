"""ParallelTransformerBlock on CPU ranks: `mpirun -np N python -m pytest --with-mpi`.

Every rank builds the same unsharded LlamaBlock from the same seed, parallelizes it, runs
its tokens, and compares with the unsharded block in float64 (outputs and every gradient,
this rank's shards), with torch's own tensor parallelism over 10 AdamW steps, and runs the
train_transformer job's --check."""

import copy

import pytest
import torch

from hostir import ir
from hostir.errors import HostIrError, InputMismatchError, LoweringError
from hostir.nn import LlamaBlock, ParallelTransformerBlock, parallelize, sequence_rows, shard_sequence
from hostir.nn.llama import llama_state_dict, shard_state_dict, torch_parallelize
from tests.numerics import rel_err as _err
from tests.numerics import reference_block

pytestmark = pytest.mark.mpi(min_size=2)

HIDDEN, HEADS, KV_HEADS, FFN = 64, 8, 4, 128  # kv heads divide 2 and 4 ranks


def _reference(style, seed=0, dtype=torch.float32):
    return reference_block(HIDDEN, HEADS, KV_HEADS, FFN, style, seed, dtype)


@pytest.mark.parametrize("schedule", ["pipelined", "ring"])
@pytest.mark.parametrize("stages", [1, 2])
@pytest.mark.parametrize("style", ["llama", "gpt2"])
def test_block_matches_the_unsharded_block(world, comm, style, stages, schedule):
    rank, d = world
    ref = _reference(style, seed=stages)
    block = parallelize(copy.deepcopy(ref), stages=stages, comm=comm, schedule=schedule)
    t = 16 * stages
    g = torch.Generator().manual_seed(7)
    x, dy = torch.randn(t, HIDDEN, generator=g), torch.randn(t, HIDDEN, generator=g)
    rows = sequence_rows(t, stages, d, rank)
    x_local = x[rows].clone().requires_grad_()
    y = block(x_local)
    assert y.shape == (t // d, HIDDEN)
    y.backward(dy[rows])
    ref64 = ref.double()
    xr = x.double().requires_grad_()
    yr = ref64(xr[None])[0]
    yr.backward(dy.double())
    assert _err(y, yr[rows]) < 1e-5
    assert _err(x_local.grad, xr.grad[rows]) < 1e-5
    want = shard_state_dict({n: p.grad for n, p in ref64.named_parameters()}, block)
    names = [n for n, _ in block.named_parameters()]
    assert set(names) == set(want)
    for name, p in block.named_parameters():
        assert _err(p.grad, want[name]) < 1e-5, name


def test_replicated_gradients_are_the_same_on_every_rank(world, comm):
    from mpi4py import MPI

    rank, d = world
    block = copy.deepcopy(parallelize(_reference("gpt2"), comm=comm))  # a copy reduces too
    x = torch.randn(16, HIDDEN, generator=torch.Generator().manual_seed(rank))
    block(shard_sequence(x, 1, d, rank)).pow(2).sum().backward()
    for p in (block.input_layernorm.weight, block.post_attention_layernorm.bias,
              block.o_proj_bias, block.down_proj_bias):
        every = MPI.COMM_WORLD.allgather(p.grad)
        assert all(torch.equal(every[0], other) for other in every)


@pytest.mark.parametrize("style", ["llama", "gpt2"])
def test_state_dict_round_trip(world, comm, style):
    ref = _reference(style)
    block = parallelize(ref, comm=comm)
    assert block.qkv_proj.weight.shape == (HIDDEN, (HEADS + 2 * KV_HEADS) * 8 // world[1])
    full = llama_state_dict(block)
    assert full.keys() == ref.state_dict().keys()
    for name, value in ref.state_dict().items():
        assert torch.equal(full[name], value), name


def test_same_losses_as_torch_tensor_parallel(world, comm):
    """10 AdamW steps of our block and of torch.distributed.tensor.parallel's (sequence
    parallel norms, column-wise Q/K/V/gate/up, row-wise O/down to Shard(1)) on gloo."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    from runtime.session import init_torch_distributed_from_mpi

    init_torch_distributed_from_mpi("gloo")
    rank, d = world
    ref = _reference("llama", seed=3)
    ours = parallelize(copy.deepcopy(ref), comm=comm)
    mesh = init_device_mesh("cpu", (d,))
    theirs = torch_parallelize(copy.deepcopy(ref), mesh)
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (ours, theirs)]
    t = 8 * d
    for step in range(10):
        g = torch.Generator().manual_seed(step)
        x, target = torch.randn(t, HIDDEN, generator=g), torch.randn(t, HIDDEN, generator=g)
        mine = x.chunk(d)[rank]
        loss = ((ours(mine) - target.chunk(d)[rank]) ** 2).sum() / x.numel()
        shard = lambda v: DTensor.from_local(v[None].chunk(d, 1)[rank], mesh, [Shard(1)])  # noqa: E731
        their_loss = ((theirs(shard(x)) - shard(target)) ** 2).sum() / x.numel()
        for opt, value in zip(opts, (loss, their_loss)):
            opt.zero_grad()
            value.backward()
            opt.step()
        total = torch.tensor([float(loss.detach())])
        torch.distributed.all_reduce(total)
        theirs_total = float(their_loss.detach().full_tensor())
        assert abs(float(total) - theirs_total) <= 1e-5 * theirs_total, (step, total, theirs_total)


def test_the_job_check_passes(world, comm, capsys):
    from hostir.jobs import train_transformer as job

    rank, d = world
    args = job.parse([f"--comm={comm}", "--device=cpu", "--check", "--steps=3",
                      "--hidden=64", f"--heads={2 * d}", f"--kv-heads={d}", "--tokens=32"])
    assert job.main(args) == 0
    out = capsys.readouterr().out
    if rank == 0:
        assert out.count("worst gradient rel. error") == 3 and out.rstrip().endswith("PASS")


def test_dump_prints_each_sublayer_program(world, comm, capsys):
    import dataclasses
    import re

    from hostir.options import options, set_options

    rank, d = world
    saved = options()
    set_options(dataclasses.replace(saved, dumps=saved.dumps | {"host_ir"}))
    try:  # a shape of its own, so that its plans are built here
        block = ParallelTransformerBlock(48, 2 * d, kv_heads=d, ffn=40 * d, comm=comm)
        block(torch.randn(6, 48)).sum().backward()
    finally:
        set_options(saved)
    out = capsys.readouterr().out
    heads = re.findall(r"^// (.*)$", out, re.M)
    if rank != 0:
        assert not heads
        return
    labels = [h.split(":")[0] + " / " + h.split(": ")[-1].split(" (")[0] for h in heads]
    # each program is lowered, and dumped, when it first runs: forwards, then backwards
    assert labels == ["attention qkv / forward, AllGather+GEMM",
                      "attention out / forward, GEMM+ReduceScatter, then residual add "
                      "+ rms_norm a stage",
                      "mlp gate_up / forward, AllGather+GEMM",
                      "mlp down / forward, GEMM+ReduceScatter",
                      "mlp down / backward dx, AllGather+GEMM",
                      "mlp gate_up / backward dx, GEMM+ReduceScatter",
                      "attention out / backward dx, AllGather+GEMM",
                      "attention qkv / backward dx, GEMM+ReduceScatter"], labels


def test_one_allgather_feeds_q_k_and_v(world, comm):
    """The fused QKV program gathers once a stage and multiplies once: no gather per
    projection."""
    from hostir import nn as tp

    rank, d = world
    block = ParallelTransformerBlock(32, 2 * d, kv_heads=d, ffn=16 * d, comm=comm,
                                     schedule="pipelined")
    x = torch.randn(4, 32)
    block(x)
    plan = tp._plan("column", block.qkv_proj, x)
    body = list(ir.walk(plan.fwd.program.body))
    gathers = [s for s in body if isinstance(s, ir.Communication)]
    assert [s.type for s in gathers] == [ir.CommunicationType.Allgather] * block.stages
    assert sum(isinstance(s, ir.Matmul) for s in body) == block.stages


def test_refusals_on_every_rank_before_any_collective(world, comm):
    rank, d = world
    with pytest.raises(LoweringError, match=f"kv_heads=3 over {d} ranks"):
        ParallelTransformerBlock(48, 6, kv_heads=3, ffn=16 * d, comm=comm)
    with pytest.raises(LoweringError, match="heads=6 is not a multiple of kv_heads=4"):
        ParallelTransformerBlock(48, 6, kv_heads=4, comm=comm)
    with pytest.raises(LoweringError, match="hidden=50 is not a multiple of heads=4"):
        ParallelTransformerBlock(50, 4, comm=comm)
    bad = LlamaBlock(HIDDEN, HEADS, KV_HEADS, FFN)
    bad.mlp.down_proj = torch.nn.Linear(FFN + 2, HIDDEN, bias=False)
    with pytest.raises(InputMismatchError, match=r"mlp.down_proj.weight: expected shape \[64, 128\]"):
        parallelize(bad, comm=comm)
    unnamed = LlamaBlock(HIDDEN, HEADS, KV_HEADS, FFN)
    unnamed.self_attn.query = unnamed.self_attn.q_proj
    del unnamed.self_attn.q_proj
    with pytest.raises(InputMismatchError, match="LlamaBlock has no self_attn.q_proj"):
        parallelize(unnamed, comm=comm)
    block = parallelize(LlamaBlock(HIDDEN, HEADS, KV_HEADS, FFN), stages=2, comm=comm)
    with pytest.raises(HostIrError, match="expected a multiple of stages"):
        block(torch.randn(3, HIDDEN))  # 3*d tokens over 2 stages of d ranks


@pytest.mark.parametrize("flags,message", [
    (["--tokens=7"], "tensor tokens axis 0: extent 7 does not split"),
    (["--kv-heads=3"], "heads=8 is not a multiple of kv_heads=3"),
    (["--bench"], "--bench needs a CUDA GPU"),
    (["--json=/nonexistent/x.json", "--bench"], "--bench needs a CUDA GPU"),
])
def test_the_job_refuses_bad_flags_on_every_rank(world, flags, message):
    """Refused in the argument check, before any collective, on every rank alike (marked
    so that hostir.run prints one line and does not abort the other ranks)."""
    from hostir.jobs import train_transformer as job
    from hostir.jobs.preflight import JobError

    with pytest.raises((HostIrError, JobError), match=message) as info:
        job.main(job.parse(["--device=cpu", "--kv-heads=4"] + flags))  # 4: divides 2 and 4 ranks
    assert info.value.on_every_rank


def test_flag_values_are_refused_by_the_parser():
    """Out-of-range values end in the parser's one-line UsageError (hostir.run prints it
    on every rank: the flags are the same everywhere)."""
    from hostir.jobs import train_transformer as job
    from hostir.jobs.preflight import UsageError

    for flags, message in ((["--steps=0"], "argument --steps: expected an integer >= 1"),
                           (["--lr=-1"], "argument --lr: expected a number > 0"),
                           (["--device=gpu"], "argument --device: expected auto, cpu")):
        with pytest.raises(UsageError, match=message):
            job.parse(flags)


class _TinyLM(torch.nn.Module):
    """A plain torch model: embedding, Llama blocks looped over, final norm, head."""

    def __init__(self, vocab=40, layers=2):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, HIDDEN)
        self.layers = torch.nn.ModuleList(LlamaBlock(HIDDEN, HEADS, KV_HEADS, FFN)
                                          for _ in range(layers))
        self.norm = torch.nn.RMSNorm(HIDDEN, eps=1e-6)
        self.head = torch.nn.Linear(HIDDEN, vocab, bias=False)

    def forward(self, ids):
        h = self.embed(ids)
        for layer in self.layers:
            h = layer(h)
        return self.head(self.norm(h))


@pytest.mark.parametrize("stages", [1, 2])
def test_parallelize_model_trains_like_the_unsharded_model(world, comm, stages):
    """A whole model adopted: the same losses over AdamW steps as the unsharded model,
    and the same gradients of what stays replicated (embedding, final norm, head), which
    the blocks' backward, the shard's gather and the gather's split all reach."""
    from hostir.nn import parallelize_model

    rank, d = world
    torch.manual_seed(3)
    ref = _TinyLM()
    model = parallelize_model(copy.deepcopy(ref), stages=stages, comm=comm)
    assert [type(b).__name__ for b in model.layers] == ["ParallelTransformerBlock"] * 2
    assert model.layers[0].shard_input and model.layers[1].gather_output
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (ref, model)]
    g = torch.Generator().manual_seed(11)
    for step in range(3):
        ids = torch.randint(0, 40, (16 * stages,), generator=g)
        target = torch.randint(0, 40, (16 * stages,), generator=g)
        losses = []
        for m, opt in zip((ref, model), opts):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(m(ids), target)
            loss.backward()
            losses.append(loss)
        assert abs(losses[0].item() - losses[1].item()) < 1e-4 * abs(losses[0].item()), step
        for name in ("embed.weight", "norm.weight", "head.weight"):
            assert _err(model.get_parameter(name).grad, ref.get_parameter(name).grad) < 1e-4, \
                (step, name)
        for opt in opts:
            opt.step()


def test_parallelize_model_refusals(world, comm):
    from hostir.nn import parallelize_model

    with pytest.raises(InputMismatchError, match="holds no Llama-style block"):
        parallelize_model(torch.nn.Sequential(torch.nn.Linear(4, 4)), comm=comm)
    with pytest.raises(InputMismatchError, match="is itself a block"):
        parallelize_model(LlamaBlock(HIDDEN, HEADS, KV_HEADS, FFN), comm=comm)
    model = parallelize_model(_TinyLM(), stages=2, comm=comm)
    with pytest.raises(HostIrError, match="tokens"):  # 3 tokens: not 2 stages x D ranks
        model(torch.zeros(3, dtype=torch.long))
