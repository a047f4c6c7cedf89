"""Adoption: an unsharded Llama-style torch block becomes a ``ParallelTransformerBlock``
with the same weights, so a model's definition, its checkpoints and ``torch.optim.AdamW``
keep working.

    >>> import torch.distributed as dist                                   # doctest: +SKIP
    >>> dist.init_process_group("nccl")              # torchrun, or mpirun  # doctest: +SKIP
    >>> ref = LlamaBlock(4096, heads=32, kv_heads=8, ffn=14336)            # doctest: +SKIP
    >>> block = parallelize(ref, stages=1)           # this rank's shards  # doctest: +SKIP
    >>> opt = torch.optim.AdamW(block.parameters())                        # doctest: +SKIP
    >>> y = block(shard_sequence(x, 1, world, rank))                       # doctest: +SKIP

The naming convention ``parallelize`` reads (Hugging Face's ``LlamaDecoderLayer``):
``input_layernorm``, ``self_attn.q_proj``, ``self_attn.k_proj``, ``self_attn.v_proj``,
``self_attn.o_proj``, ``post_attention_layernorm``, ``mlp.gate_proj``, ``mlp.up_proj``,
``mlp.down_proj``, each an ``nn.Linear`` (no biases) or norm (``nn.RMSNorm`` or any module
with a ``weight`` and ``eps`` / ``variance_epsilon``). A GPT-2-style block uses the same
names with ``nn.LayerNorm``, biases on every linear, and no ``mlp.gate_proj`` (tanh GELU
MLP). Heads come from the arguments, else ``self_attn.num_heads`` /
``num_key_value_heads``, else ``self_attn.config`` (Hugging Face). The module must hold the
same values on every rank (the same seed, or a loaded checkpoint).

Checkpoints: ``llama_state_dict(block)`` gathers the full weights under these names (a
collective: every rank calls it); ``load_llama_state_dict(block, state_dict)`` loads them.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F

from hostir.errors import InputMismatchError, LoweringError
from hostir.nn.linear import _resolve, _runtime, _world, agree_on_weights
from hostir.nn.transformer import (ParallelTransformerBlock, apply_rotary, causal_attention,
                                   check_block_shape, rotary_tables, shard_fused,
                                   unshard_fused)

__all__ = ["LlamaBlock", "parallelize", "parallelize_model", "llama_state_dict",
           "load_llama_state_dict", "block_config", "torch_parallelize"]


# ----------------------------------------------------------------------------- reference


class _Attention(torch.nn.Module):
    def __init__(self, hidden, heads, kv_heads, bias, rope_theta, rotary, **kw):
        super().__init__()
        d = hidden // heads
        self.num_heads, self.num_key_value_heads, self.head_dim = heads, kv_heads, d
        self.rope_theta, self.rotary = rope_theta, rotary
        self.q_proj = torch.nn.Linear(hidden, heads * d, bias=bias, **kw)
        self.k_proj = torch.nn.Linear(hidden, kv_heads * d, bias=bias, **kw)
        self.v_proj = torch.nn.Linear(hidden, kv_heads * d, bias=bias, **kw)
        self.o_proj = torch.nn.Linear(heads * d, hidden, bias=bias, **kw)

    def forward(self, x):  # [..., S, hidden]; under torch TP the projections give our heads
        d = self.head_dim
        q, k, v = (p(x).unflatten(-1, (-1, d)) for p in (self.q_proj, self.k_proj, self.v_proj))
        if self.rotary:
            cos, sin = rotary_tables(q.shape[-3], d, self.rope_theta, q.device, q.dtype)
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        return self.o_proj(causal_attention(q, k, v))


class _MLP(torch.nn.Module):
    def __init__(self, hidden, ffn, gated, bias, **kw):
        super().__init__()
        if gated:
            self.gate_proj = torch.nn.Linear(hidden, ffn, bias=bias, **kw)
        self.up_proj = torch.nn.Linear(hidden, ffn, bias=bias, **kw)
        self.down_proj = torch.nn.Linear(ffn, hidden, bias=bias, **kw)

    def forward(self, x):
        if hasattr(self, "gate_proj"):
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        return self.down_proj(F.gelu(self.up_proj(x), approximate="tanh"))


class LlamaBlock(torch.nn.Module):
    """A plain, unsharded transformer block in Hugging Face Llama's naming: the reference
    that ``parallelize`` shards and the tests and job compare against. ``style="gpt2"``:
    LayerNorm, biases, tanh GELU MLP, no rotary. Input ``[..., S, hidden]`` (one causal
    sequence per leading index).

    >>> block = LlamaBlock(64, heads=4, kv_heads=2, ffn=128)
    >>> block(torch.randn(1, 16, 64)).shape
    torch.Size([1, 16, 64])
    """

    def __init__(self, hidden: int, heads: int, kv_heads: int | None = None,
                 ffn: int | None = None, *, style: str = "llama", eps: float | None = None,
                 rope_theta: float = 10000.0, device=None, dtype=None):
        super().__init__()
        llama = style == "llama"
        kv_heads = heads if kv_heads is None else kv_heads
        ffn = 4 * hidden if ffn is None else ffn
        eps = (1e-6 if llama else 1e-5) if eps is None else eps
        kw = dict(device=device, dtype=dtype)
        norm = (lambda: torch.nn.RMSNorm(hidden, eps=eps, **kw)) if llama else \
            (lambda: torch.nn.LayerNorm(hidden, eps=eps, **kw))
        self.input_layernorm = norm()
        self.self_attn = _Attention(hidden, heads, kv_heads, not llama, rope_theta, llama, **kw)
        self.post_attention_layernorm = norm()
        self.mlp = _MLP(hidden, ffn, llama, not llama, **kw)

    def forward(self, x):
        h = x + self.self_attn(self.input_layernorm(x))
        return h + self.mlp(self.post_attention_layernorm(h))


# ----------------------------------------------------------------------------- adoption

LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
NORMS = ("input_layernorm", "post_attention_layernorm")


def _get(module, path: str):
    for name in path.split("."):
        module = getattr(module, name, None)
    return module


def _declared(attn, attr: str, config_attr: str):
    """``(where, value)`` of what the module says: ``self_attn.<attr>``, else its config's
    ``<config_attr>``; ``(None, None)`` where neither says."""
    for where, owner, name in (("self_attn", attn, attr),
                               ("self_attn.config", getattr(attn, "config", None), config_attr)):
        value = getattr(owner, name, None)
        if value:
            return f"{where}.{name}", value
    return None, None


def _heads(attn, heads, kv_heads):
    """The arguments where given, else what the module says; an argument the module
    contradicts is refused (the weights' shapes cannot tell 8 heads of 8 from 4 of 16)."""
    resolved = []
    for arg, value, attr, config_attr in (("heads", heads, "num_heads", "num_attention_heads"),
                                          ("kv_heads", kv_heads, "num_key_value_heads",
                                           "num_key_value_heads")):
        where, declared = _declared(attn, attr, config_attr)
        if value is not None and declared is not None and value != declared:
            raise InputMismatchError(f"parallelize: {arg}={value!r}, but {where}={declared!r}; "
                                     f"expected them to agree (or leave {arg}= out)")
        resolved.append(value if value is not None else declared)
    heads, kv_heads = resolved
    if heads is None:
        raise LoweringError("parallelize: the number of heads is unknown: pass heads= (and "
                            "kv_heads=), or set self_attn.num_heads")
    return heads, (heads if kv_heads is None else kv_heads)


def block_config(module, heads=None, kv_heads=None, rope_theta=None) -> dict:
    """The ``ParallelTransformerBlock`` arguments of an unsharded block, read from its
    modules and checked (InputMismatchError / LoweringError; no collective)."""
    for path in NORMS + ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                         "self_attn.o_proj", "mlp.up_proj", "mlp.down_proj"):
        if _get(module, path) is None:
            raise InputMismatchError(f"parallelize: {type(module).__name__} has no {path}; "
                                     f"expected Llama's naming ({', '.join(NORMS + LINEARS)})")
    norm = module.input_layernorm
    if not isinstance(getattr(norm, "weight", None), torch.Tensor):
        raise InputMismatchError(f"parallelize: input_layernorm has no weight; expected a norm "
                                 f"with a weight tensor, got {type(norm).__name__}")
    post = module.post_attention_layernorm
    if isinstance(norm, torch.nn.LayerNorm) != isinstance(post, torch.nn.LayerNorm):
        raise InputMismatchError(f"parallelize: input_layernorm is a {type(norm).__name__} and "
                                 f"post_attention_layernorm a {type(post).__name__}; expected "
                                 "both RMSNorm (llama) or both LayerNorm (gpt2)")
    style = "gpt2" if isinstance(norm, torch.nn.LayerNorm) else "llama"
    gated = _get(module, "mlp.gate_proj") is not None
    biased = _get(module, "self_attn.q_proj").bias is not None
    if (style == "llama") != gated or (style == "llama") == biased:
        raise InputMismatchError(
            f"parallelize: {type(norm).__name__}, {'a' if gated else 'no'} gate_proj, "
            f"{'' if biased else 'no '}biases: expected Llama (RMSNorm, gate_proj, no biases) "
            f"or GPT-2 style (LayerNorm, no gate_proj, biases)")
    attn = module.self_attn
    heads, kv_heads = _heads(attn, heads, kv_heads)
    hidden = norm.weight.shape[0]
    check_block_shape(hidden, heads, kv_heads, module.mlp.up_proj.weight.shape[0], 1)
    eps = getattr(norm, "eps", None) or getattr(norm, "variance_epsilon", None)
    config = getattr(attn, "config", None)
    theta = (rope_theta or getattr(attn, "rope_theta", None)
             or getattr(config, "rope_theta", None) or 10000.0)
    return dict(hidden=hidden, heads=heads, kv_heads=kv_heads,
                ffn=module.mlp.up_proj.weight.shape[0], style=style,
                eps=eps if eps is not None else torch.finfo(norm.weight.dtype).eps,
                rope_theta=float(theta))


