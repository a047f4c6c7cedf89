"""Which way of moving bytes on the SMs comes closest to the copy engine: pure copies of
the layer-norm bench's x (rows x hidden fp16), timed side by side in one run.

The normalization target is a share of ``copy_`` (cudaMemcpyAsync device to device, a
copy-engine transfer). A fused kernel runs on the SMs, so its ceiling is the best SM
copy. This probe times, on the same bytes, in carryover-balanced rounds of CUDA-graph
replays (input sets rotated past the L2, as in the bench):

- ``memcpy``: ``copy_``, the baseline;
- ``sm_copy``: the bench's SM copy (`hostir.jobs.layer_norm.SM_COPY_SOURCE`);
- ``tma_C_S_B``: the TMA engine both ways: chunks of C bytes by ``cp.async.bulk``
  global -> shared (mbarrier) and shared -> global (bulk group), a ring of S chunks a
  block, one thread issuing, B blocks an SM;
- ``row_T_B_K[_plain]``: the persistent normalization's shape without its math
  (`norm_ceiling_probe`'s row copy, ``__ldcs``/``__stcs``, or plain ``_plain``): T
  threads a row, B vectors a thread, the next row prefetched in registers, K blocks an SM;
- ``rowtma_T_B_K``: the same, y stored by a bulk copy of the whole row from a
  double-buffered shared slice (each thread writes its vectors there, one thread issues).

    python benchmarks/copy_path_probe.py --out probe.json
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

TMA_SOURCE = r"""
__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return (unsigned)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void bar_init(unsigned long long* bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" :: "r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void bulk_load(void* dst, const void* src, unsigned bytes,
                                          unsigned long long* bar) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n"
               :: "r"(smem_addr(bar)), "r"(bytes) : "memory");
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
               :: "r"(smem_addr(dst)), "l"(src), "r"(bytes), "r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void bar_wait(unsigned long long* bar, unsigned parity) {
  asm volatile("{\n.reg .pred done;\nWAIT:\n"
               "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
               "@!done bra WAIT;\n}\n" :: "r"(smem_addr(bar)), "r"(parity) : "memory");
}
__device__ __forceinline__ void bulk_store(void* dst, const void* src, unsigned bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n"
               :: "l"(dst), "r"(smem_addr(src)), "r"(bytes) : "memory");
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" :: "n"(N) : "memory");
}
__device__ __forceinline__ void bulk_wait_all() {
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}

// Chunks c = blockIdx.x + k * gridDim.x; chunk k in slot k % S. Loads run S - 1 ahead;
// a slot is refilled once the store that read it is done reading (wait_group.read 1
// after the next store is issued).
template <int CHUNK, int S>
__device__ __forceinline__ void tma_copy_t(const char* __restrict__ src, char* __restrict__ dst,
                                           long long nchunks) {
  extern __shared__ __align__(128) unsigned char buf[];
  __shared__ __align__(8) unsigned long long bar[S];
  if (threadIdx.x != 0) return;
  for (int s = 0; s < S; ++s) bar_init(&bar[s]);
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  for (int s = 0; s < S; ++s) {
    const long long c = blockIdx.x + (long long)s * gridDim.x;
    if (c < nchunks) bulk_load(buf + s * CHUNK, src + c * CHUNK, CHUNK, &bar[s]);
  }
  for (long long k = 0;; ++k) {
    const long long c = blockIdx.x + k * gridDim.x;
    if (c >= nchunks) break;
    const int s = (int)(k % S);
    bar_wait(&bar[s], (unsigned)((k / S) & 1));
    bulk_store(dst + c * CHUNK, buf + s * CHUNK, CHUNK);
    if (k >= 1) {
      const long long r = blockIdx.x + (k - 1 + S) * gridDim.x;
      if (r < nchunks) {
        bulk_wait_read<1>();
        const int sp = (int)((k - 1) % S);
        bulk_load(buf + sp * CHUNK, src + r * CHUNK, CHUNK, &bar[sp]);
      }
    }
  }
  bulk_wait_all();
}
#define TMA(C, S) \
extern "C" __global__ void __launch_bounds__(32) tma_##C##_##S(const char* s, char* d, long long n) \
  { tma_copy_t<C, S>(s, d, n); }
TMA(4096, 8)
TMA(8192, 8)
TMA(16384, 4)
TMA(32768, 3)
TMA(65536, 3)

