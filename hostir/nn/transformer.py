"""The tensor- and sequence-parallel transformer block (Megatron-LM's layout with sequence
parallelism), its linear layers running host IR programs.

    >>> block = ParallelTransformerBlock(256, heads=8, kv_heads=2, ffn=512)   # doctest: +SKIP
    >>> x = shard_sequence(tokens, block.stages, world, rank)                 # doctest: +SKIP
    >>> y = block(x)                  # [T/D, 256]: the same tokens as x     # doctest: +SKIP

Llama style (the default): ``h = x + attention(rms_norm(x))``, ``y = h + down(silu(gate(n))
* up(n))`` with ``n = rms_norm(h)``, rotary positions, no biases. ``style="gpt2"``: LayerNorm
(with bias), a bias on every linear, the tanh GELU MLP ``down(gelu(up(n)))``, no rotary (GPT-2
adds positions before the first block).

On D ranks with T tokens (one causal sequence), per sublayer:

- the norm runs on this rank's T/D tokens (``runtime.fused.add_norm_forward``: the residual add
  and the norm in one pass, saving rstd and mean); its weight is replicated, so its gradient
  (and every replicated bias's) is all-reduced over the group in the backward, as Megatron's
  sequence parallelism does;
- Q, K and V are one column-parallel linear whose local weight holds this rank's query heads
  and its kv heads' K and V side by side (``shard_fused``): one AllGather+GEMM program, one
  gather for the three; likewise gate and up, one linear ``[hidden, 2 ffn/D]``;
- attention runs on this rank's heads over all T tokens: rotary embedding, causal
  ``scaled_dot_product_attention``, grouped-query attention (``heads / kv_heads`` query
  heads share a kv head);
- the attention output and the MLP's down projection are row-parallel: GEMM+ReduceScatter
  back to T/D tokens, the reduce-scatters overlapped with the GEMMs; the attention output's
  program also runs the residual add and the post-attention norm, each stage's as soon as
  its reduce-scatter has landed (``lowering.passes.stage_norm``), so that norm overlaps
  the next stage's GEMM instead of following the whole program (llama style; gpt2's
  output bias comes between the two, so it keeps them apart);
- the backward mirrors it with the layers' one backward (``hostir.nn.linear._Plan.backward``):
  GEMM+ReduceScatter with the weight-gradient GEMM beside it for the column layers,
  AllGather+GEMM for the row layers.

The eight programs of a block (a forward and a backward for each linear) print under
``HOSTIR_DUMP=host_ir`` when first run, each under a line naming its sublayer
(``attention qkv``, ``attention out``, ``mlp gate_up``, ``mlp down``) and its pass.

Refusals (``LoweringError``, a ``HostIrError``, raised on every rank before any
collective): ``hidden`` not a multiple of ``heads``, ``heads`` not a multiple of
``kv_heads``, ``kv_heads`` not a multiple of the world size (kv heads are sharded, never
replicated), ``ffn`` not a multiple of the world size, ``stages`` or ``streams`` not a
positive int (constructor); an input that is not ``[tokens, hidden]`` with at least one
token, of the block's dtype (any floating dtype under ``torch.autocast``) and on its device,
or a token count that is not a multiple of ``stages * world size`` (each forward, before its
first collective).
"""

from __future__ import annotations

import math
import numbers

import torch
import torch.nn.functional as F

from hostir.errors import LoweringError
from hostir.nn.linear import (COMMS, ColumnParallelLinear, Memo, RowParallelLinear,
                              _no_autocast, _plan, _resolve, _runtime, _torch_group, _world,
                              check_input, check_layer_args, sequence_rows)
from runtime import fused, rotary

__all__ = ["ParallelTransformerBlock", "check_block_shape", "shard_fused", "unshard_fused",
           "rotary_tables", "apply_rotary", "causal_attention", "STYLES"]

STYLES = ("llama", "gpt2")