def _expected_shapes(c: dict) -> dict:
    h, d = c["hidden"], c["hidden"] // c["heads"]
    q, kv, f = c["heads"] * d, c["kv_heads"] * d, c["ffn"]
    shapes = {"self_attn.q_proj": (q, h), "self_attn.k_proj": (kv, h),
              "self_attn.v_proj": (kv, h), "self_attn.o_proj": (h, q),
              "mlp.up_proj": (f, h), "mlp.down_proj": (h, f)}
    if c["style"] == "llama":
        shapes["mlp.gate_proj"] = (f, h)
    out = {f"{k}.weight": v for k, v in shapes.items()}
    out.update({f"{n}.weight": (h,) for n in NORMS})
    if c["style"] == "gpt2":
        out.update({f"{k}.bias": (v[0],) for k, v in shapes.items()})
        out.update({f"{n}.bias": (h,) for n in NORMS})
    return out


def check_weights(state: dict, config: dict) -> None:
    """InputMismatchError naming the first weight that is missing, not a floating-point
    tensor or of the wrong shape, or that the style has no place for (a bias on a Llama
    linear would be dropped)."""
    if not isinstance(state, Mapping):
        raise InputMismatchError(f"parallelize: expected a mapping of weight names to tensors, "
                                 f"got {type(state).__name__}")
    expected = _expected_shapes(config)
    for name in (f"{m}.{p}" for m in LINEARS + NORMS for p in ("weight", "bias")):
        if name in state and name not in expected:
            raise InputMismatchError(f"parallelize: unexpected weight {name} ({config['style']} "
                                     "style); expected none")
    for name, shape in expected.items():
        got = state.get(name)
        if got is None:
            raise InputMismatchError(f"parallelize: weight {name} is missing; expected shape "
                                     f"{list(shape)}")
        if not isinstance(got, torch.Tensor):
            raise InputMismatchError(f"parallelize: weight {name}: expected a torch.Tensor, got "
                                     f"{type(got).__name__}")
        if not got.is_floating_point():
            raise InputMismatchError(f"parallelize: weight {name}: expected a floating-point "
                                     f"tensor, got {got.dtype}")
        if tuple(got.shape) != shape:
            raise InputMismatchError(f"parallelize: weight {name}: expected shape "
                                     f"{list(shape)} (hidden={config['hidden']}, heads="
                                     f"{config['heads']}, kv_heads={config['kv_heads']}, ffn="
                                     f"{config['ffn']}), got {list(got.shape)}")


