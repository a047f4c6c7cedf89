"""TMA descriptors (CUtensorMap) for the wgmma kernels that load by TMA.

`cuTensorMapEncodeTiled` is a host-only driver call (no launch, no copy): we reach it
through ctypes from libcuda, the library torch and CuPy already loaded. The maps of a
launch (A's, then B's, then C's where the kernel stores C by TMA; 128 bytes each) live in
a small device buffer whose address is the kernel's `tmaps` argument; buffers are cached by everything a map encodes (pointers,
shapes, strides, box), so a steady loop over the same tensors copies nothing.

Example:
    >>> ptr = tensor_maps(spec, a, b, M, N, K)     # doctest: +SKIP
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
OOB_FILL_ZERO = 0
CACHE_ENTRIES = 256

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
    rc = _encode_fn()(aligned, DATA_TYPE[dtype], 2, ptr, dims, strides, box, elem,
                      INTERLEAVE_NONE, SWIZZLE_128B, L2_PROMOTION_256B, OOB_FILL_ZERO)
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


def tensor_maps(spec: MatmulSpec, a, b, M: int, N: int, K: int,
                device_index: int | None = None, out=None) -> int:
    """Device address of [A's map, B's map] for a TN launch of `spec` (cached), then C's
    where ``out`` is given (see `c_map_ok`): boxes of C_BOX x C_BOX, 128-byte swizzle."""
    import torch

    dev = a.get_device() if device_index is None else device_index
    key = (dev, spec.a_dtype, a.data_ptr(), b.data_ptr(), M, N, K, a.stride(0),
           b.stride(0), spec.tile_m, spec.tile_n, spec.tile_k, spec.cluster_m)
    if out is not None:
        key += (spec.out_dtype, out.data_ptr(), out.stride(0))
    with _LOCK:
        hit = _CACHE.get(key)
        if hit is not None:
            _CACHE.move_to_end(key)
            return hit[1]
    esize = a.element_size()
    blob = (encode_2d(a.data_ptr(), spec.a_dtype, K, M, a.stride(0) * esize, spec.tile_k,
                      spec.tile_m) +
            encode_2d(b.data_ptr(), spec.a_dtype, K, N, b.stride(0) * esize, spec.tile_k,
                      spec.tile_n // spec.cluster_m))  # a cluster CTA loads its share of B
    if out is not None:
        blob += encode_2d(out.data_ptr(), spec.out_dtype, N, M, out.stride(0) * out.element_size(),
                          C_BOX, C_BOX)
    host = torch.frombuffer(bytearray(blob), dtype=torch.uint8)
    # Ordered on the current stream before the kernel that reads it.
    buf = host.to(a.device)
    with _LOCK:
        _CACHE[key] = (buf, buf.data_ptr())
        while len(_CACHE) > CACHE_ENTRIES:
            _CACHE.popitem(last=False)
    return buf.data_ptr()
