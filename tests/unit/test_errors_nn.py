"""What a careless user of ``hostir.nn`` gets: a ``HostIrError`` naming the argument,
weight or input and saying what was expected and what was found, raised before any
collective (never a bare TypeError/AttributeError/ZeroDivisionError from deep inside,
never a block that silently computes something else). One process (world size 1)."""

import copy

import pytest
import torch

from hostir.errors import HostIrError, InputMismatchError, LoweringError
from hostir.nn import (ColumnParallelLinear, ParallelMLP, ParallelTransformerBlock,
                       RowParallelLinear, capture_blocks, fused_mlp, parallelize,
                       parallelize_model, sequence_rows, shard_sequence)
from hostir.nn.llama import llama_state_dict, load_llama_state_dict, shard_state_dict
from tests.numerics import reference_block

H, HEADS, KV, F = 32, 4, 2, 64


def _ref(style="llama", seed=0):
    return reference_block(H, HEADS, KV, F, style, seed)


def _raises(kind, match, fn, *args, **kw):
    with pytest.raises(kind, match=match) as info:
        fn(*args, **kw)
    assert isinstance(info.value, HostIrError)


# ----------------------------------------------------------------------------- settings


@pytest.mark.parametrize("make,message", [
    (lambda: ColumnParallelLinear(0, 8), r"ColumnParallelLinear: in_features=0; expected a positive int"),
    (lambda: ColumnParallelLinear(8, -8), r"ColumnParallelLinear: out_features=-8; expected a positive int"),
    (lambda: RowParallelLinear(8.0, 8), r"RowParallelLinear: in_features=8.0; expected a positive int"),
    (lambda: ColumnParallelLinear(8, 8, stages=0), r"ColumnParallelLinear: stages=0; expected a positive int"),
    (lambda: RowParallelLinear(8, 8, stages="2"), r"RowParallelLinear: stages='2'; expected a positive int"),
    (lambda: ColumnParallelLinear(8, 8, streams=0), r"streams=0; expected a positive int"),
    (lambda: ColumnParallelLinear(8, 8, dtype=torch.int32),
     r"ColumnParallelLinear: dtype=torch.int32; expected a floating-point dtype"),
    (lambda: ParallelMLP(8, 16, stages=-1), r"stages=-1; expected a positive int"),
    (lambda: ParallelTransformerBlock(H, HEADS, KV, F, stages=0),
     r"transformer block: stages=0; expected a positive int"),
    (lambda: ParallelTransformerBlock(H, HEADS, KV, F, streams=1.5),
     r"transformer block: streams=1.5; expected a positive int"),
    (lambda: ParallelTransformerBlock(H, HEADS, KV, F, dtype=torch.int64),
     r"transformer block: dtype=torch.int64; expected a floating-point dtype"),
    (lambda: ParallelTransformerBlock(H, HEADS, KV, F, eps="x"),
     r"norm eps='x': expected a finite number >= 0"),
])
def test_bad_settings_are_refused_when_built(make, message):
    """They used to surface at the first forward as ZeroDivisionError / TypeError, or at
    construction as torch's RuntimeError (negative dimension, integer Parameter)."""
    _raises(LoweringError, message, make)


def test_a_communicator_that_cannot_run_here_is_named():
    import torch.distributed as dist

    x = torch.randn(4, 8)
    for comm in ("nccl", "copy_engine"):  # CUDA only: not "needs the NCCL library"
        _raises(LoweringError, rf"comm='{comm}': expected a CUDA device, got cpu",
                ColumnParallelLinear(8, 8, comm=comm), x)
    if dist.is_available() and dist.is_initialized():
        pytest.skip("a torch.distributed group is up in this process")
    _raises(LoweringError, r"comm='torch': expected an initialized torch.distributed group",
            ColumnParallelLinear, 8, 8, comm="torch")


# ----------------------------------------------------------------------------- inputs


@pytest.mark.parametrize("x,message", [
    ([[0.0] * 8] * 4, r"expected a torch.Tensor \[tokens, 8\], got list"),
    (torch.ones(4, 8, dtype=torch.int64), r"expected dtype torch.float32 .*got torch.int64"),
    (torch.ones(4, 8, dtype=torch.bool), r"expected dtype torch.float32 .*got torch.bool"),
    (torch.randn(4, 8, dtype=torch.float64), r"expected dtype torch.float32 .*got torch.float64"),
    (torch.randn(4, 8, device="meta"), r"expected an input on cpu .*got meta"),
    (torch.randn(0, 8), r"expected at least one token, got \[0, 8\]"),
])
@pytest.mark.parametrize("layer", ["column", "row"])
def test_layer_inputs_are_checked(layer, x, message):
    lin = ColumnParallelLinear(8, 8) if layer == "column" else RowParallelLinear(8, 8, stages=1)
    name = type(lin).__name__
    _raises(LoweringError, f"{name}: {message}", lin, x)