def parallelize(module: torch.nn.Module, *, heads: int | None = None,
                kv_heads: int | None = None, rope_theta: float | None = None,
                stages: int = 1, streams: int = 2, process_group=None, comm: str = "auto",
                schedule: str = "auto") -> ParallelTransformerBlock:
    """This rank's ``ParallelTransformerBlock`` holding the shards of ``module``'s weights
    (same device and dtype, and the same values on every rank). Every check raises a
    ``HostIrError`` on every rank alike (one exchange of the ranks' verdicts and weight
    fingerprints, `agree_on_weights`): unknown naming, a weight of the wrong shape, a shape
    the world size does not divide (see ``check_block_shape``), or weights that differ
    between ranks.

    On 2 ranks, 4 query heads and 2 kv heads of 16: 2 query heads and 1 kv head a rank,
    ``(2 + 2 * 1) * 16 = 64`` QKV columns::

        block = parallelize(LlamaBlock(64, heads=4, kv_heads=2, ffn=128))
        block.qkv_proj.weight.shape      # torch.Size([64, 64])
    """
    def check():
        config = block_config(module, heads, kv_heads, rope_theta)
        state = module.state_dict()
        check_weights(state, config)
        w = module.input_layernorm.weight
        weights = {name: state[name] for name in _expected_shapes(config)}
        for name, t in weights.items():  # the block holds one dtype, on one device
            if (t.dtype, t.device) != (w.dtype, w.device):
                raise InputMismatchError(f"parallelize: weight {name}: expected dtype "
                                         f"{w.dtype} on {w.device} (input_layernorm's), got "
                                         f"{t.dtype} on {t.device}")
        check_block_shape(config["hidden"], config["heads"], config["kv_heads"],
                          config["ffn"], _world(process_group, comm)[1])
        return (config, state, w), weights

    config, state, w = agree_on_weights("parallelize", check, process_group, comm)
    block = ParallelTransformerBlock(**config, stages=stages, streams=streams,
                                     process_group=process_group, comm=comm,
                                     schedule=schedule, device=w.device, dtype=w.dtype)
    load_llama_state_dict(block, state)
    return block