def check_block_shape(hidden: int, heads: int, kv_heads: int, ffn: int, world_size: int) -> None:
    """LoweringError unless the block shards evenly over ``world_size`` ranks by heads.

    >>> check_block_shape(256, 8, 3, 512, 2)
    Traceback (most recent call last):
    ...
    hostir.errors.LoweringError: transformer block: heads=8 is not a multiple of kv_heads=3; expected heads = kv_heads * group size
    """
    for name, value in (("hidden", hidden), ("heads", heads), ("kv_heads", kv_heads),
                        ("ffn", ffn), ("world size", world_size)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise LoweringError(f"transformer block: {name}={value!r}; expected a positive int")
    if hidden % heads:
        raise LoweringError(f"transformer block: hidden={hidden} is not a multiple of "
                            f"heads={heads}; expected head_dim = hidden / heads")
    if heads % kv_heads:
        raise LoweringError(f"transformer block: heads={heads} is not a multiple of "
                            f"kv_heads={kv_heads}; expected heads = kv_heads * group size")
    if kv_heads % world_size:
        raise LoweringError(f"transformer block: kv_heads={kv_heads} over {world_size} ranks; "
                            f"expected a multiple of the world size (kv heads are sharded, "
                            f"not replicated)")
    if ffn % world_size:
        raise LoweringError(f"transformer block: ffn={ffn} over {world_size} ranks; expected "
                            f"a multiple of the world size")
    if (hidden // heads) % 2:
        raise LoweringError(f"transformer block: head_dim={hidden // heads} is odd; rotary "
                            f"embedding expects an even head dimension")


# ----------------------------------------------------------------------------- sharding


def shard_fused(parts, rank: int, world_size: int) -> torch.Tensor:
    """This rank's rows of a fused projection: rank ``rank``'s ``1/world_size`` of each part
    (rows of ``torch.nn.Linear.weight`` ``[out, in]``, or of a bias), concatenated.

    For ``(q, k, v)`` that is this rank's query heads, then its kv heads' K and V (heads
    are rows ``head * head_dim ...``, and ``kv_heads % world_size == 0`` keeps a head whole);
    for ``(gate, up)`` this rank's half of each. Neither is a contiguous slice of the fused
    ``[q; k; v]`` or ``[gate; up]`` matrix.

    >>> shard_fused((torch.arange(4), torch.arange(10, 14)), 1, 2).tolist()
    [2, 3, 12, 13]
    """
    return torch.cat([p.chunk(world_size, 0)[rank] for p in parts], 0)


def unshard_fused(gathered, sizes) -> list[torch.Tensor]:
    """The full parts back from every rank's ``shard_fused`` rows (``gathered``, in rank
    order); ``sizes``: each part's full row count.

    >>> unshard_fused([torch.tensor([0, 1, 10, 11]), torch.tensor([2, 3, 12, 13])], (4, 4))
    [tensor([0, 1, 2, 3]), tensor([10, 11, 12, 13])]
    """
    d = len(gathered)
    local = [s // d for s in sizes]
    pieces = [g.split(local, 0) for g in gathered]
    return [torch.cat([pieces[r][i] for r in range(d)], 0) for i in range(len(sizes))]


# ----------------------------------------------------------------------------- attention


def rotary_tables(positions: int, head_dim: int, theta: float, device, dtype):
    """``(cos, sin)`` ``[positions, 1, head_dim]`` of the rotary embedding (Llama's
    rotate-half form, frequencies ``theta^(-2i/head_dim)``), computed in float32."""
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32)
                          / head_dim)
    angles = torch.arange(positions, device=device, dtype=torch.float32)[:, None] * inv
    emb = torch.cat((angles, angles), -1)[:, None, :]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rotary(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``t [..., S, heads, head_dim]`` rotated by position (rotate-half form)."""
    half = t.shape[-1] // 2
    rotated = torch.cat((-t[..., half:], t[..., :half]), -1)
    return t * cos + rotated * sin


# scaled_dot_product_attention reads grouped kv heads in place where torch has enable_gqa
_SDPA_GQA = "enable_gqa" in (F.scaled_dot_product_attention.__doc__ or "")


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention of ``q [B, S, heads, d]`` over ``k, v [B, S, kv_heads, d]``
    (grouped-query: ``heads / kv_heads`` consecutive query heads share a kv head), by
    ``scaled_dot_product_attention`` (flash or cuDNN on GPUs); ``[B, S, heads * d]``."""
    group = q.shape[-2] // k.shape[-2]
    q, k, v = (t.transpose(-3, -2) for t in (q, k, v))
    if group > 1 and not _SDPA_GQA:  # older torch: the kv heads copied for each group
        k, v = k.repeat_interleave(group, -3), v.repeat_interleave(group, -3)
    gqa = {"enable_gqa": True} if group > 1 and _SDPA_GQA else {}
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True, **gqa)
    return o.transpose(-3, -2).flatten(-2)


# ----------------------------------------------------------------------------- the seams


class _AddNorm(torch.autograd.Function):
    """``(norm(x + residual), x + residual)`` (``norm(x)`` alone without a residual, or
    ``(norm(x), x)`` with ``passthrough``) by ``runtime.fused``; the backward returns the
    stream's gradient to both inputs and the weight's (and bias's) summed over the group
    by ``reduce``. The stream's own gradient (of ``x + residual``, or of the passed-through
    ``x``) enters the norm's backward kernel as ``dh``: no separate accumulation."""

    @staticmethod
    def forward(ctx, x, residual, weight, bias, eps, kind, reduce, passthrough=False):
        y, h, mean, rstd = fused.add_norm_forward(x, residual, weight, bias, eps, kind)
        ctx.kind, ctx.has_residual, ctx.reduce = kind, residual is not None, reduce
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(h, weight, mean, rstd)
        if residual is not None:
            return y, h
        return (y, x.view_as(x)) if passthrough else y

    @staticmethod
    def backward(ctx, dy, *rest):
        h, weight, mean, rstd = ctx.saved_tensors
        dh = rest[0] if rest else None
        if dy is None:
            dy = torch.zeros_like(h)
        dx, dw, db = fused.add_norm_backward(dy, h, weight, mean, rstd, ctx.kind, dh)
        dw, db = ctx.reduce(dw), (ctx.reduce(db) if db is not None else None)
        return dx, (dx if ctx.has_residual else None), dw, db, None, None, None, None


class _RowAddNorm(torch.autograd.Function):
    """``(norm(a W summed over ranks + residual), a W summed + residual)``: a row-parallel
    linear and the next residual add + norm in one host program (each stage's add + norm
    right after its reduce-scatter, ``_Plan.row_forward_norm``). The backward runs the
    norm's backward kernel, whose dx is the gradient of both the linear's output and the
    residual, then the linear's backward (AllGather+GEMM) on it; the norm's weight (and
    bias) gradients are summed over the group by ``reduce``."""

    @staticmethod
    def forward(ctx, a, w, residual, weight, bias, plan, eps, kind, reduce):
        with _no_autocast(a.device):
            n, h, mean, rstd = plan.row_forward_norm(a, w, residual, weight, bias, eps, kind)
        ctx.plan, ctx.kind, ctx.reduce = plan, kind, reduce
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(a, w, h, weight, mean, rstd)
        return n, h

    @staticmethod
    def backward(ctx, dn, dh):
        a, w, h, weight, mean, rstd = ctx.saved_tensors
        if dn is None:
            dn = torch.zeros_like(h)
        ds, dweight, dbias = fused.add_norm_backward(dn, h, weight, mean, rstd, ctx.kind, dh)
        dweight = ctx.reduce(dweight)
        dbias = ctx.reduce(dbias) if dbias is not None else None
        need_a, need_w = ctx.needs_input_grad[:2]
        da = dw = None
        if need_a or need_w:
            with _no_autocast(ds.device):
                da, dw = ctx.plan.backward(ds.contiguous(), a, w, need_a, need_w)
        return da, dw, ds, dweight, dbias, None, None, None, None


class _QKVRotary(torch.autograd.Function):
    """``(q, k, v)`` ``[T, heads, d]`` of the fused QKV output, q and k rotated by position
    (``runtime.rotary``: one kernel forward, one backward writing the fused gradient)."""

    @staticmethod
    def forward(ctx, qkv, cos, sin, hq, hkv):
        ctx.save_for_backward(cos, sin)
        ctx.heads = (hq, hkv)
        return rotary.rotary_forward(qkv, cos, sin, hq, hkv)

    @staticmethod
    def backward(ctx, dq, dk, dv):
        cos, sin = ctx.saved_tensors
        hq, hkv = ctx.heads
        t, d = cos.shape[0], cos.shape[-1]
        dq, dk, dv = (g if g is not None else torch.zeros(t, h, d, dtype=cos.dtype,
                                                          device=cos.device)
                      for g, h in ((dq, hq), (dk, hkv), (dv, hkv)))
        return rotary.rotary_backward(dq, dk, dv, cos, sin, hq, hkv), None, None, None, None


class _AddReplicatedBias(torch.autograd.Function):
    """``y + bias`` over sequence-sharded tokens; the bias's gradient (this rank's tokens'
    sum) summed over the group by ``reduce``."""

    @staticmethod
    def forward(ctx, y, bias, reduce):
        ctx.reduce, ctx.dtype = reduce, bias.dtype
        return y + bias.to(y.dtype)

    @staticmethod
    def backward(ctx, dy):
        return dy, ctx.reduce(dy.float().sum(0)).to(ctx.dtype), None


class _SwiGLU(torch.autograd.Function):
    """``silu(gate) * up`` of the fused gate-up output ``[T, 2 F/D]`` (this rank's gate
    columns, then its up columns) by ``runtime.fused``."""

    @staticmethod
    def forward(ctx, gate_up):
        ctx.save_for_backward(gate_up)
        return fused.swiglu_forward(*gate_up.chunk(2, dim=1))

    @staticmethod
    def backward(ctx, da):
        (gate_up,) = ctx.saved_tensors
        d_gate_up = torch.empty_like(gate_up)  # dgate and dup land in its halves: no cat
        fused.swiglu_backward(da, *gate_up.chunk(2, dim=1), out=d_gate_up.chunk(2, dim=1))
        return d_gate_up


class _GELU(torch.autograd.Function):
    """The tanh GELU by ``runtime.fused``."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return fused.gelu_forward(x)

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        return fused.gelu_backward(dy, x)


class _GroupComm:
    """The block's collectives outside its programs. Called, it sums a replicated
    parameter's gradient over the group: each rank's gradient covers only its T/D tokens
    (Megatron's sequence-parallel rule); it is called in the backward of the op that uses
    the parameter, not as a hook on it: a hook would not follow the parameter into a deep
    copy or a ``load_state_dict(assign=True)``. ``gather_sequence`` gathers the tokens
    (a model's last block, ``parallelize_model``)."""

    def __init__(self, process_group, comm: str, schedule: str):
        self.process_group, self.comm, self.schedule = process_group, comm, schedule

    def _comm(self, device):
        # remembered as `_plan` remembers its plans (made here on first use, so that an
        # instance pickled before it existed loads and runs too)
        runtimes = self.__dict__.setdefault("_runtimes", Memo())
        key = (device, self.comm, self.schedule, id(self.process_group),
               _torch_group(self.process_group))
        rt = runtimes.get(key)
        if rt is None:
            kind, _ = _resolve(device, self.process_group, self.comm, self.schedule)
            rt = runtimes[key] = _runtime(device, self.process_group, kind)
        return rt

    def __call__(self, grad: torch.Tensor) -> torch.Tensor:
        rt = self._comm(grad.device)
        if rt.comm.world_size == 1:
            return grad
        out = grad.contiguous().clone()
        stream = rt.backend.current_stream()
        rt.comm.allreduce(out, out, "sum", stream).wait(stream)
        return out

    def gather_sequence(self, t: torch.Tensor, stages: int) -> torch.Tensor:
        """Every rank's sequence-sharded ``t [T/D, ...]`` (``stages`` stages) gathered into
        all ``T`` tokens in order: an all-gather, then the stage-major rows put back."""
        rt = self._comm(t.device)
        d = rt.comm.world_size
        if d == 1:
            return t
        t = t.contiguous()
        out = torch.empty((d,) + tuple(t.shape), dtype=t.dtype, device=t.device)
        stream = rt.backend.current_stream()
        rt.comm.allgather(out, t.unsqueeze(0), stream).wait(stream)  # as a program posts it
        # rank r holds stage s's rows r*T/(S*D).. : [D, S, m, ...] -> [S, D, m, ...]
        out = out.view(d, stages, -1, *t.shape[1:]).transpose(0, 1)
        return out.reshape(-1, *t.shape[1:])


class _ShardSequence(torch.autograd.Function):
    """All ``T`` tokens ``[T, ...]`` (the same on every rank) -> this rank's sequence-sharded
    rows; the backward gathers every rank's gradient rows, so whatever ran before (an
    embedding, on every rank alike) gets the whole gradient on every rank."""

    @staticmethod
    def forward(ctx, x, rows, group, stages):
        ctx.group, ctx.stages = group, stages
        return x[rows]  # an index gather: a new, contiguous tensor

    @staticmethod
    def backward(ctx, g):
        return ctx.group.gather_sequence(g, ctx.stages), None, None, None


class _GatherSequence(torch.autograd.Function):
    """This rank's sequence-sharded rows -> all ``T`` tokens, gathered; what follows (a
    final norm, a head, the loss) runs on every rank alike, so its gradient is the same on
    every rank and this rank's rows of it are its share (no sum)."""

    @staticmethod
    def forward(ctx, y, rows, group, stages):
        ctx.save_for_backward(rows)
        return group.gather_sequence(y, stages)

    @staticmethod
    def backward(ctx, g):
        (rows,) = ctx.saved_tensors
        return g[rows], None, None, None


class ReplicatedNorm(torch.nn.Module):
    """RMSNorm or LayerNorm over sequence-sharded tokens, its weight (and bias) the same on
    every rank, their gradients all-reduced over the group. ``norm(x, residual)`` returns
    ``(norm(x + residual), x + residual)`` (one fused pass); ``norm(x)`` ``norm(x)``."""

    def __init__(self, hidden: int, kind: str, eps: float, reduce: _GroupComm, *,
                 device=None, dtype=None):
        super().__init__()
        if kind not in fused.NORM_KINDS:
            raise LoweringError(f"norm kind {kind!r}: expected one of {fused.NORM_KINDS}")
        if (not isinstance(eps, numbers.Real) or isinstance(eps, bool)
                or not math.isfinite(eps) or eps < 0):
            raise LoweringError(f"norm eps={eps!r}: expected a finite number >= 0")
        self.kind, self.eps = kind, float(eps)
        self.reduce = reduce
        self.weight = torch.nn.Parameter(torch.ones(hidden, device=device, dtype=dtype))
        self.bias = None
        if kind == "layer_norm":
            self.bias = torch.nn.Parameter(torch.zeros(hidden, device=device, dtype=dtype))

    def forward(self, x, residual=None, passthrough: bool = False):
        """``norm(x + residual), x + residual``; ``norm(x)``; with ``passthrough``
        ``norm(x), x`` where the returned ``x``'s gradient joins the norm's backward."""
        return _AddNorm.apply(x, residual, self.weight, self.bias, self.eps, self.kind,
                              self.reduce, passthrough)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, kind={self.kind}, eps={self.eps}"


# ----------------------------------------------------------------------------- the block


class ParallelTransformerBlock(torch.nn.Module):
    """A transformer block, tensor and sequence parallel; see the module docstring.

    Input and output: this rank's tokens ``[T/D, hidden]`` of one causal sequence of T
    tokens, sequence-sharded with ``stages`` (``hostir.nn.shard_sequence(x, stages, D,
    rank)``). Parameters (local shards, ``[in, out]`` as the linear layers keep them):
    ``input_layernorm``, ``qkv_proj`` (``[hidden, (heads + 2 kv_heads) head_dim / D]``),
    ``o_proj``, ``post_attention_layernorm``, ``gate_up_proj`` (llama: ``[hidden,
    2 ffn / D]``) or ``up_proj`` (gpt2), ``down_proj``; gpt2 adds ``o_proj_bias`` and
    ``down_proj_bias`` (replicated). ``hostir.nn.parallelize`` fills them from an unsharded
    torch block.

    ``stages``, ``streams``, ``comm``, ``schedule`` go to the four linear layers (see
    ``hostir.nn.linear``). ``stages=1`` suits the ring schedule (the default over the copy
    engine: whole GEMMs hide the transfers); the ``pipelined`` schedule overlaps a stage's
    collective with another stage's GEMM, so give it ``stages=2`` or more.

    >>> block = ParallelTransformerBlock(256, 8, kv_heads=2, ffn=512, stages=1)  # doctest: +SKIP
    >>> block(x_local).shape                                                     # doctest: +SKIP
    torch.Size([T // D, 256])
    """

    def __init__(self, hidden: int, heads: int, kv_heads: int | None = None,
                 ffn: int | None = None, *, style: str = "llama", eps: float | None = None,
                 rope_theta: float = 10000.0, stages: int = 1, streams: int = 2,
                 process_group=None, comm: str = "auto", schedule: str = "auto",
                 device=None, dtype=None):
        super().__init__()
        if style not in STYLES:
            raise LoweringError(f"style={style!r}: expected one of {', '.join(STYLES)}")
        if comm not in COMMS:
            raise LoweringError(f"comm={comm!r}: expected one of {', '.join(COMMS)}")
        kv_heads = heads if kv_heads is None else kv_heads
        ffn = 4 * hidden if ffn is None else ffn
        check_layer_args("transformer block", dtype, stages=stages, streams=streams)
        rank, world = _world(process_group, comm)
        check_block_shape(hidden, heads, kv_heads, ffn, world)
        self.hidden, self.heads, self.kv_heads, self.ffn = hidden, heads, kv_heads, ffn
        self.head_dim, self.style, self.rope_theta = hidden // heads, style, rope_theta
        self.stages, self.rank, self.world_size = stages, rank, world
        self.process_group, self.comm = process_group, comm
        llama = style == "llama"
        eps = (1e-6 if llama else 1e-5) if eps is None else eps
        kw = dict(stages=stages, streams=streams, process_group=process_group, comm=comm,
                  schedule=schedule, device=device, dtype=dtype)
        self._reduce = reduce = _GroupComm(process_group, comm, schedule)
        kind = "rms_norm" if llama else "layer_norm"
        nkw = dict(device=device, dtype=dtype)
        d = self.head_dim
        self.input_layernorm = ReplicatedNorm(hidden, kind, eps, reduce, **nkw)
        self.qkv_proj = ColumnParallelLinear(hidden, (heads + 2 * kv_heads) * d,
                                             bias=not llama, **kw)
        self.o_proj = RowParallelLinear(heads * d, hidden, **kw)
        self.post_attention_layernorm = ReplicatedNorm(hidden, kind, eps, reduce, **nkw)
        up = ColumnParallelLinear(hidden, 2 * ffn if llama else ffn, bias=not llama, **kw)
        setattr(self, "gate_up_proj" if llama else "up_proj", up)
        self.down_proj = RowParallelLinear(ffn, hidden, **kw)
        self.o_proj_bias = self.down_proj_bias = None
        if not llama:
            self.o_proj_bias = torch.nn.Parameter(torch.zeros(hidden, **nkw))
            self.down_proj_bias = torch.nn.Parameter(torch.zeros(hidden, **nkw))
        for label, layer in (("attention qkv", self.qkv_proj), ("attention out", self.o_proj),
                             ("mlp gate_up" if llama else "mlp up", up),
                             ("mlp down", self.down_proj)):
            layer.label = label
        self._rotary_cache: dict = {}
        self._rows_cache: dict = {}
        # set by `hostir.nn.parallelize_model` on a model's first and last block
        self.shard_input = self.gather_output = False

    @property
    def mlp_up(self) -> ColumnParallelLinear:
        return self.gate_up_proj if self.style == "llama" else self.up_proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's tokens ``[T/D, hidden]`` -> the same tokens. With ``shard_input``
        the input is all ``T`` tokens (the same on every rank), sharded here; with
        ``gather_output`` the output is all ``T`` tokens, gathered here."""
        tokens = f"[tokens{'' if self.shard_input else ' / ranks'}, {self.hidden}]"
        if not isinstance(x, torch.Tensor):
            raise LoweringError(f"ParallelTransformerBlock: expected a torch.Tensor {tokens}, "
                                f"got {type(x).__name__}")
        if x.dim() != 2 or x.shape[1] != self.hidden:
            raise LoweringError(f"ParallelTransformerBlock: expected input {tokens}, "
                                f"got {list(x.shape)}")
        check_input("ParallelTransformerBlock", x, self.input_layernorm.weight)
        if self.shard_input:
            x = _ShardSequence.apply(x, self._rows(x.shape[0], x.device), self._reduce,
                                     self.stages)
        n, x = self.input_layernorm(x, passthrough=True)  # x's two gradients meet in one kernel
        n, h = self._attention(n, x)
        y = h + self._mlp(n)
        if self.gather_output:
            y = _GatherSequence.apply(y, self._rows(y.shape[0] * self.world_size, y.device),
                                      self._reduce, self.stages)
        return y

    def _rows(self, tokens: int, device) -> torch.Tensor:
        """This rank's rows of ``tokens`` (LoweringError, before any collective and alike
        on every rank, where they do not split into stages x ranks)."""
        key = (tokens, str(device))
        if key not in self._rows_cache:
            self._rows_cache[key] = sequence_rows(tokens, self.stages, self.world_size,
                                                  self.rank).to(device)
        return self._rows_cache[key]

    def _attention(self, n: torch.Tensor, residual: torch.Tensor):
        """``(post_attention_layernorm(h), h)`` with ``h = residual + attention(n)``."""
        qkv = self.qkv_proj(n)  # [T, (heads + 2 kv_heads) d / D]: all tokens, our heads
        t, d = qkv.shape[0], self.head_dim
        hq, hkv = self.heads // self.world_size, self.kv_heads // self.world_size
        if self.style == "llama":  # q, k rotated and v split off in one pass
            cos, sin = self._rotary(t, qkv.device, qkv.dtype)
            q, k, v = (x.view(1, t, -1, d) for x in _QKVRotary.apply(qkv, cos, sin, hq, hkv))
        else:
            q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=1)
            q, k, v = q.view(1, t, hq, d), k.view(1, t, hkv, d), v.view(1, t, hkv, d)
        a = causal_attention(q, k, v).reshape(t, hq * d)
        norm = self.post_attention_layernorm
        if self.o_proj_bias is None and not torch.is_autocast_enabled(a.device.type):
            # the output projection's reduce-scatters and the norm in one program, whose
            # inputs share one dtype (else, as under autocast, the two apart)
            a, w = self.o_proj._inputs(a)
            if all(t is None or t.dtype == a.dtype for t in (residual, norm.weight, norm.bias)):
                return _RowAddNorm.apply(a, w, residual.contiguous(), norm.weight, norm.bias,
                                         _plan("row", self.o_proj, a), norm.eps, norm.kind,
                                         norm.reduce)
        y = self.o_proj(a)
        if self.o_proj_bias is not None:
            y = _AddReplicatedBias.apply(y, self.o_proj_bias, self._reduce)
        return norm(y, residual)

    def _mlp(self, n: torch.Tensor) -> torch.Tensor:
        up = self.mlp_up(n)
        a = _SwiGLU.apply(up) if self.style == "llama" else _GELU.apply(up)
        y = self.down_proj(a)
        if self.down_proj_bias is None:
            return y
        return _AddReplicatedBias.apply(y, self.down_proj_bias, self._reduce)

    def _rotary(self, t: int, device, dtype):
        key = (t, str(device), dtype)
        if key not in self._rotary_cache:
            self._rotary_cache = {key: rotary_tables(t, self.head_dim, self.rope_theta,
                                                     device, dtype)}
        return self._rotary_cache[key]

    def extra_repr(self) -> str:
        return (f"hidden={self.hidden}, heads={self.heads}, kv_heads={self.kv_heads}, "
                f"ffn={self.ffn}, style={self.style}, world_size={self.world_size}")
