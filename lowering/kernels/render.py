"""A small CUDA C++ renderer: named snippets in a table, and a class that assembles them.

Generated kernels include no header at all. 16-bit floats are carried as raw
`unsigned short` bits and converted with one PTX instruction each, so NVRTC needs no
include path (CI's wheel and the GPU machines ship headers in different places) and the
source text depends on nothing but the spec. That keeps the kernel cache key honest.

Example:
    >>> r = Renderer()
    >>> src = r.source(["convert"], r.constants({"N": 4}),
    ...                r.kernel("scale", [("float*", "x")], "x[threadIdx.x] *= 2.f;"))
    >>> "extern \\"C\\" __global__ void scale(float* x)" in src
    True
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Mapping, Sequence

# Storage type of each dtype in device code (bits, not arithmetic types).
C_TYPES: dict[str, str] = {"bf16": "unsigned short", "fp16": "unsigned short", "fp32": "float"}

# Bytes per element.
DTYPE_BYTES: dict[str, int] = {"bf16": 2, "fp16": 2, "fp32": 4}

# Name of the device function that converts one element to / from float.
TO_FLOAT: dict[str, str] = {"bf16": "bf16_to_f32", "fp16": "f16_to_f32", "fp32": "f32_to_f32"}
FROM_FLOAT: dict[str, str] = {"bf16": "f32_to_bf16", "fp16": "f32_to_f16", "fp32": "f32_to_f32"}
# Packs two floats into one 32-bit word of two 16-bit values (low half = first).
PACK2: dict[str, str] = {"bf16": "pack_bf16x2", "fp16": "pack_f16x2"}
# And back: one word to two floats.
UNPACK2: dict[str, str] = {"bf16": "unpack_bf16x2", "fp16": "unpack_f16x2"}

# Snippets shared by every generated kernel. Each is self-contained device code.
SNIPPETS: dict[str, str] = {
    "convert": r"""
// 16-bit floats travel as raw bits; one PTX instruction converts each way.
__device__ __forceinline__ float bf16_to_f32(unsigned short x) {
  return __uint_as_float(((unsigned int)x) << 16);
}
__device__ __forceinline__ float f16_to_f32(unsigned short x) {
  float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x)); return f;
}
__device__ __forceinline__ float f32_to_f32(float x) { return x; }
__device__ __forceinline__ unsigned short f32_to_bf16(float x) {
  unsigned short h; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(x)); return h;
}
__device__ __forceinline__ unsigned short f32_to_f16(float x) {
  unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x)); return h;
}
__device__ __forceinline__ unsigned int pack_bf16x2(float lo, float hi) {
  unsigned int r; asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo)); return r;
}
__device__ __forceinline__ unsigned int pack_f16x2(float lo, float hi) {
  unsigned int r; asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo)); return r;
}
// One 32-bit word of two 16-bit values to two floats (low half = first), one instruction
// each: taking the halves out one at a time costs a byte permute more for the high one.
__device__ __forceinline__ void unpack_bf16x2(unsigned int w, float& lo, float& hi) {
  lo = __uint_as_float(w << 16); hi = __uint_as_float(w & 0xffff0000u);
}
__device__ __forceinline__ void unpack_f16x2(unsigned int w, float& lo, float& hi) {
  asm("{.reg .f16 l, h; mov.b32 {l, h}, %2; cvt.f32.f16 %0, l; cvt.f32.f16 %1, h;}"
      : "=f"(lo), "=f"(hi) : "r"(w));
}
""",
    "min_max": r"""
__device__ __forceinline__ int imin(int a, int b) { return a < b ? a : b; }
__device__ __forceinline__ int imax(int a, int b) { return a > b ? a : b; }
""",
}


@dataclasses.dataclass(frozen=True, slots=True)
class Renderer:
    """Assembles CUDA C++ from snippet tables; one instance per target family.

    `extra` holds a caller's own snippets (e.g. the matmul's PTX wrappers) so that all
    device code of a module still comes from one table.
    """

    extra: Mapping[str, str] = dataclasses.field(default_factory=dict)
    launch_bounds: bool = True

    def snippet(self, name: str) -> str:
        if name in self.extra:
            return self.extra[name]
        if name in SNIPPETS:
            return SNIPPETS[name]
        raise KeyError(f"unknown snippet {name!r}; known: {sorted({**SNIPPETS, **self.extra})}")

    @staticmethod
    def ctype(dtype: str) -> str:
        try:
            return C_TYPES[dtype]
        except KeyError:
            raise ValueError(f"dtype {dtype!r} has no C type; expected one of {sorted(C_TYPES)}")

    @staticmethod
    def constants(values: Mapping[str, int | bool]) -> str:
        """`constexpr` definitions, one a line, in the given order."""
        lines = []
        for name, value in values.items():
            if isinstance(value, bool):
                lines.append(f"constexpr bool {name} = {'true' if value else 'false'};")
            else:
                lines.append(f"constexpr int {name} = {int(value)};")
        return "\n".join(lines)

    @staticmethod
    def typedefs(values: Mapping[str, str]) -> str:
        """`typedef` of each alias to the storage type of a dtype."""
        return "\n".join(f"typedef {Renderer.ctype(d)} {alias};" for alias, d in values.items())

    def kernel(self, name: str, params: Sequence[tuple[str, str]], body: str,
               threads: int | None = None, cluster: int = 1) -> str:
        """One `extern "C"` kernel (unmangled, so its name is the name we asked for);
        `cluster` > 1: compiled-in thread-block clusters of that many CTAs along x."""
        bounds = f"__launch_bounds__({threads}) " if (threads and self.launch_bounds) else ""
        if cluster > 1:
            bounds = f"__cluster_dims__({cluster}, 1, 1) " + bounds
        args = ", ".join(f"{t} {n}" for t, n in params)
        return f'extern "C" __global__ void {bounds}{name}({args}) {{\n{body.strip()}\n}}\n'

    def source(self, snippets: Iterable[str], *parts: str) -> str:
        """The whole translation unit: named snippets first, then the given parts."""
        chunks = [self.snippet(s).strip() for s in snippets]
        chunks += [p.strip() for p in parts if p.strip()]
        return "\n\n".join(chunks) + "\n"
