"""The rotary position embedding of a fused QKV projection's output, one kernel each way.

A Llama block's ``qkv [T, (hq + 2 hkv) d]`` (this rank's query heads, then its kv heads' K
and V, each head ``d`` wide) becomes ``q [T, hq, d]`` and ``k [T, hkv, d]`` rotated by
position (the rotate-half form: ``x1 c - x2 s``, ``x2 c + x1 s`` for the head's two halves,
``c, s`` of the token's angles) and ``v [T, hkv, d]`` copied, in one pass. The backward
is the same pass with ``-s`` (a rotation's inverse), reading ``dq, dk, dv`` and writing
``d_qkv``: the gradients of the three split views and the rotation land in one tensor
(no cat, no accumulation). In torch that is ~9 kernels forward and ~14 backward
(slices, negations, cats and multiplies over strided views, then adds).

The angles' ``cos`` and ``sin`` are read from the ``[T, d]`` tables the block keeps
(`hostir.nn.transformer.rotary_tables`, in the activations' dtype, as the reference
uses them); the two halves of a row of a table are equal, so only the first is read.
Arithmetic is float32, one rounding a value.

Example:
    >>> spec = RotarySpec("bf16", head_dim=128, vector=8, backward=False)
    >>> "rotary_fwd_bf16_d128_v8" in render(spec)
    True
"""

from __future__ import annotations

import dataclasses

from hostir.errors import LoweringError
from lowering.kernels import seams_templates as T
from lowering.kernels.render import FROM_FLOAT, PACK2, TO_FLOAT, Renderer

DTYPES = ("bf16", "fp16")
THREADS = 256

_BODY = r"""
dependent_launch_entry();
// Item = (token, head, vector of the head's first half); heads [0, HQ) are q, then HKV
// of k, then HKV of v. The fused side is qkv / d_qkv (row pitch fused_pitch); the split
// side is q, k, v / dq, dk, dv, each [T, heads * D] contiguous.
const int heads = hq + 2 * hkv;
const long long per_token = (long long)heads * HALF_VECS;
const long long items = tokens * per_token;
const long long stride = (long long)gridDim.x * blockDim.x;
for (long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x; j < items; j += stride) {
  const long long t = j / per_token;
  const int rem = (int)(j - t * per_token);
  const int head = rem / HALF_VECS;
  const int c = (rem - head * HALF_VECS) * V;  // column in the head's first half
  int seg, local, seg_heads;
  if (head < hq) { seg = 0; local = head; seg_heads = hq; }
  else if (head < hq + hkv) { seg = 1; local = head - hq; seg_heads = hkv; }
  else { seg = 2; local = head - hq - hkv; seg_heads = hkv; }
  unsigned short* split = seg == 0 ? s0 : (seg == 1 ? s1 : s2);
  const long long f = t * fused_pitch + (long long)head * D + c;
  const long long s = t * ((long long)seg_heads * D) + (long long)local * D + c;
  const unsigned short* src = BACKWARD ? split : fused;
  unsigned short* dst = BACKWARD ? fused : split;
  const long long src_at = BACKWARD ? s : f, dst_at = BACKWARD ? f : s;
  float x1[V], x2[V];
  load_vec<V>(src + src_at, x1);
  load_vec<V>(src + src_at + D / 2, x2);
  if (seg < 2) {
    float cs[V], sn[V];
    load_vec<V>(cos_table + t * D + c, cs);
    load_vec<V>(sin_table + t * D + c, sn);
#pragma unroll
    for (int i = 0; i < V; ++i) {
      const float a = x1[i], b = x2[i], sv = SIGN sn[i];
      x1[i] = a * cs[i] - b * sv;
      x2[i] = b * cs[i] + a * sv;
    }
  }
  store_vec<V>(dst + dst_at, x1);
  store_vec<V>(dst + dst_at + D / 2, x2);
}
"""


@dataclasses.dataclass(frozen=True)
class RotarySpec:
    """One rotary kernel: ``dtype``, the head width ``head_dim`` (even), values a vector
    access moves (``vector``: 8, 4, 2 or 1, dividing ``head_dim / 2``), direction."""

    dtype: str
    head_dim: int
    vector: int
    backward: bool

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise LoweringError(f"rotary kernel: dtype {self.dtype!r}; expected one of {DTYPES}")
        if self.head_dim < 2 or self.head_dim % 2:
            raise LoweringError(f"rotary kernel: head_dim={self.head_dim}; expected a positive "
                                "even width")
        if self.vector not in (1, 2, 4, 8) or (self.head_dim // 2) % self.vector:
            raise LoweringError(f"rotary kernel: vector={self.vector} does not divide half of "
                                f"head_dim={self.head_dim}")

    @property
    def kernel_name(self) -> str:
        way = "bwd" if self.backward else "fwd"
        return f"rotary_{way}_{self.dtype}_d{self.head_dim}_v{self.vector}"

    def params(self) -> list[tuple[str, str]]:
        # fused (qkv) is read forward and written backward; the split side the other way
        return [("unsigned short*", "fused"), ("unsigned short*", "s0"), ("unsigned short*", "s1"),
                ("unsigned short*", "s2"), ("const unsigned short*", "cos_table"),
                ("const unsigned short*", "sin_table"), ("long long", "tokens"),
                ("int", "hq"), ("int", "hkv"), ("long long", "fused_pitch")]

    def bytes_moved(self, tokens: int, hq: int, hkv: int) -> int:
        """Reads and writes of one call: every qkv value once each way, plus the tables'
        first halves for the rotated heads' tokens."""
        values = tokens * (hq + 2 * hkv) * self.head_dim
        return 2 * (2 * values + 2 * tokens * self.head_dim // 2)


def vector_width(head_dim: int, alignment: int = 16) -> int:
    """The widest access (values of 2 bytes) that divides half a head and the tensors'
    common byte alignment."""
    for v in (8, 4, 2, 1):
        if (head_dim // 2) % v == 0 and alignment % (2 * v) == 0:
            return v
    return 1


_RENDERER = Renderer()


def render(spec: RotarySpec) -> str:
    """The CUDA C++ translation unit of ``spec``."""
    r = _RENDERER
    functions = (T.DTYPE_FUNCTIONS.replace("@TO@", TO_FLOAT[spec.dtype])
                 .replace("@FROM@", FROM_FLOAT[spec.dtype]).replace("@PACK@", PACK2[spec.dtype])
                 .replace("@UNPACK@", T.UNPACK2[spec.dtype]))
    body = _BODY.replace("SIGN", "-" if spec.backward else "")
    return r.source(["convert"], functions,
                    r.constants({"D": spec.head_dim, "V": spec.vector,
                                 "HALF_VECS": spec.head_dim // 2 // spec.vector,
                                 "BACKWARD": spec.backward}),
                    T.DEPENDENT_ENTRY, T.VEC_IO,
                    r.kernel(spec.kernel_name, spec.params(), body, threads=THREADS))


def every_variant(head_dim: int, dtype: str = "bf16") -> list[RotarySpec]:
    """Both directions at every vector width the head allows: what tests and warm-up compile."""
    return [RotarySpec(dtype, head_dim, v, b) for v in (8, 4, 2, 1)
            if (head_dim // 2) % v == 0 for b in (False, True)]
