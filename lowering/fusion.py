"""Tensor-level definitions: the user's side of the lowering.

A ``Fusion`` holds tensors (``TensorView``) and the ops between them. Axes are split and
parallelized in place, in nvFuser's manner: ``DIDx`` spreads an axis over the devices of a
``DeviceMesh``, ``Stream`` makes it a pipeline of stages run on round-robin streams.

Example (the AllGather + GEMM pattern on D devices, S stages):

    >>> from lowering.fusion import Fusion, DeviceMesh, ParallelType
    >>> fd = Fusion()
    >>> a = fd.define_tensor([1024, 256], "float32")     # global [M, K]
    >>> b = fd.define_tensor([256, 512], "float32")      # [K, N], replicated
    >>> a.split(0, 2)                                    # [S, M/S, K]
    >>> a.split(1, 2)                                    # [S, D, M/(S*D), K]
    >>> a.set_mesh(DeviceMesh((0, 1)))
    >>> a.parallelize(0, ParallelType.Stream); a.parallelize(1, ParallelType.DIDx)
    >>> c = fd.matmul(a, b)                              # [S, D, M/(S*D), N]
    >>> c.parallelize(0, ParallelType.Stream)
    >>> fd.add_output(c)
"""

from __future__ import annotations

import dataclasses

from hostir.errors import LoweringError
from hostir.ir import DTYPES, MATMUL_EPILOGUES, DeviceMesh, ParallelType

__all__ = ["Fusion", "TensorView", "Op", "DeviceMesh", "ParallelType"]