def _is_block(module: torch.nn.Module) -> bool:
    return all(_get(module, path) is not None for path in NORMS + ("self_attn", "mlp"))


def parallelize_model(model: torch.nn.Module, **kw) -> torch.nn.Module:
    """``model`` with each Llama-style block in it (a submodule with ``input_layernorm``,
    ``self_attn``, ``post_attention_layernorm`` and ``mlp``) replaced, in place, by its
    ``parallelize``d twin (``kw``: ``parallelize``'s arguments); returns ``model``.

    The first block shards the sequence it is given and the last gathers it back, so
    everything else in the model (embedding, final norm, head) and the loss run
    unchanged over all ``T`` tokens, alike on every rank (the same input on every rank),
    while the blocks between pass this rank's ``T/D`` tokens on. The model's forward must
    call the blocks in the order they are registered (a ``ModuleList`` or ``Sequential``
    looped over), one after the other, each on ``[tokens, hidden]`` (one sequence), as
    ``h = block(h)``. ``T`` must be a multiple of ``stages * world size``. Optimizers and
    state dicts are taken after this call (the block's parameters are new tensors).

        model = parallelize_model(MyLlama(...), stages=1)    # same weights on every rank
        opt = torch.optim.AdamW(model.parameters())
        loss = F.cross_entropy(model(ids), targets)           # ids: all T tokens
    """
    if not isinstance(model, torch.nn.Module):
        raise InputMismatchError(f"parallelize_model: expected a torch.nn.Module, got "
                                 f"{type(model).__name__}")
    found = [(name, module) for name, module in model.named_modules() if _is_block(module)]
    if not found:
        raise InputMismatchError(f"parallelize_model: {type(model).__name__} holds no "
                                 f"Llama-style block ({', '.join(NORMS)}, self_attn, mlp)")
    outer = [n for n, _ in found if any(n.startswith(f"{m}.") for m, _ in found if m)]
    if outer or any(name == "" for name, _ in found):
        raise InputMismatchError("parallelize_model: blocks nest, or the model is itself a "
                                 "block (use parallelize)")
    blocks = [parallelize(module, **kw) for _, module in found]  # all checked: then replaced
    for (name, _), block in zip(found, blocks):
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, attr, block)
    blocks[0].shard_input = True
    blocks[-1].gather_output = True
    return model


