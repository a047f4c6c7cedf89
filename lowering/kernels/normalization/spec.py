"""What a normalization fusion computes: its ops, its spec, and the spec's text form.

A `NormalizationSpec` names the fusion (rows, hidden, the norm, the pointwise ops before
and after it, the dtypes) and may pin any field of its launch plan; its ``plan`` is the
planner's answer (`planner.plan_launch`), worked out once per spec. `spec_params` and
`spec_from_params` carry a spec through a host program's ``KernelDef``.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
from typing import Union

from hostir.errors import LoweringError
from lowering.kernels.normalization.candidates import vector_width_for
from lowering.kernels.normalization.plan import SM90, Hardware, LaunchPlan
from lowering.kernels.normalization.planner import plan_launch

# Bytes of an element of each dtype a fusion's tensors may have.
DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}
HALF_DTYPES = ("float16", "bfloat16")


# --------------------------------------------------------------------------- ops


@dataclasses.dataclass(frozen=True, slots=True)
class AddBroadcast:
    """``v = v + float(p[col])``: a 1-D tensor of ``hidden`` elements broadcast over rows."""

    dtype: str = "float16"
    name: str = "bias"

    def __post_init__(self):
        _check_dtype("AddBroadcast.dtype", self.dtype, tuple(DTYPE_BYTES))
        if not self.name.isidentifier():
            raise LoweringError(f"AddBroadcast.name: expected an identifier, got {self.name!r}")


@dataclasses.dataclass(frozen=True, slots=True)
class Cast:
    """``v = float(dtype(v))``: rounds to nearest-even in ``dtype``, math stays fp32.

    This is what ``half(float(x) + float(b0))`` means inside a fusion: the rounding
    is part of the function and a fused kernel must keep it.
    """

    dtype: str

    def __post_init__(self):
        _check_dtype("Cast.dtype", self.dtype, HALF_DTYPES + ("float32",))


PointwiseOp = Union[AddBroadcast, Cast]


@dataclasses.dataclass(frozen=True, slots=True)
class LayerNorm:
    """``(v - mean) / sqrt(var + eps) * weight + bias`` over a row, biased variance."""

    eps: float = 1e-5
    weight: bool = True
    bias: bool = True
    weight_dtype: str = "float16"
    bias_dtype: str = "float16"

    def __post_init__(self):
        _check_eps(self.eps)
        _check_dtype("LayerNorm.weight_dtype", self.weight_dtype, tuple(DTYPE_BYTES))
        _check_dtype("LayerNorm.bias_dtype", self.bias_dtype, tuple(DTYPE_BYTES))


@dataclasses.dataclass(frozen=True, slots=True)
class RmsNorm:
    """``v / sqrt(mean(v^2) + eps) * weight`` over a row."""

    eps: float = 1e-6
    weight: bool = True
    weight_dtype: str = "float16"

    def __post_init__(self):
        _check_eps(self.eps)
        _check_dtype("RmsNorm.weight_dtype", self.weight_dtype, tuple(DTYPE_BYTES))


def _check_dtype(what: str, dtype: str, allowed: tuple[str, ...]) -> None:
    if dtype not in allowed:
        raise LoweringError(f"{what}: expected one of {list(allowed)}, got {dtype!r}")


def _check_eps(eps: float) -> None:
    if not (isinstance(eps, (int, float)) and math.isfinite(eps) and eps > 0):
        raise LoweringError(f"eps: expected a finite number > 0, got {eps!r}")


# --------------------------------------------------------------------------- spec


@dataclasses.dataclass(frozen=True, slots=True)
class NormalizationSpec:
    """One row-wise normalization fusion over ``x[rows, hidden]``.

    The kernel's arguments, in order: ``x``, one tensor per `AddBroadcast` of the
    prologue, ``weight`` and ``bias`` of the norm (when present), one per `AddBroadcast`
    of the epilogue, the output ``y``, and ``rows`` (int32). `parameter_names` lists
    the tensors. ``alignment`` is the byte alignment every base pointer is known to
    have (torch allocations: 256; a slice: less). ``hardware``: the GPU the planner's model
    plans for (`Hardware`; None: `SM90`). The fifteen fields before it (and ``envelope``,
    the envelope row-wise kernel, and its ``cluster``, after it) override the
    heuristic plan (benchmark sweeps, tests): ``param_cache="none"`` is the row-wise
    kernel, ``"registers"``/``"shared"`` the persistent one (see `LaunchPlan`).
    """

    rows: int
    hidden: int
    norm: Union[LayerNorm, RmsNorm]
    input_dtype: str = "float16"
    output_dtype: str = "float16"
    prologue: tuple[PointwiseOp, ...] = ()
    epilogue: tuple[PointwiseOp, ...] = ()
    alignment: int = 16
    threads_per_row: int | None = None
    batch: int | None = None
    rows_per_block: int | None = None
    param_cache: str | None = None
    prefetch: bool | None = None
    x_staged: bool | None = None
    stages: int | None = None
    one_pass: bool | None = None
    l2_hint: str | None = None
    packed: bool | None = None
    x_bulk: bool | None = None
    shared_param_bytes: int | None = None
    vector_width: int | None = None
    blocks_per_sm: int | None = None
    shared_row: bool | None = None
    hardware: Hardware | None = None
    envelope: bool | None = None
    cluster: int | None = None

    def __post_init__(self):
        for what, n in (("rows", self.rows), ("hidden", self.hidden)):
            if not isinstance(n, int) or n < 1:
                raise LoweringError(f"NormalizationSpec.{what}: expected an int >= 1, got {n!r}")
        if self.rows >= 2**31:
            # row indices are int; element offsets are size_t (row * hidden may pass 2^31)
            raise LoweringError(f"NormalizationSpec.rows: expected < 2**31, got {self.rows}")
        _check_dtype("NormalizationSpec.input_dtype", self.input_dtype, HALF_DTYPES)
        _check_dtype("NormalizationSpec.output_dtype", self.output_dtype, tuple(DTYPE_BYTES))
        if not isinstance(self.norm, (LayerNorm, RmsNorm)):
            raise LoweringError(
                f"NormalizationSpec.norm: expected LayerNorm or RmsNorm, got {type(self.norm).__name__}"
            )
        for where in ("prologue", "epilogue"):
            ops = getattr(self, where)
            if not isinstance(ops, tuple):
                raise LoweringError(f"NormalizationSpec.{where}: expected a tuple of ops, got {type(ops).__name__}")
            for op in ops:
                if not isinstance(op, (AddBroadcast, Cast)):
                    raise LoweringError(
                        f"NormalizationSpec.{where}: expected AddBroadcast or Cast, got {op!r}"
                    )
        names = self.parameter_names()
        if len(set(names)) != len(names):
            raise LoweringError(f"NormalizationSpec: parameter names repeat: {names}")
        if self.alignment < 1 or self.alignment & (self.alignment - 1):
            raise LoweringError(f"NormalizationSpec.alignment: expected a power of two, got {self.alignment}")
        self.plan  # noqa: B018 -- validate the launch plan now, not at first launch

    # -- what the kernel reads and writes

    def parameter_names(self) -> tuple[str, ...]:
        """Names of the tensors the kernel takes, in argument order (``rows`` follows)."""
        names = ["x"]
        names += [op.name for op in self.prologue if isinstance(op, AddBroadcast)]
        if self.norm.weight:
            names.append("weight")
        if isinstance(self.norm, LayerNorm) and self.norm.bias:
            names.append("bias")
        names += [op.name for op in self.epilogue if isinstance(op, AddBroadcast)]
        names.append("y")
        return tuple(names)

    def parameter_dtypes(self) -> tuple[str, ...]:
        dtypes = [self.input_dtype]
        dtypes += [op.dtype for op in self.prologue if isinstance(op, AddBroadcast)]
        if self.norm.weight:
            dtypes.append(self.norm.weight_dtype)
        if isinstance(self.norm, LayerNorm) and self.norm.bias:
            dtypes.append(self.norm.bias_dtype)
        dtypes += [op.dtype for op in self.epilogue if isinstance(op, AddBroadcast)]
        dtypes.append(self.output_dtype)
        return tuple(dtypes)

    def tensor_sizes(self) -> tuple[int, ...]:
        """Bytes an element of each 1-D tensor (the parameters between x and y), in order."""
        return tuple(DTYPE_BYTES[d] for d in self.parameter_dtypes()[1:-1])

    def bytes_moved(self) -> int:
        """Bytes the fusion must read and write once: x, y and each 1-D tensor."""
        big = (DTYPE_BYTES[self.input_dtype] + DTYPE_BYTES[self.output_dtype]) * self.rows * self.hidden
        return big + sum(self.tensor_sizes()) * self.hidden

    @property
    def rows_aligned(self) -> bool:
        """Whether every row of x, y and the 1-D tensors starts on 16 bytes: the base
        pointers do (``alignment``) and a row of x is a multiple of 16 bytes (then so is
        a row of y, and each chunk of a 1-D tensor lines up with x's)."""
        return self.alignment >= 16 and self.hidden * DTYPE_BYTES[self.input_dtype] % 16 == 0

    @property
    def plan(self) -> LaunchPlan:
        return _plan_of(self)

    def _make_plan(self) -> LaunchPlan:
        dtypes = self.parameter_dtypes()
        width = vector_width_for(self.hidden, tuple(DTYPE_BYTES[d] for d in dtypes), self.alignment)
        if self.vector_width is not None:
            # narrower vectors than the widest: every row still starts aligned to them
            if self.vector_width not in (1, 2, 4, 8) or self.vector_width > width:
                raise LoweringError(
                    f"NormalizationSpec.vector_width: expected a power of two up to {width} "
                    f"(the widest these rows and this alignment allow), got {self.vector_width!r}")
            width = self.vector_width
        return plan_launch(
            self.hidden,
            width,
            value_bytes=DTYPE_BYTES[self.input_dtype],
            threads_per_row=self.threads_per_row,
            batch=self.batch,
            rows_per_block=self.rows_per_block,
            param_cache=self.param_cache,
            prefetch=self.prefetch,
            param_bytes=sum(self.tensor_sizes()),
            x_staged=self.x_staged,
            bf16="bfloat16" in dtypes,
            stages=self.stages,
            one_pass=self.one_pass,
            l2_hint=self.l2_hint,
            packed=self.packed,
            x_bulk=self.x_bulk,
            shared_param_bytes=self.shared_param_bytes,
            param_sizes=self.tensor_sizes(),
            blocks_per_sm=self.blocks_per_sm,
            # a pinned vector width is a register-family plan unless shared_row says otherwise
            shared_row=(False if self.shared_row is None and self.vector_width is not None
                        else self.shared_row),
            rows_aligned=self.rows_aligned,
            out_bytes=DTYPE_BYTES[self.output_dtype],
            prologue_bytes=sum(DTYPE_BYTES[op.dtype] for op in self.prologue
                               if isinstance(op, AddBroadcast)),
            passes=3 if isinstance(self.norm, LayerNorm) else 2,
            layer_norm=isinstance(self.norm, LayerNorm),
            hardware=self.hardware or SM90,
            envelope=self.envelope,
            cluster=self.cluster,
            prologue=bool(self.prologue),
            base_aligned=self.alignment >= 16,
        )

    @property
    def kernel_name(self) -> str:
        """``hostir_<kind>_<hidden>_<digest>``: the digest of what the kernel computes and
        its plan, not of the hardware model that chose the plan (nor the rows, a launch
        argument), so that GPUs whose models pick the same plan share one kernel: one
        source, one entry of the kernel cache (a warmup on a machine without the GPU
        fills it for the GPU wherever the plans agree)."""
        what = dataclasses.replace(self, rows=1, hardware=None)
        digest = hashlib.sha1(f"{what!r} {self.plan!r}".encode()).hexdigest()[:10]
        kind = "layer_norm" if isinstance(self.norm, LayerNorm) else "rms_norm"
        return f"hostir_{kind}_{self.hidden}_{digest}"

    # -- the common fusions

    @staticmethod
    def reference_fusion(rows: int, hidden: int, eps: float = 1e-5, dtype: str = "float16", **kw):
        """``t9 = half(x + b0); t13 = float(t9) + b1; y = half(layer_norm(t13) * w + b2)``."""
        return NormalizationSpec(
            rows,
            hidden,
            LayerNorm(eps, weight_dtype=dtype, bias_dtype=dtype),
            input_dtype=dtype,
            output_dtype=dtype,
            prologue=(AddBroadcast(dtype, "b0"), Cast(dtype), AddBroadcast(dtype, "b1")),
            **kw,
        )

    @staticmethod
    def layer_norm(rows: int, hidden: int, eps: float = 1e-5, dtype: str = "float16", **kw):
        return NormalizationSpec(
            rows, hidden, LayerNorm(eps, weight_dtype=dtype, bias_dtype=dtype),
            input_dtype=dtype, output_dtype=dtype, **kw,
        )

    @staticmethod
    def rms_norm(rows: int, hidden: int, eps: float = 1e-6, dtype: str = "float16", **kw):
        return NormalizationSpec(
            rows, hidden, RmsNorm(eps, weight_dtype=dtype),
            input_dtype=dtype, output_dtype=dtype, **kw,
        )


# The fields of NormalizationSpec that pin its plan (the rest say what it computes).
PLAN_FIELDS = ("threads_per_row", "batch", "rows_per_block", "param_cache", "prefetch",
               "x_staged", "stages", "one_pass", "l2_hint", "packed", "x_bulk",
               "shared_param_bytes", "vector_width", "blocks_per_sm", "shared_row", "envelope",
               "cluster")


def spec_with_plan(spec: NormalizationSpec, plan: LaunchPlan) -> NormalizationSpec:
    """``spec`` with every plan field pinned to ``plan`` (a plan of the same row)."""
    if plan.shared_row:
        return dataclasses.replace(spec, **{
            **{f: None for f in PLAN_FIELDS}, "shared_row": True,
            "threads_per_row": plan.threads_per_row, "blocks_per_sm": plan.blocks_per_sm or None})
    if plan.envelope:
        return dataclasses.replace(spec, **{
            **{f: None for f in PLAN_FIELDS}, "envelope": True,
            "threads_per_row": plan.threads_per_row, "batch": plan.batch,
            "rows_per_block": plan.rows_per_block, "one_pass": plan.one_pass or None,
            "blocks_per_sm": plan.blocks_per_sm or None, "cluster": plan.cluster})
    return dataclasses.replace(
        spec, envelope=None, cluster=None, shared_row=False, threads_per_row=plan.threads_per_row, batch=plan.batch,
        rows_per_block=plan.rows_per_block, param_cache=plan.param_cache,
        prefetch=plan.prefetch if plan.persistent else None, x_staged=plan.x_staged or None,
        stages=plan.stages if plan.x_staged else None, one_pass=plan.one_pass or None,
        l2_hint=plan.l2_hint or None, packed=plan.packed or None, x_bulk=plan.x_bulk or None,
        shared_param_bytes=plan.shared_param_bytes or None, vector_width=plan.vector_width,
        blocks_per_sm=plan.blocks_per_sm or None)


@functools.lru_cache(maxsize=4096)
def _plan_of(spec: NormalizationSpec) -> LaunchPlan:
    # specs are frozen and hashable: each plan is worked out once per process
    return spec._make_plan()


# --------------------------------------------------------------------------- text form

def _ops_to_text(ops) -> str:
    """``add:float16:b0|cast:float16`` — the ops of a prologue or epilogue as one string."""
    parts = []
    for op in ops:
        parts.append(f"add:{op.dtype}:{op.name}" if isinstance(op, AddBroadcast)
                     else f"cast:{op.dtype}")
    return "|".join(parts)


def _ops_from_text(text: str, where: str) -> tuple:
    ops = []
    for part in filter(None, text.split("|")):
        fields = part.split(":")
        if fields[0] == "add" and len(fields) == 3:
            ops.append(AddBroadcast(fields[1], fields[2]))
        elif fields[0] == "cast" and len(fields) == 2:
            ops.append(Cast(fields[1]))
        else:
            raise LoweringError(f"{where}: cannot read op {part!r}: expected add:<dtype>:<name> "
                                "or cast:<dtype>")
    return tuple(ops)


def spec_params(spec: NormalizationSpec) -> tuple[tuple[str, object], ...]:
    """The spec as plain (key, value) pairs: the parameters of a host program's
    ``KernelDef`` (``generator=normalization``). ``spec_from_params`` reverses it."""
    n = spec.norm
    params = [("rows", spec.rows), ("hidden", spec.hidden),
              ("norm", "layer_norm" if isinstance(n, LayerNorm) else "rms_norm"),
              ("eps", float(n.eps)), ("weight", n.weight), ("weight_dtype", n.weight_dtype)]
    if isinstance(n, LayerNorm):
        params += [("bias", n.bias), ("bias_dtype", n.bias_dtype)]
    params += [("input_dtype", spec.input_dtype), ("output_dtype", spec.output_dtype),
               ("prologue", _ops_to_text(spec.prologue)),
               ("epilogue", _ops_to_text(spec.epilogue)), ("alignment", spec.alignment)]
    for key in PLAN_FIELDS:
        if getattr(spec, key) is not None:
            params.append((key, getattr(spec, key)))
    return tuple(params)


def spec_from_params(params) -> NormalizationSpec:
    p = dict(params)
    try:
        if p["norm"] == "layer_norm":
            norm = LayerNorm(p["eps"], p["weight"], p["bias"], p["weight_dtype"], p["bias_dtype"])
        elif p["norm"] == "rms_norm":
            norm = RmsNorm(p["eps"], p["weight"], p["weight_dtype"])
        else:
            raise LoweringError(f"normalization kernel: norm {p['norm']!r} is not layer_norm "
                                "or rms_norm")
        return NormalizationSpec(
            p["rows"], p["hidden"], norm, p["input_dtype"], p["output_dtype"],
            _ops_from_text(p["prologue"], "prologue"), _ops_from_text(p["epilogue"], "epilogue"),
            p["alignment"], p.get("threads_per_row"), p.get("batch"), p.get("rows_per_block"),
            p.get("param_cache"), p.get("prefetch"), p.get("x_staged"), p.get("stages"),
            p.get("one_pass"), p.get("l2_hint"), p.get("packed"), p.get("x_bulk"),
            p.get("shared_param_bytes"), p.get("vector_width"), p.get("blocks_per_sm"),
            p.get("shared_row"), envelope=p.get("envelope"), cluster=p.get("cluster"))
    except KeyError as e:
        raise LoweringError(f"normalization kernel: parameter {e.args[0]!r} is missing") from None
