"""The transformer block's pieces that need no communicator: head sharding of fused
weights, rotary embedding, grouped-query attention, shape refusals, adoption checks, and
the row splits that refuse sizes that do not divide (no token dropped)."""

import math

import pytest
import torch

from hostir.errors import HostIrError, InputMismatchError, LoweringError
from hostir.nn.llama import LlamaBlock, block_config, check_weights, parallelize
from hostir.nn.transformer import (apply_rotary, causal_attention, check_block_shape,
                                   rotary_tables, shard_fused, unshard_fused)
from lowering.patterns import check_row_split, shard_columns, shard_rows, stage_rows


def test_qkv_shards_hold_whole_heads_of_q_then_k_then_v():
    heads, kv_heads, d, hidden, world = 8, 4, 2, 16, 2
    # Every row labelled by its projection (0 q, 1 k, 2 v) and head.
    q = torch.tensor([[0, h] for h in range(heads) for _ in range(d)])
    k = torch.tensor([[1, h] for h in range(kv_heads) for _ in range(d)])
    v = torch.tensor([[2, h] for h in range(kv_heads) for _ in range(d)])
    shard = shard_fused((q, k, v), 1, world)
    labels = [tuple(r) for r in shard.tolist()[::d]]
    assert labels == [(0, 4), (0, 5), (0, 6), (0, 7), (1, 2), (1, 3), (2, 2), (2, 3)]
    # Query heads 4..7 of rank 1 attend with kv heads 2, 3: head // (heads / kv_heads).
    assert {h // (heads // kv_heads) for _, h in labels[:4]} == {2, 3}
    fused = torch.cat([q, k, v])
    assert not torch.equal(shard, fused.chunk(world)[1])  # not a contiguous slice


def test_gate_up_shards_take_each_half():
    gate, up = torch.arange(8), torch.arange(100, 108)
    assert shard_fused((gate, up), 0, 4).tolist() == [0, 1, 100, 101]
    assert shard_fused((gate, up), 3, 4).tolist() == [6, 7, 106, 107]


@pytest.mark.parametrize("world", [1, 2, 4])
def test_unshard_inverts_shard(world):
    parts = (torch.randn(16, 3), torch.randn(8, 3), torch.randn(8, 3))
    shards = [shard_fused(parts, r, world) for r in range(world)]
    for got, want in zip(unshard_fused(shards, [p.shape[0] for p in parts]), parts):
        assert torch.equal(got, want)


def test_rotary_rotates_pairs_by_position_angles():
    d, theta = 4, 100.0
    cos, sin = rotary_tables(3, d, theta, "cpu", torch.float64)
    t = torch.zeros(3, 1, d, dtype=torch.float64)
    t[:, 0, 0] = 1.0  # the first pair's first element
    out = apply_rotary(t, cos, sin)
    for pos in range(3):  # rotate-half pairs element i with i + d/2, frequency theta^0 = 1
        assert out[pos, 0, 0].item() == pytest.approx(math.cos(pos))
        assert out[pos, 0, d // 2].item() == pytest.approx(math.sin(pos))
    x = torch.randn(3, 2, d, dtype=torch.float64)
    assert torch.allclose(apply_rotary(x, cos, sin).norm(dim=-1), x.norm(dim=-1))


def test_grouped_query_attention_matches_the_naive_softmax():
    g = torch.Generator().manual_seed(0)
    s, heads, kv_heads, d = 5, 4, 2, 3
    q = torch.randn(1, s, heads, d, generator=g, dtype=torch.float64)
    k = torch.randn(1, s, kv_heads, d, generator=g, dtype=torch.float64)
    v = torch.randn(1, s, kv_heads, d, generator=g, dtype=torch.float64)
    out = causal_attention(q, k, v).view(s, heads, d)
    for h in range(heads):
        kv = h // (heads // kv_heads)
        scores = q[0, :, h] @ k[0, :, kv].t() / math.sqrt(d)
        scores = scores.masked_fill(torch.triu(torch.ones(s, s, dtype=torch.bool), 1), -math.inf)
        want = torch.softmax(scores, -1) @ v[0, :, kv]
        torch.testing.assert_close(out[:, h], want)


@pytest.mark.parametrize("args,message", [
    ((256, 8, 3, 512, 2), "heads=8 is not a multiple of kv_heads=3"),
    ((256, 8, 2, 512, 4), "kv_heads=2 over 4 ranks; expected a multiple of the world size"),
    ((250, 8, 2, 512, 2), "hidden=250 is not a multiple of heads=8"),
    ((256, 8, 2, 511, 2), "ffn=511 over 2 ranks"),
    ((24, 8, 8, 64, 1), "head_dim=3 is odd"),
    ((256, 0, 2, 512, 2), "heads=0; expected a positive int"),
])
def test_block_shapes_that_do_not_shard_are_refused(args, message):
    with pytest.raises(LoweringError, match=message):
        check_block_shape(*args)


def test_block_config_reads_llama_and_gpt2_blocks():
    c = block_config(LlamaBlock(64, 4, 2, 96))
    assert c == dict(hidden=64, heads=4, kv_heads=2, ffn=96, style="llama", eps=1e-6,
                     rope_theta=10000.0)
    assert block_config(LlamaBlock(64, 4, style="gpt2"))["style"] == "gpt2"


def test_adoption_refuses_mismatched_blocks_before_any_communicator():
    block = LlamaBlock(64, 4, 2, 96)
    block.self_attn.k_proj = torch.nn.Linear(64, 48, bias=False)  # 3 kv heads of 16, not 2
    with pytest.raises(InputMismatchError,
                       match=r"self_attn.k_proj.weight: expected shape \[32, 64\].*got \[48, 64\]"):
        parallelize(block, comm="mpi")
    mixed = LlamaBlock(64, 4, 2, 96)
    mixed.self_attn.q_proj = torch.nn.Linear(64, 64, bias=True)  # RMSNorm, gate, a bias
    with pytest.raises(InputMismatchError, match="expected Llama .* or GPT-2 style"):
        block_config(mixed)
    gpt2 = LlamaBlock(64, 4, style="gpt2").state_dict()
    del gpt2["mlp.up_proj.bias"]
    with pytest.raises(InputMismatchError, match=r"weight mlp.up_proj.bias is missing; expected shape \[256\]"):
        check_weights(gpt2, block_config(LlamaBlock(64, 4, style="gpt2")))
    with pytest.raises(HostIrError, match="number of heads is unknown"):
        block_config(_headless())


def _headless():
    block = LlamaBlock(64, 4, 2, 96)
    del block.self_attn.num_heads
    return block


@pytest.mark.parametrize("rows,stages,world", [(7, 1, 2), (12, 2, 4), (10, 4, 1)])
def test_row_splits_refuse_sizes_that_do_not_divide(rows, stages, world):
    """Flooring the shard size would drop rows silently (a --tokens 7 run on 2 ranks used
    to train on 4 of 7 tokens)."""
    expected = stages * world
    with pytest.raises(LoweringError, match=rf"tensor rows axis 0: extent {rows} does not split .* expected a "
                                            rf"multiple of {expected}, got {rows}"):
        stage_rows(stages, rows, world, 0)
    with pytest.raises(LoweringError, match="tensor A axis 0"):
        shard_rows(torch.zeros(rows, 2), stages, world, 0)
    with pytest.raises(LoweringError, match="tensor x axis 0"):
        from hostir.nn import shard_sequence

        shard_sequence(torch.zeros(rows, 2), stages, world, 0)


def test_column_splits_refuse_sizes_that_do_not_divide():
    with pytest.raises(LoweringError, match="tensor A axis 1: extent 5 does not split over 1 stage"):
        shard_columns(torch.zeros(2, 5), 2, 0)
    check_row_split("x", 8, 2, 2)  # divides: no error
    assert sorted(torch.cat([stage_rows(2, 8, 2, r) for r in range(2)]).tolist()) == list(range(8))


def test_capture_blocks_off_cuda_returns_the_blocks_and_refuses_none():
    from hostir.errors import LoweringError
    from hostir.nn import capture_blocks

    blocks = [torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)]
    model = capture_blocks(torch.nn.Sequential(*blocks), torch.randn(3, 4))
    assert isinstance(model, torch.nn.Sequential) and list(model) == blocks
    with pytest.raises(LoweringError, match="no blocks"):
        capture_blocks([], torch.randn(3, 4))


def test_a_block_remembers_its_plans_and_a_copy_or_a_save_starts_without_them():
    import copy
    import io

    from hostir.nn import LlamaBlock, _plan, parallelize

    from hostir.nn import linear

    block = parallelize(LlamaBlock(32, heads=4, kv_heads=2, ffn=64))
    x = torch.randn(8, 32, requires_grad=True)
    block(x).sum().backward()
    memo = block.qkv_proj._plan_memo
    assert len(memo) == 1 and len(block._reduce._runtimes) == 1
    layer = block.qkv_proj
    n = layer._inputs(x.detach())[0]
    plan = next(iter(memo.values()))
    with pytest.MonkeyPatch.context() as mp:  # a steady call makes no plan
        mp.setattr(linear, "_new_plan", lambda *a: pytest.fail("the memo was bypassed"))
        assert _plan("column", layer, n) is plan
    # new rows, or a setting changed after the first call: a plan of their own
    assert _plan("column", layer, n[:4]) is not plan and len(memo) == 2
    layer.stages = 2
    assert _plan("column", layer, n) is not plan and len(memo) == 3
    assert _plan("column", layer, n).S == 2
    layer.stages = 1
    twin = copy.deepcopy(block)
    buf = io.BytesIO()
    torch.save(block, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    for other in (twin, loaded):
        assert len(other.qkv_proj._plan_memo) == 0 and len(other._reduce._runtimes) == 0
        assert torch.equal(other(x), block(x))
        assert len(other.qkv_proj._plan_memo) == 1
    del block._reduce.__dict__["_runtimes"]  # as pickled before the runtimes were kept
    block(x).sum().backward()  # the norms' weight gradients: summed over the group
    assert len(block._reduce._runtimes) == 1