def _check_block(what: str, block) -> None:
    if not isinstance(block, ParallelTransformerBlock):
        raise InputMismatchError(f"{what}: expected a ParallelTransformerBlock, got "
                                 f"{type(block).__name__}")


def _block_config(block: ParallelTransformerBlock) -> dict:
    return dict(hidden=block.hidden, heads=block.heads, kv_heads=block.kv_heads,
                ffn=block.ffn, style=block.style)


def shard_state_dict(state: dict, block: ParallelTransformerBlock) -> dict:
    """``block``'s state dict (this rank's shards) from full weights in Llama's naming
    (InputMismatchError as ``load_llama_state_dict``)."""
    _check_block("shard_state_dict", block)
    check_weights(state, _block_config(block))
    r, d = block.rank, block.world_size
    qkv = [state[f"self_attn.{p}_proj.weight"] for p in "qkv"]
    up_parts = ("gate", "up") if block.style == "llama" else ("up",)
    up = [state[f"mlp.{p}_proj.weight"] for p in up_parts]
    up_name = "gate_up_proj" if block.style == "llama" else "up_proj"
    out = {f"{n}.{p}": state[f"{n}.{p}"] for n in NORMS for p in ("weight", "bias")
           if f"{n}.{p}" in state and getattr(getattr(block, n), p) is not None}
    out["qkv_proj.weight"] = shard_fused(qkv, r, d).t()
    out["o_proj.weight"] = state["self_attn.o_proj.weight"].chunk(d, 1)[r].t()
    out[f"{up_name}.weight"] = shard_fused(up, r, d).t()
    out["down_proj.weight"] = state["mlp.down_proj.weight"].chunk(d, 1)[r].t()
    if block.style == "gpt2":
        out["qkv_proj.bias"] = shard_fused([state[f"self_attn.{p}_proj.bias"] for p in "qkv"], r, d)
        out["up_proj.bias"] = shard_fused([state["mlp.up_proj.bias"]], r, d)
        out["o_proj_bias"] = state["self_attn.o_proj.bias"]
        out["down_proj_bias"] = state["mlp.down_proj.bias"]
    return {k: v.contiguous() for k, v in out.items()}


def load_llama_state_dict(block: ParallelTransformerBlock, state: dict) -> None:
    """Load full weights in Llama's naming (a ``LlamaBlock`` checkpoint) into ``block``'s
    shards; InputMismatchError on a missing or misshapen weight."""
    _check_block("load_llama_state_dict", block)
    with torch.no_grad():
        block.load_state_dict(shard_state_dict(state, block))