def test_autocast_still_takes_inputs_of_another_dtype():
    lin = ColumnParallelLinear(8, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert lin(torch.randn(4, 8)).dtype == torch.bfloat16


@pytest.mark.parametrize("x,message", [
    ([[0.0] * H] * 4, r"expected a torch.Tensor \[tokens / ranks, 32\], got list"),
    (torch.randn(4, H).numpy(), r"expected a torch.Tensor \[tokens / ranks, 32\], got ndarray"),
    (torch.ones(4, H, dtype=torch.int64), r"expected dtype torch.float32 .*got torch.int64"),
    (torch.randn(4, H, dtype=torch.float64), r"expected dtype torch.float32 .*got torch.float64"),
    (torch.randn(4, H, dtype=torch.bfloat16), r"expected dtype torch.float32 .*got torch.bfloat16"),
    (torch.randn(4, H, device="meta"), r"expected an input on cpu .*got meta"),
    (torch.randn(0, H), r"expected at least one token, got \[0, 32\]"),
])
def test_block_inputs_are_checked(x, message):
    """A float64 input used to come out float64 from float32 GEMMs; an int64 one ran."""
    block = parallelize(_ref())
    _raises(LoweringError, f"ParallelTransformerBlock: {message}", block, x)


# ----------------------------------------------------------------------------- linears


def test_from_linear_refuses_what_it_cannot_shard():
    _raises(LoweringError, r"ColumnParallelLinear.from_linear: expected a torch.nn.Linear, got Conv1d",
            ColumnParallelLinear.from_linear, torch.nn.Conv1d(3, 4, 1))
    _raises(LoweringError, r"RowParallelLinear.from_linear: expected a torch.nn.Linear, got NoneType",
            RowParallelLinear.from_linear, None)
    up = torch.nn.Linear(8, 16, bias=False)
    # down's 18 input features used to be cut to up's 16 without a word
    _raises(LoweringError, r"ParallelMLP.from_linears: down has 18 in_features and 8 "
            r"out_features; expected 16 \(up's out_features\) and 8 \(up's in_features\)",
            ParallelMLP.from_linears, up, torch.nn.Linear(18, 8, bias=False))
    _raises(LoweringError, r"down has 16 in_features and 12 out_features; expected 16 .* and 8",
            ParallelMLP.from_linears, up, torch.nn.Linear(16, 12, bias=False))


def test_fused_mlp_refuses_layers_it_would_run_wrongly():
    x = torch.randn(4, 8)
    up, down = ColumnParallelLinear(8, 16, bias=True), RowParallelLinear(16, 8)
    with torch.no_grad():
        up.bias.fill_(3.0)
    # the up projection's bias used to be dropped
    _raises(LoweringError, r"fused_mlp: up has a bias; expected none", fused_mlp, x, up, down)
    up, down = ColumnParallelLinear(8, 16, stages=1), RowParallelLinear(16, 8, stages=2)
    _raises(LoweringError, r"fused_mlp: up has stages=1, down stages=2; expected the same",
            fused_mlp, x, up, down)
    col, row = ColumnParallelLinear(8, 8), RowParallelLinear(8, 8)
    _raises(LoweringError, r"fused_mlp: expected up a ColumnParallelLinear and down a "
            r"RowParallelLinear, got RowParallelLinear and ColumnParallelLinear",
            fused_mlp, x, row, col)
    _raises(LoweringError, r"got Linear and Linear", fused_mlp, x, torch.nn.Linear(8, 8),
            torch.nn.Linear(8, 8))


@pytest.mark.parametrize("call,message", [
    (lambda: shard_sequence(torch.randn(8, 2), 2, 2, 3), r"rank=3; expected 0 <= rank < 2"),
    (lambda: shard_sequence(torch.randn(8, 2), 2, 2, -1), r"rank=-1; expected 0 <= rank < 2"),
    (lambda: sequence_rows(8, 2, 2, 5), r"rank=5; expected 0 <= rank < 2"),
    (lambda: shard_sequence(torch.tensor(1.0), 1, 1, 0),
     r"shard_sequence: expected a torch.Tensor \[tokens, ...\], got a 0-d tensor"),
    (lambda: shard_sequence([1, 2], 1, 1, 0),
     r"shard_sequence: expected a torch.Tensor \[tokens, ...\], got list"),
])
def test_sequence_sharding_refuses_ranks_outside_the_world(call, message):
    """A negative rank used to return another rank's rows; one past the end an IndexError."""
    _raises(LoweringError, message, call)


def test_capture_blocks_refuses_what_is_not_a_list_of_blocks():
    block = torch.nn.Linear(4, 4)
    _raises(LoweringError, r"capture_blocks: expected a torch.nn.Sequential or a list of "
            r"blocks, got Linear", capture_blocks, block, torch.randn(3, 4))
    _raises(LoweringError, r"got NoneType", capture_blocks, None, torch.randn(3, 4))
    _raises(LoweringError, r"capture_blocks: expected example a torch.Tensor, got NoneType",
            capture_blocks, [block], None)


# ----------------------------------------------------------------------------- adoption


def _with_bias(linear, value=0.5):
    out = torch.nn.Linear(linear.in_features, linear.out_features, bias=True)
    with torch.no_grad():
        out.weight.copy_(linear.weight)
        out.bias.fill_(value)
    return out


def test_a_bias_where_llama_has_none_is_refused():
    """An o_proj or down_proj bias was dropped: the block computed something else."""
    for path in ("self_attn.o_proj", "mlp.down_proj"):
        block = _ref()
        parent, _, name = path.rpartition(".")
        owner = block.get_submodule(parent)
        setattr(owner, name, _with_bias(getattr(owner, name)))
        _raises(InputMismatchError, rf"parallelize: unexpected weight {path}.bias "
                r"\(llama style\); expected none", parallelize, block)


def test_norms_of_two_kinds_are_refused():
    block = _ref()
    block.post_attention_layernorm = torch.nn.LayerNorm(H, bias=False)
    _raises(InputMismatchError, r"parallelize: input_layernorm is a RMSNorm and "
            r"post_attention_layernorm a LayerNorm; expected both RMSNorm \(llama\) or both "
            r"LayerNorm \(gpt2\)", parallelize, block)


def test_a_norm_without_weight_is_refused():
    block = _ref()
    block.input_layernorm = torch.nn.RMSNorm(H, elementwise_affine=False)
    _raises(InputMismatchError, r"parallelize: input_layernorm has no weight; expected a norm "
            r"with a weight tensor", parallelize, block)


def test_heads_that_contradict_the_module_are_refused():
    """heads=8, kv_heads=4 fit the same weight shapes as the module's 4 and 2: the block
    used to split the heads differently from the module it copies."""
    _raises(InputMismatchError, r"parallelize: heads=8, but self_attn.num_heads=4; expected "
            r"them to agree", parallelize, _ref(), heads=8, kv_heads=4)
    block = _ref()
    del block.self_attn.num_key_value_heads
    block.self_attn.config = type("Config", (), {"num_key_value_heads": KV})()
    _raises(InputMismatchError, r"kv_heads=1, but self_attn.config.num_key_value_heads=2",
            parallelize, block, kv_heads=1)
    _raises(InputMismatchError, r"heads=0, but self_attn.num_heads=4",  # it used to fall
            parallelize, _ref(), heads=0)                                  # back to 4
    headless = _ref()
    del headless.self_attn.num_heads
    _raises(LoweringError, r"transformer block: heads=-2; expected a positive int",
            parallelize, headless, heads=-2)  # not "expected shape [-16, 32]"
    assert parallelize(_ref(), heads=HEADS, kv_heads=KV).heads == HEADS  # agreeing: fine


def test_weights_of_another_dtype_or_device_are_refused():
    """bf16 linears beside fp32 norms became an all-fp32 block without a word."""
    block = _ref()
    block.mlp.to(torch.bfloat16)
    _raises(InputMismatchError, r"parallelize: weight mlp.up_proj.weight: expected dtype "
            r"torch.float32 on cpu \(input_layernorm's\), got torch.bfloat16 on cpu",
            parallelize, block)
    block = _ref()
    block.self_attn.to("meta")
    _raises(InputMismatchError, r"weight self_attn.q_proj.weight: expected dtype torch.float32 "
            r"on cpu .*got torch.float32 on meta", parallelize, block)


# ----------------------------------------------------------------------------- state dicts


def _state(change):
    state = _ref().state_dict()
    change(state)
    return state


@pytest.mark.parametrize("change,message", [
    (lambda s: s.__setitem__("self_attn.o_proj.bias", torch.ones(H)),
     r"unexpected weight self_attn.o_proj.bias \(llama style\); expected none"),
    (lambda s: s.__setitem__("mlp.down_proj.weight", torch.ones(H, F, dtype=torch.int64)),
     r"weight mlp.down_proj.weight: expected a floating-point tensor, got torch.int64"),
    (lambda s: s.__setitem__("input_layernorm.weight", [1.0] * H),
     r"weight input_layernorm.weight: expected a torch.Tensor, got list"),
    (lambda s: s.__setitem__("input_layernorm.weight", torch.ones(H).numpy()),
     r"weight input_layernorm.weight: expected a torch.Tensor, got ndarray"),
])
def test_state_dicts_that_do_not_match_are_refused(change, message):
    block = parallelize(_ref())
    _raises(InputMismatchError, message, load_llama_state_dict, block, _state(change))


def test_state_dict_helpers_refuse_what_is_not_a_parallel_block_or_a_mapping():
    block = parallelize(_ref())
    _raises(InputMismatchError, r"load_llama_state_dict: expected a ParallelTransformerBlock, "
            r"got LlamaBlock", load_llama_state_dict, _ref(), _ref().state_dict())
    _raises(InputMismatchError, r"llama_state_dict: expected a ParallelTransformerBlock, got "
            r"LlamaBlock", llama_state_dict, _ref())
    _raises(InputMismatchError, r"expected a mapping of weight names to tensors, got NoneType",
            load_llama_state_dict, block, None)
    state = _ref().state_dict()
    del state["self_attn.k_proj.weight"]
    _raises(InputMismatchError, r"weight self_attn.k_proj.weight is missing", shard_state_dict,
            state, block)


def test_a_float64_checkpoint_loads_into_a_float32_block_as_torch_loads_it():
    ref = _ref()
    block = parallelize(copy.deepcopy(ref))
    load_llama_state_dict(block, {k: v.double() for k, v in ref.state_dict().items()})
    assert block.qkv_proj.weight.dtype == torch.float32


# ----------------------------------------------------------------------------- models


class _LM(torch.nn.Module):
    def __init__(self, blocks):
        super().__init__()
        self.layers = torch.nn.ModuleList(blocks)


def test_parallelize_model_refuses_before_touching_the_model():
    _raises(InputMismatchError, r"parallelize_model: expected a torch.nn.Module, got NoneType",
            parallelize_model, None)
    broken = _ref()
    del broken.self_attn.q_proj
    model = _LM([_ref(), broken])
    _raises(InputMismatchError, r"LlamaBlock has no self_attn.q_proj", parallelize_model, model)
    assert [type(b).__name__ for b in model.layers] == ["LlamaBlock", "LlamaBlock"]


# ------------------------------------------------------------------- weights across ranks


def test_weight_fingerprints_tell_other_values_and_orders_apart():
    from hostir.nn.linear import _fingerprint, _same_fingerprint

    g = torch.Generator().manual_seed(0)
    w = torch.randn(300, 70, generator=g)
    same = _fingerprint(w)
    assert _same_fingerprint(same, _fingerprint(w.clone()))
    assert _same_fingerprint(same, _fingerprint(w.double().float()))
    # a chunk boundary inside the tensor (4M values a chunk): the sums are the whole
    # tensor's, and two values swapped across the boundary tell apart
    big = torch.randn(5_000_000, generator=g)
    x = big.double()
    pos = torch.frac(torch.arange(x.numel(), dtype=torch.float64) * 0.6180339887498949)
    got = _fingerprint(big)
    assert got[:2] == ((5_000_000,), "torch.float32") and got[5] == 0
    for a, b in zip(got[2:5], (x.sum(), (x * pos).sum(), x.abs().sum())):
        assert abs(a - b.item()) <= 1e-9 * got[4]
    swapped = big.clone()
    swapped[[4_194_303, 4_194_304]] = big[[4_194_304, 4_194_303]]
    assert not _same_fingerprint(got, _fingerprint(swapped))
    # the same non-finite values alike; other shapes or dtypes of the same values apart
    odd = w.clone()
    odd[0, 0], odd[1, 1] = float("inf"), float("nan")
    assert _same_fingerprint(_fingerprint(odd), _fingerprint(odd.clone()))
    assert not _same_fingerprint(_fingerprint(odd), _fingerprint(w))
    assert not _same_fingerprint(same, _fingerprint(w.view(70, 300)))
    assert not _same_fingerprint(same, _fingerprint(w.double()))
    for other in (w.flip(0), w.t().contiguous().view(300, 70), w + 1e-3,
                  torch.randn(300, 70, generator=g)):
        assert not _same_fingerprint(same, _fingerprint(other))
    assert _same_fingerprint(None, None) and not _same_fingerprint(same, None)


def test_weight_agreement_exchanges_nothing_on_one_rank_or_when_disabled(monkeypatch):
    import dataclasses

    from hostir.nn import linear
    from hostir.options import options, set_options

    def no_exchange(*a, **k):
        raise AssertionError("no exchange expected")

    def check():
        return "built", {"w": torch.ones(2)}

    monkeypatch.setattr(linear, "_fingerprint", no_exchange)
    assert linear.agree_on_weights("parallelize", check, None, "mpi") == "built"  # world 1
    monkeypatch.setattr(linear, "_world", lambda group, comm: (0, 2))
    saved = options()
    try:
        set_options(dataclasses.replace(saved, disabled=saved.disabled | {"weight_agreement"}))
        assert linear.agree_on_weights("parallelize", check, None, "mpi") == "built"
    finally:
        set_options(saved)
    with pytest.raises(AssertionError, match="no exchange expected"):
        linear.agree_on_weights("parallelize", check, None, "mpi")
