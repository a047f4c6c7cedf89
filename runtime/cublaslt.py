"""cuBLASLt GEMMs with a GELU epilogue, through ctypes: ``out = gelu(a @ b)`` saving the
pre-activation (``gelu_aux``) and ``out = (a @ b) * gelu'(aux)`` (``dgelu``).

Why a binding of our own: CuPy (14.x) wraps cuBLAS but not cuBLASLt; torch runs cuBLASLt
GELU epilogues only inside ``_addmm_activation`` (forward, with a bias, no pre-activation
output, no DGELU); nvmath-python (NVIDIA, ``nvmath.linalg.advanced.matmul(epilog=
GELU_AUX / DGELU)`` and ``nvmath.bindings.cublasLt``) and Transformer Engine do have them,
but neither is among the project's dependencies, and the few calls needed fit here.

    from runtime import cublaslt
    pre = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    h = torch.empty_like(pre)
    cublaslt.matmul(a, b, h, "gelu_aux", pre)    # h = gelu_tanh(a @ b), pre = a @ b
    cublaslt.matmul(dh, w, dx, "dgelu", pre)     # dx = (dh @ w) * gelu_tanh'(pre)

The GELU of cuBLASLt is the tanh approximation (``F.gelu(x, approximate="tanh")``, as
Megatron-LM and GPT-2 use); ``reference`` is the same computation in torch ops (the CPU
path of the interpreter). Operands are row-major torch tensors, bf16 or fp16, fp32
accumulation, launched on torch's current stream with a workspace from torch's caching
allocator. cuBLASLt is column-major, so ``out = a @ b`` runs as ``out^T = b^T a^T``:
its "A" is ``b`` (N x K, ld N), its "B" is ``a`` (K x M, ld K), its D (and the aux
matrix) ``out`` (N x M, ld N). Descriptors and the heuristic's algorithm are cached per
(device, shape, leading dimensions, dtype, epilogue, pointer alignments).

Every constant below is the header's (``cublasLt.h``, ``cublas_api.h``,
``library_types.h``); ``tests/unit/test_cublaslt_constants.py`` parses the header where
one is installed and checks each.
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys
import threading

import torch
import torch.nn.functional as F

from hostir.errors import ExecutionError
from runtime.jit import current_stream_handle

# cublas_api.h / library_types.h
CUBLAS_STATUS_SUCCESS = 0
CUBLAS_OP_N = 0
CUBLAS_COMPUTE_32F = 68
CUDA_R_32F = 0
CUDA_R_16F = 2
CUDA_R_16BF = 14
# cublasLt.h: cublasLtMatmulDescAttributes_t
CUBLASLT_MATMUL_DESC_TRANSA = 3
CUBLASLT_MATMUL_DESC_TRANSB = 4
CUBLASLT_MATMUL_DESC_EPILOGUE = 7
CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER = 11
CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD = 12
# cublasLtEpilogue_t
CUBLASLT_EPILOGUE_DEFAULT = 1
CUBLASLT_EPILOGUE_GELU_AUX = 160
CUBLASLT_EPILOGUE_DGELU = 192
# cublasLtMatmulPreferenceAttributes_t
CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1
CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5
CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6
CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7
CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8

EPILOGUES = {None: CUBLASLT_EPILOGUE_DEFAULT, "gelu_aux": CUBLASLT_EPILOGUE_GELU_AUX,
             "dgelu": CUBLASLT_EPILOGUE_DGELU}
_DATA_TYPES = {torch.bfloat16: CUDA_R_16BF, torch.float16: CUDA_R_16F}
MAX_WORKSPACE = 32 << 20  # what the heuristic may ask for; allocated per call, as needed
_LIBRARY_NAMES = ("libcublasLt.so.13", "libcublasLt.so.12")


class CublasLtError(ExecutionError):
    """cuBLASLt missing, refusing a call, or offering no algorithm for it."""


class NoAlgorithmError(CublasLtError):
    """The heuristic offered no algorithm for this GEMM (shape, leading dimensions,
    alignments, epilogue): the interpreter then runs torch ops instead, with a warning."""


class _HeuristicResult(ctypes.Structure):  # cublasLtMatmulHeuristicResult_t
    _fields_ = [("algo", ctypes.c_uint64 * 8), ("workspaceSize", ctypes.c_size_t),
                ("state", ctypes.c_int), ("wavesCount", ctypes.c_float),
                ("reserved", ctypes.c_int * 4)]


# ----------------------------------------------------------------------------- library


def _loaded_paths() -> list[str]:
    """cuBLASLt libraries already mapped into this process (torch's CUDA build links
    one): the same library torch uses, so no second copy of cuBLASLt is loaded."""
    try:
        with open("/proc/self/maps") as fh:
            return sorted({line.split()[-1] for line in fh if "libcublasLt.so" in line})
    except OSError:
        return []


def _candidates() -> list[str]:
    out = _loaded_paths()
    for root in [os.path.dirname(os.path.dirname(torch.__file__))] + sys.path:
        for sub in ("nvidia/cu13/lib", "nvidia/cublas/lib"):
            for name in _LIBRARY_NAMES:
                out += glob.glob(os.path.join(root, sub, name))
    return out + list(_LIBRARY_NAMES)  # the loader's own search last


_LIB = None
_LOCK = threading.Lock()


def library() -> ctypes.CDLL:
    """The loaded cuBLASLt (CublasLtError naming every place looked at if absent)."""
    global _LIB
    if _LIB is not None:
        return _LIB
    tried = []
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            tried.append(f"{path} ({e})")
            continue
        _declare(lib)
        _LIB = lib
        return lib
    raise CublasLtError("cuBLASLt not found: install torch's CUDA wheels (nvidia/cu13/lib/"
                        "libcublasLt.so.13) or the CUDA toolkit; tried " + "; ".join(tried))


def _declare(lib) -> None:
    p, i, u64, i64, sz = (ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64, ctypes.c_int64,
                          ctypes.c_size_t)
    pp = ctypes.POINTER(ctypes.c_void_p)
    sigs = {
        "cublasLtCreate": [pp],
        "cublasLtMatmulDescCreate": [pp, i, i],
        "cublasLtMatmulDescSetAttribute": [p, i, p, sz],
        "cublasLtMatrixLayoutCreate": [pp, i, u64, u64, i64],
        "cublasLtMatmulPreferenceCreate": [pp],
        "cublasLtMatmulPreferenceSetAttribute": [p, i, p, sz],
        "cublasLtMatmulAlgoGetHeuristic": [p, p, p, p, p, p, p, i,
                                           ctypes.POINTER(_HeuristicResult),
                                           ctypes.POINTER(ctypes.c_int)],
        "cublasLtMatmul": [p, p, p, p, p, p, p, p, p, p, p, p, p, p, sz, p],
    }
    for name, args in sigs.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, ctypes.c_int
    lib.cublasLtGetStatusString.argtypes, lib.cublasLtGetStatusString.restype = [i], ctypes.c_char_p


def _check(status: int, what: str) -> None:
    if status != CUBLAS_STATUS_SUCCESS:
        name = _LIB.cublasLtGetStatusString(status).decode() if _LIB is not None else "?"
        raise CublasLtError(f"cuBLASLt {what}: status {status} ({name})")


def available() -> bool:
    try:
        library()
        return True
    except CublasLtError:
        return False


# ----------------------------------------------------------------------------- plans


_HANDLES: dict[int, ctypes.c_void_p] = {}
_PLANS: dict[tuple, "_Plan"] = {}


def _handle(device: int) -> ctypes.c_void_p:
    h = _HANDLES.get(device)
    if h is None:
        h = ctypes.c_void_p()
        with torch.cuda.device(device):
            _check(library().cublasLtCreate(ctypes.byref(h)), "cublasLtCreate")
        _HANDLES[device] = h
    return h


def _alignment(ptr: int) -> int:
    """The largest power of two up to 256 that divides ``ptr`` (the heuristic assumes 256
    unless told, and an algorithm chosen for 256 may refuse a less aligned operand)."""
    a = 1
    while a < 256 and ptr % (a * 2) == 0:
        a *= 2
    return a


def _set(fn, obj, attr: int, value) -> None:
    _check(fn(obj, attr, ctypes.byref(value), ctypes.sizeof(value)), f"set attribute {attr}")


class _Plan:
    """Descriptors, layouts and the heuristic's best algorithm for one GEMM shape."""

    def __init__(self, key):
        device, m, n, k, lda, ldb, ldo, dtype, epilogue, aligns, aux_ptr = key[:11]
        lib, dt = library(), _DATA_TYPES[dtype]
        self.desc = ctypes.c_void_p()
        _check(lib.cublasLtMatmulDescCreate(ctypes.byref(self.desc), CUBLAS_COMPUTE_32F,
                                            CUDA_R_32F), "cublasLtMatmulDescCreate")
        for attr in (CUBLASLT_MATMUL_DESC_TRANSA, CUBLASLT_MATMUL_DESC_TRANSB):
            _set(lib.cublasLtMatmulDescSetAttribute, self.desc, attr, ctypes.c_int32(CUBLAS_OP_N))
        _set(lib.cublasLtMatmulDescSetAttribute, self.desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
             ctypes.c_int32(EPILOGUES[epilogue]))
        self.epilogue = epilogue
        if epilogue is not None:
            _set(lib.cublasLtMatmulDescSetAttribute, self.desc,
                 CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, ctypes.c_int64(ldo))
            self.set_aux(aux_ptr)  # the heuristic reads its alignment
        # column-major view: "A" = b (n x k, ld ldb), "B" = a (k x m, ld lda), D = out (n x m)
        self.layouts = []
        for rows, cols, ld in ((n, k, ldb), (k, m, lda), (n, m, ldo)):
            layout = ctypes.c_void_p()
            _check(lib.cublasLtMatrixLayoutCreate(ctypes.byref(layout), dt, rows, cols, ld),
                   "cublasLtMatrixLayoutCreate")
            self.layouts.append(layout)
        pref = ctypes.c_void_p()
        _check(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "cublasLtMatmulPreferenceCreate")
        setp = lib.cublasLtMatmulPreferenceSetAttribute
        _set(setp, pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, ctypes.c_uint64(MAX_WORKSPACE))
        a_al, b_al, o_al = aligns[:3]  # (the aux alignment is the 4th) cuBLASLt's A is our b, its B our a, C = D our out
        for attr, al in ((CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, b_al),
                         (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, a_al),
                         (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, o_al),
                         (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, o_al)):
            _set(setp, pref, attr, ctypes.c_uint32(al))
        self.result = _HeuristicResult()
        count = ctypes.c_int(0)
        a_l, b_l, d_l = self.layouts
        _check(lib.cublasLtMatmulAlgoGetHeuristic(_handle(device), self.desc, a_l, b_l, d_l, d_l,
                                                  pref, 1, ctypes.byref(self.result),
                                                  ctypes.byref(count)),
               f"cublasLtMatmulAlgoGetHeuristic for {_describe(key)}")
        if count.value < 1 or self.result.state != CUBLAS_STATUS_SUCCESS:
            raise NoAlgorithmError(f"cuBLASLt has no algorithm for {_describe(key)}")
        self.handle = _handle(device)

    def set_aux(self, ptr: int) -> None:
        _set(library().cublasLtMatmulDescSetAttribute, self.desc,
             CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, ctypes.c_void_p(ptr))