class TensorView:
    """A tensor of a fusion: a logical shape whose axes can be split and parallelized."""

    def __init__(self, fusion: "Fusion", name: str, shape, dtype: str):
        if dtype not in DTYPES:
            raise LoweringError(f"tensor {name}: dtype {dtype!r} is not one of {DTYPES}")
        shape = list(shape)
        for axis, n in enumerate(shape):
            if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
                raise LoweringError(f"tensor {name} axis {axis}: extent must be a positive int, got {n!r}")
        self.fusion = fusion
        self.name = name
        self.shape = shape
        self.dtype = dtype
        self.parallel = [ParallelType.Serial] * len(shape)
        self.mesh: DeviceMesh | None = None

    def __repr__(self) -> str:
        dims = ", ".join(
            str(n) if p is ParallelType.Serial else f"{p.value}({n})"
            for n, p in zip(self.shape, self.parallel)
        )
        return f"{self.name}: {self.dtype}[{dims}]"

    def _axis(self, axis: int) -> int:
        if not isinstance(axis, int) or not -len(self.shape) <= axis < len(self.shape):
            raise LoweringError(
                f"tensor {self.name}: axis {axis} out of range for rank {len(self.shape)}"
            )
        return axis % len(self.shape)

    def split(self, axis: int, factor: int) -> "TensorView":
        """Split ``axis`` of extent n into [factor, n / factor] (outer split), in place."""
        axis = self._axis(axis)
        n = self.shape[axis]
        if not isinstance(factor, int) or factor <= 0:
            raise LoweringError(f"tensor {self.name} axis {axis}: split factor must be a positive int, got {factor!r}")
        if n % factor:
            raise LoweringError(
                f"tensor {self.name} axis {axis}: extent {n} is not divisible by the split "
                f"factor {factor}; expected a multiple of {factor}"
            )
        if self.parallel[axis] is not ParallelType.Serial:
            raise LoweringError(f"tensor {self.name} axis {axis}: cannot split a {self.parallel[axis].value} axis")
        self.shape[axis : axis + 1] = [factor, n // factor]
        self.parallel[axis : axis + 1] = [ParallelType.Serial, ParallelType.Serial]
        return self

    def set_mesh(self, mesh: DeviceMesh) -> "TensorView":
        if not isinstance(mesh, DeviceMesh):
            raise LoweringError(f"tensor {self.name}: expected a DeviceMesh, got {mesh!r}")
        self.mesh = mesh
        return self

    def parallelize(self, axis: int, ptype: ParallelType) -> "TensorView":
        """Mark ``axis`` as spread over devices (DIDx), stages (Stream) or neither."""
        axis = self._axis(axis)
        if not isinstance(ptype, ParallelType):
            raise LoweringError(f"tensor {self.name} axis {axis}: expected a ParallelType, got {ptype!r}")
        if ptype is not ParallelType.Serial:
            other = [i for i, p in enumerate(self.parallel) if p is ptype and i != axis]
            if other:
                raise LoweringError(
                    f"tensor {self.name} axis {axis}: axis {other[0]} is already {ptype.value}; "
                    f"expected one {ptype.value} axis at most"
                )
        self.parallel[axis] = ptype
        return self


@dataclasses.dataclass(frozen=True)
class Op:
    """One operation of a fusion: ``kind`` over ``inputs`` defining ``output``."""

    kind: str
    inputs: tuple[TensorView, ...]
    output: TensorView
    attrs: tuple[tuple[str, object], ...] = ()
    aux: "TensorView | None" = None  # a matmul epilogue's pre-activation (out or in)

    def attr(self, key: str, default=None):
        return dict(self.attrs).get(key, default)


class Fusion:
    """A tensor-level definition: inputs, ops, outputs."""

    def __init__(self):
        self.inputs: list[TensorView] = []
        self.outputs: list[TensorView] = []
        self.ops: list[Op] = []
        self._count = 0

    def _new(self, shape, dtype: str) -> TensorView:
        t = TensorView(self, f"T{self._count}", shape, dtype)
        self._count += 1
        return t

    def _own(self, t: TensorView, what: str) -> None:
        if not isinstance(t, TensorView) or t.fusion is not self:
            raise LoweringError(f"{what}: {t!r} is not a tensor of this fusion")

    def define_tensor(self, shape, dtype: str = "float32") -> TensorView:
        """An input tensor with the given global (logical) shape."""
        t = self._new(shape, dtype)
        self.inputs.append(t)
        return t

    def add_output(self, t: TensorView) -> None:
        self._own(t, "add_output")
        self.outputs.append(t)

    def matmul(self, a: TensorView, b: TensorView, epilogue: str | None = None,
               aux: TensorView | None = None):
        """``a @ b`` with ``b`` of rank 2; batch axes of ``a`` carry over to the output.

        ``epilogue="gelu_aux"`` returns ``(gelu(a @ b), a @ b)``: the output and its
        pre-activation, a second tensor of the output's shape; ``epilogue="dgelu"``
        returns ``(a @ b) * gelu'(aux)`` for an input ``aux`` of the output's shape (the
        saved pre-activation). The GELU is the tanh approximation (``ir.Matmul``). Shard
        the pre-activation as the output."""
        self._own(a, "matmul")
        self._own(b, "matmul")
        if len(b.shape) != 2 or len(a.shape) < 2:
            raise LoweringError(
                f"matmul: expected {a.name} of rank >= 2 and {b.name} of rank 2, got "
                f"{len(a.shape)} and {len(b.shape)}"
            )
        if a.shape[-1] != b.shape[0]:
            raise LoweringError(
                f"matmul: {a.name} axis {len(a.shape) - 1} (K) has extent {a.shape[-1]} but "
                f"{b.name} axis 0 has {b.shape[0]}; expected them equal"
            )
        if a.dtype != b.dtype:
            raise LoweringError(f"matmul: {a.name} is {a.dtype} but {b.name} is {b.dtype}")
        if epilogue not in (None,) + MATMUL_EPILOGUES:
            raise LoweringError(f"matmul: unknown epilogue {epilogue!r}; expected one of "
                                f"{MATMUL_EPILOGUES}")
        if (epilogue == "dgelu") != (aux is not None):
            raise LoweringError("matmul: epilogue dgelu takes aux (the saved pre-activation); "
                                f"epilogue {epilogue} takes none")
        out = self._new(a.shape[:-1] + [b.shape[1]], a.dtype)
        out.mesh = a.mesh
        attrs = (("epilogue", epilogue),) if epilogue else ()
        if epilogue == "dgelu":
            self._own(aux, "matmul")
            if aux.shape != out.shape or aux.dtype != out.dtype:
                raise LoweringError(f"matmul: aux {aux.name} is {aux.dtype}{aux.shape}, expected "
                                    f"the output's {out.dtype}{out.shape}")
        elif epilogue == "gelu_aux":
            aux = self._new(list(out.shape), out.dtype)
            aux.mesh = a.mesh
        self.ops.append(Op("matmul", (a, b), out, attrs, aux))
        return (out, aux) if epilogue == "gelu_aux" else out

    # ---- pointwise and normalization ops (lowered by the normalization pass)
    def add(self, a: TensorView, b: TensorView) -> TensorView:
        """Elementwise ``a + b``; a 1-D ``b`` broadcasts over the rows of ``a``."""
        self._own(a, "add")
        self._own(b, "add")
        if b.shape != a.shape and not (len(b.shape) == 1 and b.shape[0] == a.shape[-1]):
            raise LoweringError(
                f"add: {b.name} of shape {b.shape} neither matches {a.name} {a.shape} nor "
                f"broadcasts over its last axis (expected [{a.shape[-1]}])"
            )
        out = self._new(a.shape, "float32" if a.dtype != b.dtype else a.dtype)
        self.ops.append(Op("add", (a, b), out))
        return out

    def cast(self, a: TensorView, dtype: str) -> TensorView:
        self._own(a, "cast")
        out = self._new(a.shape, dtype)
        self.ops.append(Op("cast", (a,), out, (("dtype", dtype),)))
        return out

    def layer_norm(self, x, weight=None, bias=None, eps: float = 1e-5) -> TensorView:
        """Normalize over the last axis: (x - mean) / sqrt(var + eps) * weight + bias."""
        return self._norm("layer_norm", x, weight, bias, eps)

    def rms_norm(self, x, weight=None, eps: float = 1e-6) -> TensorView:
        """x / sqrt(mean(x^2) + eps) * weight."""
        return self._norm("rms_norm", x, weight, None, eps)

    def _norm(self, kind, x, weight, bias, eps) -> TensorView:
        self._own(x, kind)
        ins = [x]
        for what, t in (("weight", weight), ("bias", bias)):
            if t is not None:
                self._own(t, kind)
                if t.shape != [x.shape[-1]]:
                    raise LoweringError(
                        f"{kind}: {what} {t.name} has shape {t.shape}, expected [{x.shape[-1]}]"
                    )
                ins.append(t)
        out = self._new(x.shape, "float32")
        attrs = (("eps", float(eps)), ("weight", weight is not None), ("bias", bias is not None))
        self.ops.append(Op(kind, tuple(ins), out, attrs))
        return out