def _gather_rows(block, t: torch.Tensor) -> list[torch.Tensor]:
    """Every rank's ``t`` (same shape on each), in rank order, over the block's group."""
    kind, _ = _resolve(t.device, block.process_group, block.comm, "auto")
    rt = _runtime(t.device, block.process_group, kind)
    t = t.contiguous()
    out = torch.empty((rt.comm.world_size,) + tuple(t.shape), dtype=t.dtype, device=t.device)
    stream = rt.backend.current_stream()
    rt.comm.allgather(out.view(-1, *t.shape[1:]), t, stream).wait(stream)
    return list(out.unbind(0))


def llama_state_dict(block: ParallelTransformerBlock) -> dict:
    """The full weights of ``block`` in Llama's naming (what ``LlamaBlock.load_state_dict``
    takes), gathered from every rank: a collective, call it on every rank."""
    _check_block("llama_state_dict", block)

    def rows(t):  # every rank's rows of t, in rank order
        return _gather_rows(block, t.detach())

    dh, f = block.head_dim, block.ffn
    qkv_sizes = (block.heads * dh, block.kv_heads * dh, block.kv_heads * dh)
    out = {f"{n}.{p}": getattr(getattr(block, n), p).detach().clone() for n in NORMS
           for p in ("weight", "bias") if getattr(getattr(block, n), p) is not None}
    for p, w in zip("qkv", unshard_fused(rows(block.qkv_proj.weight.t()), qkv_sizes)):
        out[f"self_attn.{p}_proj.weight"] = w
    out["self_attn.o_proj.weight"] = torch.cat(rows(block.o_proj.weight), 0).t()
    out["mlp.down_proj.weight"] = torch.cat(rows(block.down_proj.weight), 0).t()
    if block.style == "llama":
        gate, up = unshard_fused(rows(block.gate_up_proj.weight.t()), (f, f))
        out["mlp.gate_proj.weight"], out["mlp.up_proj.weight"] = gate, up
        return {k: v.contiguous() for k, v in out.items()}
    out["mlp.up_proj.weight"] = torch.cat(rows(block.up_proj.weight.t()), 0)
    for p, b in zip("qkv", unshard_fused(rows(block.qkv_proj.bias), qkv_sizes)):
        out[f"self_attn.{p}_proj.bias"] = b
    out["mlp.up_proj.bias"] = torch.cat(rows(block.up_proj.bias), 0)
    out["self_attn.o_proj.bias"] = block.o_proj_bias.detach().clone()
    out["mlp.down_proj.bias"] = block.down_proj_bias.detach().clone()
    return {k: v.contiguous() for k, v in out.items()}


def torch_parallelize(module: torch.nn.Module, mesh) -> torch.nn.Module:
    """The same Llama-named block (or a ``torch.nn.Sequential`` of them) parallelized by
    ``torch.distributed.tensor.parallel`` instead, in place: sequence-parallel norms,
    column-wise Q, K, V, gate and up, row-wise O and down with token-sharded (``Shard(1)``)
    outputs: the comparison for ``parallelize``. Inputs are ``DTensor``s ``[B, S, hidden]``
    sharded on S.

    >>> mesh = init_device_mesh("cpu", (world,))                     # doctest: +SKIP
    >>> ref = torch_parallelize(LlamaBlock(64, 4, 2, 128), mesh)      # doctest: +SKIP
    """
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,
                                                   RowwiseParallel, SequenceParallel,
                                                   parallelize_module)

    blocks = list(module) if isinstance(module, torch.nn.Sequential) else [module]
    gather = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    for block in blocks:
        plan = {n: SequenceParallel() for n in NORMS}
        # The row-wise outputs stay DTensors (Shard(1)): the residual adds them to the input.
        row = RowwiseParallel(output_layouts=Shard(1), use_local_output=False)
        plan.update({"self_attn": gather, "mlp": gather, "self_attn.o_proj": row,
                     "mlp.down_proj": row})
        plan.update({p: ColwiseParallel() for p in LINEARS
                     if _get(block, p) is not None and p not in plan
                     and not p.endswith(("o_proj", "down_proj"))})
        parallelize_module(block, mesh, plan)
    return module
