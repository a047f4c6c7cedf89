"""TMA descriptors (CUtensorMap) for the wgmma kernels that load by TMA.

`cuTensorMapEncodeTiled` is a host-only driver call (no launch, no copy): we reach it
through ctypes from libcuda, the library torch and CuPy already loaded. The maps of a
launch (A's, B's, and C's where the kernel stores C by TMA; 128 bytes each) are kernel
arguments by value (`__grid_constant__`): nothing is copied to the device, and a launch
under stream capture records them with its other arguments. Each map is cached by
everything it encodes (pointer, shape, stride, box), so a steady loop encodes nothing.

Example:
    >>> map_a, map_b = tensor_maps(spec, a, b, M, N, K)     # doctest: +SKIP
"""

from __future__ import annotations

import collections
import ctypes
import threading

from lowering.kernels.matmul import C_BOX, TENSOR_MAP_BYTES, MatmulSpec

# Enum values of cuda.h (CUtensorMapDataType, ...Interleave, ...Swizzle, ...L2promotion,
# ...FloatOOBfill).
DATA_TYPE = {"fp16": 6, "bf16": 9}
INTERLEAVE_NONE = 0
SWIZZLE_128B = 3
L2_PROMOTION_256B = 3
L2_PROMOTION_128B = 2
OOB_FILL_ZERO = 0
CACHE_ENTRIES = 1024  # maps (128 bytes each)

_LIB = None
_CACHE: "collections.OrderedDict[tuple, object]" = collections.OrderedDict()
_LOCK = threading.Lock()


def _encode_fn():
    global _LIB
    if _LIB is None:
        lib = ctypes.CDLL("libcuda.so.1")
        fn = lib.cuTensorMapEncodeTiled
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p,
                       ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64),
                       ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint32),
                       ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
        _LIB = fn
    return _LIB


def encode_2d(ptr: int, dtype: str, inner: int, outer: int, row_bytes: int,
              box_inner: int, box_outer: int) -> bytes:
    """The 128 bytes of a CUtensorMap over a row-major [outer, inner] matrix.

    Boxes of box_outer rows x box_inner elements land in shared memory in the 128-byte
    swizzle layout (the wgmma operand layout); out-of-bounds elements read as zero.
    """
    buf = ctypes.create_string_buffer(TENSOR_MAP_BYTES + 64)  # the map wants 64-byte alignment
    addr = ctypes.addressof(buf)
    aligned = (addr + 63) & ~63
    dims = (ctypes.c_uint64 * 2)(inner, outer)
    strides = (ctypes.c_uint64 * 1)(row_bytes)
    box = (ctypes.c_uint32 * 2)(box_inner, box_outer)
    elem = (ctypes.c_uint32 * 2)(1, 1)
    # rows that do not start on 128-byte lines: each box row spans two lines, and L2's
    # 256-byte promotion fetches past what the neighbouring boxes reuse (128-byte: 0.62
    # -> 0.73 of cuBLAS at 4000x7000x5000, 0.68 -> 0.83 at 8192x8192x8200 on the H200)
    promotion = L2_PROMOTION_256B if row_bytes % 128 == 0 else L2_PROMOTION_128B
    rc = _encode_fn()(aligned, DATA_TYPE[dtype], 2, ptr, dims, strides, box, elem,
                      INTERLEAVE_NONE, SWIZZLE_128B, promotion, OOB_FILL_ZERO)
    if rc != 0:
        raise RuntimeError(f"cuTensorMapEncodeTiled failed with CUresult {rc} (pointer "
                           f"{ptr:#x}, dims {inner}x{outer}, row {row_bytes} B, box "
                           f"{box_inner}x{box_outer}, {dtype})")
    return ctypes.string_at(aligned, TENSOR_MAP_BYTES)


def c_map_ok(spec: MatmulSpec, out) -> bool:
    """Whether a launch of `spec` stores C by TMA (`MatmulSpec.c_staged`): the map needs a
    16-byte aligned base and row pitch, rows contiguous."""
    esize = out.element_size()
    return (spec.c_staged and out.data_ptr() % 16 == 0 and out.stride(1) == 1
            and out.stride(0) * esize % 16 == 0)


MapArg = ctypes.c_uint64 * (TENSOR_MAP_BYTES // 8)  # a map as a launch argument, by value
_NO_MAP = MapArg()  # the persistent kernel's map_c where C is stored from registers


def _map(ptr: int, dtype: str, inner: int, outer: int, row_bytes: int, box_inner: int,
         box_outer: int) -> MapArg:
    """`encode_2d`'s map of these arguments as a launch argument, cached by them (encoding
    is a driver call)."""
    key = (ptr, dtype, inner, outer, row_bytes, box_inner, box_outer)
    with _LOCK:
        hit = _CACHE.get(key)
        if hit is not None:
            _CACHE.move_to_end(key)
            return hit
    arg = MapArg.from_buffer_copy(encode_2d(*key))
    with _LOCK:
        _CACHE[key] = arg
        while len(_CACHE) > CACHE_ENTRIES:
            _CACHE.popitem(last=False)
    return arg


def tensor_maps(spec: MatmulSpec, a, b, M: int, N: int, K: int, out=None) -> tuple:
    """The maps of a TN launch of `spec`, as its arguments: A's and B's; for the persistent
    feed also C's where ``out`` is given (see `c_map_ok`: boxes of C_BOX x C_BOX, 128-byte
    swizzle), else an empty one it does not read."""
    esize = a.element_size()
    maps = (_map(a.data_ptr(), spec.a_dtype, K, M, a.stride(0) * esize, spec.tile_k, spec.tile_m),
            # a cluster CTA loads its share of B
            _map(b.data_ptr(), spec.a_dtype, K, N, b.stride(0) * esize, spec.tile_k,
                 spec.tile_n // spec.cluster_m))
    if not spec.persistent:
        return maps
    if out is None:
        return maps + (_NO_MAP,)
    return maps + (_map(out.data_ptr(), spec.out_dtype, N, M, out.stride(0) * out.element_size(),
                        C_BOX, C_BOX),)
