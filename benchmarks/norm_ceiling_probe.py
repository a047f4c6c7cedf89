"""Where the fused layer norm's bandwidth goes: ceilings timed beside it, in one run.

Per hidden size (rows 8192, fp16), side by side in carryover-balanced rounds of
CUDA-graph replays (input sets rotated past the L2, as in the layer_norm bench):

- ``memcpy``: torch ``copy_`` (cudaMemcpyAsync device to device), the bench's baseline;
- ``vcopy`` / ``vcopy_cs``: a plain grid-stride copy kernel, 16-byte vectors, four in
  flight a thread, 2048 threads an SM (default cache operators / ``__ldcs``+``__stcs``);
- ``rowcopy``: the persistent kernel's shape without its math: blocks grid-striding
  over rows, each thread a slice of ``batch`` vectors, the next row prefetched in
  registers; ``rowcopy_bar``: the same with two block reductions a row (the
  statistics' barriers), the stores depending on them;
- ``ours``: the planner's fused kernel;
- ``ours_2x`` / ``memcpy_2x``: the same at twice the rows, for the marginal rate (a
  kernel's fixed start and drain weigh half as much there).

    python benchmarks/norm_ceiling_probe.py --out probe.json
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

def _copy_sources() -> str:
    """The bench's SM copy (``hostir_sm_copy``, reported as ``vcopy``) and its twin with
    streaming loads and stores (``vcopy_cs``), made from its text."""
    from hostir.jobs.layer_norm import SM_COPY_SOURCE

    cs = SM_COPY_SOURCE
    for old, new in (("hostir_sm_copy", "vcopy_cs"), ("v[u] = s[i]", "v[u] = __ldcs(s + i)"),
                     ("d[i] = v[u]", "__stcs(d + i, v[u])")):
        if old not in cs:
            raise AssertionError(f"SM_COPY_SOURCE changed: no {old!r} in it")
        cs = cs.replace(old, new)
    return SM_COPY_SOURCE + cs


SOURCE = r"""
__device__ __forceinline__ float block_sum(float v, float* part, int nwarps) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  v = (threadIdx.x & 31) < nwarps ? part[threadIdx.x & 31] : 0.f;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
// CS: streaming loads and stores (__ldcs/__stcs), else plain ones
template <bool CS> __device__ __forceinline__ uint4 ld(const uint4* p) { return CS ? __ldcs(p) : *p; }
template <bool CS> __device__ __forceinline__ void st(uint4* p, uint4 v) { if (CS) __stcs(p, v); else *p = v; }
template <int T, int B, bool BAR, bool CS = true>
__device__ __forceinline__ void rowcopy_t(const uint4* __restrict__ x, uint4* __restrict__ y,
                                          int rows, int V) {
  __shared__ float part[2][32];
  uint4 cur[B], nxt[B];
  const int lane = threadIdx.x;
  int row = blockIdx.x;
#pragma unroll
  for (int i = 0; i < B; ++i) {
    const int v = i * T + lane;
    cur[i] = make_uint4(0, 0, 0, 0);
    if (row < rows && v < V) cur[i] = ld<CS>(x + (size_t)row * V + v);
  }
#pragma unroll 1
  for (; row < rows; row += gridDim.x) {
    const int next = row + gridDim.x;
#pragma unroll
    for (int i = 0; i < B; ++i) {
      const int v = i * T + lane;
      nxt[i] = make_uint4(0, 0, 0, 0);
      if (next < rows && v < V) nxt[i] = ld<CS>(x + (size_t)next * V + v);
    }
    unsigned flip = 0;
    if (BAR) {
      float s = 0.f;
#pragma unroll
      for (int i = 0; i < B; ++i)
        s += __uint_as_float(cur[i].x & 0x3fffffffu) + __uint_as_float(cur[i].w & 0x3fffffffu);
      const float m = block_sum(s, part[0], T / 32);
      const float q = block_sum(s * m, part[1], T / 32);
      flip = q == -1.f ? 1u : 0u;  // never: the stores wait for both reductions
    }
#pragma unroll
    for (int i = 0; i < B; ++i) {
      const int v = i * T + lane;
      uint4 o = cur[i];
      o.x ^= flip;
      if (v < V) st<CS>(y + (size_t)row * V + v, o);
      cur[i] = nxt[i];
    }
  }
}
#define ROWCOPY(T, B) \
extern "C" __global__ void __launch_bounds__(T) rowcopy_##T##_##B(const uint4* x, uint4* y, int rows, int V) \
  { rowcopy_t<T, B, false>(x, y, rows, V); } \
extern "C" __global__ void __launch_bounds__(T) rowcopy_bar_##T##_##B(const uint4* x, uint4* y, int rows, int V) \
  { rowcopy_t<T, B, true>(x, y, rows, V); }