// The row copy with y stored by one bulk copy a row from shared memory (two buffers).
template <int T, int B>
__device__ __forceinline__ void rowtma_t(const uint4* __restrict__ x, uint4* __restrict__ y,
                                         int rows, int V) {
  extern __shared__ __align__(128) unsigned char raw[];
  uint4* ybuf = reinterpret_cast<uint4*>(raw);  // [2][T * B]
  uint4 cur[B], nxt[B];
  const int lane = threadIdx.x;
  int row = blockIdx.x, p = 0;
#pragma unroll
  for (int i = 0; i < B; ++i) {
    const int v = i * T + lane;
    cur[i] = make_uint4(0, 0, 0, 0);
    if (row < rows && v < V) cur[i] = __ldcs(x + (size_t)row * V + v);
  }
#pragma unroll 1
  for (; row < rows; row += gridDim.x) {
    const int next = row + gridDim.x;
#pragma unroll
    for (int i = 0; i < B; ++i) {
      const int v = i * T + lane;
      nxt[i] = make_uint4(0, 0, 0, 0);
      if (next < rows && v < V) nxt[i] = __ldcs(x + (size_t)next * V + v);
    }
    if (lane == 0) bulk_wait_read<1>();  // the store of two rows ago has read buffer p
    __syncthreads();
#pragma unroll
    for (int i = 0; i < B; ++i) {
      const int v = i * T + lane;
      if (v < V) ybuf[p * T * B + v] = cur[i];
      cur[i] = nxt[i];
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    if (lane == 0) bulk_store(y + (size_t)row * V, ybuf + p * T * B, V * 16);
    p ^= 1;
  }
  if (lane == 0) bulk_wait_all();
}
#define ROWTMA(T, B) \
extern "C" __global__ void __launch_bounds__(T) rowtma_##T##_##B(const uint4* x, uint4* y, int rows, int V) \
  { rowtma_t<T, B>(x, y, rows, V); }
ROWTMA(64, 4)
ROWTMA(128, 4)
ROWTMA(640, 4)

// The row copy with plain loads and stores (no streaming hints).
#define ROWPLAIN(T, B) \
extern "C" __global__ void __launch_bounds__(T) rowplain_##T##_##B(const uint4* x, uint4* y, int rows, int V) \
  { rowcopy_t<T, B, false, false>(x, y, rows, V); }
ROWPLAIN(64, 4)
ROWPLAIN(128, 4)
ROWPLAIN(640, 4)
"""

TMA_SHAPES = [(4096, 8, 6), (8192, 8, 3), (16384, 4, 3), (32768, 3, 2), (65536, 3, 1)]
# hidden: (threads, batch) of the row copies, the planner's shapes, and blocks an SM to try
ROW_SHAPES = {1600: (64, 4, (8, 16)), 4096: (128, 4, (3, 6, 12)), 20480: (640, 4, (1, 2, 3))}
ROWTMA_BLOCKS = {1600: (8, 16), 4096: (3, 6), 20480: (1, 2)}


def kernel_names() -> list[str]:
    names = [f"tma_{c}_{s}" for c, s, _ in TMA_SHAPES]
    for t, b, _ in ROW_SHAPES.values():
        names += [f"rowcopy_{t}_{b}", f"rowtma_{t}_{b}", f"rowplain_{t}_{b}"]
    return names


def source() -> str:
    from norm_ceiling_probe import SOURCE as ROWCOPY_SOURCE  # rowcopy_{64,128,640}_4
    return ROWCOPY_SOURCE + TMA_SOURCE


def main() -> None:
    from probe_common import parser, write_results

    ap = parser("1600,4096,20480", __doc__)
    a = ap.parse_args()
    from hostir.jobs.layer_norm import ROTATE_BYTES, sm_copy
    from runtime.autotune import graph_side_by_side
    from runtime import jit

    dev = torch.cuda.current_device()
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    ck = jit.compile(source(), kernel_names(), jit.device_arch(dev))
    k = jit.load(ck, dev)
    stream = lambda: jit.current_stream_handle(dev)  # noqa: E731
    ptr = lambda t: np.uint64(t.data_ptr())  # noqa: E731
    res = []
    for hidden in (int(h) for h in a.hidden.split(",")):
        rows, nbytes = a.rows, a.rows * hidden * 2
        sets = max(2, -(-ROTATE_BYTES // (2 * nbytes)))
        xs = [torch.randn(rows, hidden, device="cuda", dtype=torch.float16) for _ in range(sets)]
        ys = [torch.empty_like(t) for t in xs]
        pairs = list(zip(xs, ys))
        cands = {"memcpy": [lambda x=x, y=y: y.copy_(x) for x, y in pairs],
                 "sm_copy": [lambda x=x, y=y: sm_copy(x, y) for x, y in pairs]}
        for c, s, b in TMA_SHAPES:
            if nbytes % c:
                continue
            f = k[f"tma_{c}_{s}"]
            cands[f"tma_{c}_{s}_{b}"] = [
                lambda x=x, y=y, f=f, c=c, s=s, b=b: f.launch_raw(
                    (sms * b, 1, 1), (32, 1, 1), (ptr(x), ptr(y), np.int64(nbytes // c)), c * s, stream())
                for x, y in pairs]
        t, b, blocks = ROW_SHAPES[hidden]
        V = hidden // 8
        row_args = (np.int32(rows), np.int32(V))
        for kind, per_sm_list, smem in (("rowcopy", blocks, 0), ("rowplain", blocks, 0),
                                        ("rowtma", ROWTMA_BLOCKS[hidden], 2 * t * b * 16)):
            f = k[f"{kind}_{t}_{b}"]
            for per_sm in per_sm_list:
                cands[f"{kind}_{t}_{b}_{per_sm}"] = [
                    lambda x=x, y=y, f=f, per_sm=per_sm, smem=smem, t=t: f.launch_raw(
                        (sms * per_sm, 1, 1), (t, 1, 1), (ptr(x), ptr(y)) + row_args, smem, stream())
                    for x, y in pairs]
        # every copy must copy
        for name, calls in cands.items():
            ys[0].zero_()
            calls[0]()
            torch.cuda.synchronize()
            assert torch.equal(ys[0], xs[0]), f"{name} copied wrong at {hidden}"
        us = graph_side_by_side(cands, a.reps)
        row = {"hidden": hidden, "bytes_each_way": nbytes,
               "us": {kk: round(v, 2) for kk, v in us.items()},
               "gbps": {kk: round(2 * nbytes / (v * 1e-6) / 1e9, 1) for kk, v in us.items()},
               "over_memcpy": {kk: round(us["memcpy"] / v, 3) for kk, v in us.items()}}
        best = max((kk for kk in us if kk != "memcpy"), key=lambda kk: -us[kk])
        row["best_sm"] = best
        print(hidden, json.dumps(row["over_memcpy"]), flush=True)
        res.append(row)
        del cands, xs, ys, pairs
        torch.cuda.empty_cache()
    write_results(a.out, a.rows, a.reps, res)


if __name__ == "__main__":
    main()