def _describe(key) -> str:
    device, m, n, k, lda, ldb, ldo, dtype, epilogue, aligns = key[:10]
    return (f"{m}x{k} @ {k}x{n} ({str(dtype).replace('torch.', '')}, epilogue "
            f"{epilogue or 'none'}, lda={lda} ldb={ldb} ldout={ldo}, alignments a/b/out/aux "
            f"{'/'.join(map(str, aligns))} bytes, cuda:{device})")


def unsupported(a, b, out, epilogue=None, aux=None) -> str | None:
    """Why this call cannot go to cuBLASLt, or None: CUDA bf16/fp16 2-D operands of one
    dtype and device, rows contiguous (stride 1 along the last axis), an aux of out's
    shape and strides, and N a multiple of 8 (cuBLASLt's rule for the aux matrix's
    leading dimension)."""
    ts = [a, b, out] + ([aux] if aux is not None else [])
    if epilogue not in EPILOGUES:
        return f"unknown epilogue {epilogue!r}: expected one of {sorted(filter(None, EPILOGUES))}"
    if (epilogue is None) != (aux is None):
        return f"epilogue {epilogue or 'none'} {'needs' if aux is None else 'takes no'} aux tensor"
    if not all(t.is_cuda for t in ts) or len({t.device for t in ts}) != 1:
        return "operands must be on one CUDA device"
    if not all(t.dtype is a.dtype for t in ts) or a.dtype not in _DATA_TYPES:
        return f"operands must all be bfloat16 or float16, got {[str(t.dtype) for t in ts]}"
    if not all(t.dim() == 2 and t.stride(1) == 1 for t in ts):
        return "operands must be 2-D with contiguous rows"
    m, k = a.shape
    if b.shape[0] != k or tuple(out.shape) != (m, b.shape[1]):
        return f"shapes do not multiply: {list(a.shape)} @ {list(b.shape)} -> {list(out.shape)}"
    if aux is not None and (aux.shape != out.shape or aux.stride() != out.stride()):
        return f"aux {list(aux.shape)} strides {aux.stride()} differ from out's"
    if aux is not None and out.stride(0) % 8:
        return f"the aux leading dimension {out.stride(0)} is not a multiple of 8"
    return None


def matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, epilogue: str | None = None,
           aux: torch.Tensor | None = None) -> torch.Tensor:
    """``out = a @ b`` with ``epilogue`` (None, ``gelu_aux``: out = gelu_tanh(a @ b) and
    aux = a @ b; ``dgelu``: out = (a @ b) * gelu_tanh'(aux)) on the current stream."""
    why = unsupported(a, b, out, epilogue, aux)
    if why is not None:
        raise CublasLtError(f"cuBLASLt matmul: {why}")
    m, k = a.shape
    n = b.shape[1]
    device = a.device.index if a.device.index is not None else torch.cuda.current_device()
    aux_ptr = aux.data_ptr() if aux is not None else 0
    aligns = tuple(_alignment(t.data_ptr()) for t in (a, b, out)) + (
        (_alignment(aux_ptr),) if aux is not None else ())
    key = (device, m, n, k, a.stride(0), b.stride(0), out.stride(0), a.dtype, epilogue, aligns)
    plan = _PLANS.get(key)
    if plan is None:
        with _LOCK:
            plan = _PLANS.get(key) or _PLANS.setdefault(key, _Plan(key + (aux_ptr,)))
    if aux is not None:
        plan.set_aux(aux_ptr)  # read when the call is enqueued, so per call is safe
    ws_size = plan.result.workspaceSize
    ws = torch.empty(ws_size, dtype=torch.uint8, device=a.device) if ws_size else None
    alpha, beta = ctypes.c_float(1.0), ctypes.c_float(0.0)
    a_l, b_l, d_l = plan.layouts
    stream = current_stream_handle(a.get_device())
    _check(library().cublasLtMatmul(
        plan.handle, plan.desc, ctypes.byref(alpha), b.data_ptr(), a_l, a.data_ptr(), b_l,
        ctypes.byref(beta), out.data_ptr(), d_l, out.data_ptr(), d_l,
        ctypes.byref(plan.result.algo), ws.data_ptr() if ws is not None else None, ws_size,
        stream), f"cublasLtMatmul for {_describe(key)}")
    return out


def reference(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, epilogue: str | None = None,
              aux: torch.Tensor | None = None) -> torch.Tensor:
    """The same computation in torch ops, on any device and dtype (the CPU path, and the
    fallback for shapes cuBLASLt cannot take): the product rounds to out's dtype, then the
    epilogue runs on it."""
    if epilogue is None:
        return torch.matmul(a, b, out=out)
    if epilogue == "gelu_aux":
        torch.matmul(a, b, out=aux)
        out.copy_(F.gelu(aux, approximate="tanh"))
    elif epilogue == "dgelu":
        out.copy_(torch.ops.aten.gelu_backward(torch.matmul(a, b), aux, approximate="tanh"))
    else:
        raise CublasLtError(f"unknown epilogue {epilogue!r}")
    return out