ROWCOPY(64, 4)
ROWCOPY(128, 4)
ROWCOPY(512, 3)
ROWCOPY(640, 4)
"""

# hidden: (threads, batch, blocks an SM) of the row copies, the planner's shapes there
ROWCOPY_SHAPES = {1600: (64, 4, 8), 4096: (128, 4, 3), 12288: (512, 3, 1), 20480: (640, 4, 1)}
NAMES = ["hostir_sm_copy", "vcopy_cs"] + [f"rowcopy{b}_{t}_{n}" for t, n, _ in ROWCOPY_SHAPES.values()
                                 for b in ("", "_bar")]


def main() -> None:
    from probe_common import parser, write_results

    ap = parser("1600,4096,12288,20480", __doc__)
    ap.add_argument("--profile", action="store_true",
                    help="launch each candidate twice eagerly, untimed, for Nsight Compute")
    a = ap.parse_args()
    from hostir.jobs.layer_norm import ROTATE_BYTES, make_inputs
    from runtime.autotune import graph_side_by_side
    from lowering.kernels.normalization import NormalizationSpec
    from runtime import jit
    from runtime import normalization as rn

    dev = torch.cuda.current_device()
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    ck = jit.compile(_copy_sources() + SOURCE, NAMES, jit.device_arch(dev))
    k = jit.load(ck, dev)
    stream = lambda: jit.current_stream_handle(dev)  # noqa: E731
    res = []
    for hidden in (int(h) for h in a.hidden.split(",")):
        row = {"hidden": hidden}
        cands = {}
        for mult, tag in ((1, ""), (2, "_2x")):
            rows = a.rows * mult
            spec = NormalizationSpec.reference_fusion(rows, hidden, 1e-5)
            sets = max(2, -(-ROTATE_BYTES // spec.bytes_moved()))
            ins = [make_inputs(rows, hidden) for _ in range(sets)]
            outs = [torch.empty_like(i[0]) for i in ins]
            named = lambda i: {"x": i[0], "b0": i[1], "b1": i[2], "weight": i[3], "bias": i[4]}  # noqa: E731
            cands["ours" + tag] = [lambda i=i, o=o, s=spec: rn.normalize(s, named(i), o)
                                   for i, o in zip(ins, outs)]
            cands["memcpy" + tag] = [lambda i=i, o=o: o.copy_(i[0]) for i, o in zip(ins, outs)]
            if mult == 1:
                row["plan"] = spec.plan.describe()
                n16 = rows * hidden * 2 // 16
                ptr = lambda t: np.uint64(t.data_ptr())  # noqa: E731
                for name, fn in (("vcopy", "hostir_sm_copy"), ("vcopy_cs", "vcopy_cs")):
                    cands[name] = [
                        lambda i=i, o=o, f=k[fn], n16=n16: f.launch_raw(
                            (sms * 8, 1, 1), (256, 1, 1), (ptr(i[0]), ptr(o), np.int64(n16)), 0, stream())
                        for i, o in zip(ins, outs)]
                shape = ROWCOPY_SHAPES.get(hidden)
                if shape and hidden % 8 == 0:
                    t, b, per_sm = shape
                    for bar in ("", "_bar"):
                        f = k[f"rowcopy{bar}_{t}_{b}"]
                        cands["rowcopy" + bar] = [
                            lambda i=i, o=o, f=f, t=t, per_sm=per_sm, rows=rows, hidden=hidden: f.launch_raw(
                                (sms * per_sm, 1, 1), (t, 1, 1),
                                (ptr(i[0]), ptr(o), np.int32(rows), np.int32(hidden // 8)), 0, stream())
                            for i, o in zip(ins, outs)]
                    row["rowcopy_shape"] = {"threads": t, "batch": b, "blocks_per_sm": per_sm}
                # the copies must copy
                for name in [n for n in cands if n.startswith(("vcopy", "rowcopy"))]:
                    outs[0].zero_()
                    cands[name][0]()
                    torch.cuda.synchronize()
                    assert torch.equal(outs[0], ins[0][0]), f"{name} copied wrong at {hidden}"
        if a.profile:
            for name, calls in cands.items():
                for _ in range(2):
                    print(f"PROFILE {name} hidden={hidden}", flush=True)
                    calls[0]()
                    torch.cuda.synchronize()
            del cands, ins, outs
            continue
        us = graph_side_by_side(cands, a.reps)
        nbytes = 4 * a.rows * hidden
        row["us"] = {kk: round(v, 2) for kk, v in us.items()}
        row["gbps"] = {kk: round((2 if kk.endswith("_2x") else 1) * nbytes / (v * 1e-6) / 1e9, 1)
                       for kk, v in us.items()}
        row["over_memcpy"] = {kk: round(us["memcpy"] / v, 3) for kk, v in us.items()
                              if not kk.endswith("_2x")}
        row["ours_over_memcpy_2x"] = round(us["memcpy_2x"] / us["ours_2x"], 3)
        # the marginal rate: the second 8192 rows, ours against the copy's
        row["marginal_ours_over_memcpy"] = round(
            (us["memcpy_2x"] - us["memcpy"]) / (us["ours_2x"] - us["ours"]), 3)
        print(json.dumps(row), flush=True)
        res.append(row)
        del cands, ins, outs
        torch.cuda.empty_cache()
    if a.profile:
        return
    write_results(a.out, a.rows, a.reps, res, method=(
        "CUDA-graph replays (48 launches, input sets rotated past L2), "
        f"{a.reps}+ carryover-balanced rounds, median"))


if __name__ == "__main__":
    main()
