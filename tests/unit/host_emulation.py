"""A host emulation of the CUDA features the generated kernels use, for host-compiled
kernels in the unit tests: a std::thread per GPU thread, a block's and a cluster's
barriers, shared memory per CTA (filled with a pattern), cp.async and bulk copies that
land at once, mbarriers with their phases and transaction bytes, asynchronous stores
into another CTA of the cluster, warp shuffles. `HOST_PRELUDE` goes before a kernel's
source (with the shared "convert" snippet taken out), `HOST_LAUNCH` after it, its
@PARAMS@, @CLUSTER@, @SMEM@, @KERNEL@ and @ARGS@ filled in; `build` does both and
compiles."""

import ctypes
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from lowering.kernels.render import SNIPPETS

HOST_PRELUDE = r"""
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <thread>
#include <vector>
struct dim3h { unsigned x, y, z; };
struct uint4 { unsigned x, y, z, w; };
struct uint2 { unsigned x, y; };
struct float4 { float x, y, z, w; };
static float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
thread_local dim3h threadIdx, blockIdx;
static dim3h blockDim, gridDim;
thread_local int t_lane, t_warp;
thread_local std::barrier<>* g_block;
thread_local std::barrier<>* t_cluster;
thread_local unsigned char* t_smem;
thread_local unsigned char** t_cluster_smem;
thread_local unsigned t_rank;
struct WarpExchange { std::barrier<> bar{32}; float buf[32]; };
static WarpExchange* g_warps;
// the staged backward's shared memory, copies and cluster, as plain host memory: a copy
// lands at once, a cluster's CTAs run side by side and read each other's memory
#define SEAM_HOST 1
static unsigned char* seam_dynamic_smem() { return t_smem; }
static void cp_async16(void* d, const void* s) { std::memcpy(d, s, 16); }
static void cp_async4(void* d, const void* s) { std::memcpy(d, s, 4); }
static void cp_async_commit() {}
template <int N> static void cp_async_wait() {}
#define SEAM_BULK 1
static unsigned cluster_rank() { return t_rank; }
static void cluster_sync() { t_cluster->arrive_and_wait(); }
thread_local std::optional<std::barrier<>::arrival_token> t_arrival;
static void cluster_arrive() { t_arrival.emplace(t_cluster->arrive()); }
static void cluster_wait() { t_cluster->wait(std::move(*t_arrival)); t_arrival.reset(); }
// An mbarrier as one 64-bit word: pending arrivals (bits 0-7), their count (8-15), the
// pending transaction bytes (16-47, signed), the phase (48-63). Copies land at once and
// count their bytes on it as the device's complete_tx does.
static void mbar_init(void* bar) {
  std::atomic_ref<unsigned long long>(*(unsigned long long*)bar).store(0x101ull);
}
static void mbar_update(unsigned long long* word, int arrivals, long long bytes) {
  std::atomic_ref<unsigned long long> w(*word);
  unsigned long long old = w.load(), next;
  do {
    const unsigned count = (old >> 8) & 0xff;
    if ((int)(old & 0xff) < arrivals) {  // more arrivals than the phase expects
      std::fprintf(stderr, "mbarrier: arrival past its count\n");
      std::abort();
    }
    const unsigned pending = (old & 0xff) - arrivals;
    const int tx = (int)(unsigned)((old >> 16) & 0xffffffffull) + (int)bytes;
    const unsigned long long phase = old >> 48;
    next = pending == 0 && tx == 0
               ? ((phase + 1) << 48) | ((unsigned long long)count << 8) | count
               : (phase << 48) | ((unsigned long long)(unsigned)tx << 16)
                     | ((unsigned long long)count << 8) | pending;
  } while (!w.compare_exchange_weak(old, next));
}
static void mbar_expect(void* bar, unsigned bytes) {
  mbar_update((unsigned long long*)bar, 1, bytes);
}
static void bulk_copy(void* d, const void* s, unsigned n, void* bar) {
  std::memcpy(d, s, n);
  mbar_update((unsigned long long*)bar, 0, -(long long)n);
}
// a phase that never completes ends the test (abort), not hangs it
static void mbar_wait(void* bar, unsigned parity) {
  std::atomic_ref<unsigned long long> w(*(unsigned long long*)bar);
  const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (((w.load() >> 48) & 1) == parity) {
    if (std::chrono::steady_clock::now() > limit) {
      std::fprintf(stderr, "mbarrier: a phase never completed\n");
      std::abort();
    }
    std::this_thread::yield();
  }
}
// A cluster's odd CTAs lag on every wait for their partners' shares, so that the even
// ones run as far ahead as the kernel lets them (a slot overwritten before it was read
// shows as a wrong dx).
static void mbar_wait_cluster(void* bar, unsigned parity) {
  mbar_wait(bar, parity);
  if (t_rank & 1) std::this_thread::sleep_for(std::chrono::milliseconds(5));
}
static unsigned char* in_cta(const void* p, unsigned rank) {
  return t_cluster_smem[rank] + ((const unsigned char*)p - t_smem);
}
static void share_push(float* dst, unsigned rank, float a, float b, void* bar) {
  const float v[2] = {a, b};
  std::memcpy(in_cta(dst, rank), v, 8);
  mbar_update((unsigned long long*)in_cta(bar, rank), 0, -8);
}
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __shared__ static
#define __launch_bounds__(...)
#define __cluster_dims__(...)
// g_sync_lag_us > 0: a block's odd warps leave each block barrier that much after the
// even ones, so that a buffer the even warps write again before the odd ones have read
// it shows (0 by default; a kernel's host test sets it, see test_normalization_host)
static int g_sync_lag_us = 0;
static void __syncthreads() {
  g_block->arrive_and_wait();
  if (g_sync_lag_us > 0 && (t_warp & 1))
    std::this_thread::sleep_for(std::chrono::microseconds(g_sync_lag_us));
}
static void __syncwarp(unsigned = 0xffffffffu) { g_warps[t_warp].bar.arrive_and_wait(); }
static float __shfl_sync(unsigned, float v, int src) {
  WarpExchange& w = g_warps[t_warp];
  w.buf[t_lane] = v; w.bar.arrive_and_wait();
  float r = w.buf[src & 31]; w.bar.arrive_and_wait();
  return r;
}
static unsigned __shfl_sync(unsigned mask, unsigned v, int src) {
  float f; std::memcpy(&f, &v, 4);
  f = __shfl_sync(mask, f, src);
  unsigned r; std::memcpy(&r, &f, 4);
  return r;
}
static float __shfl_xor_sync(unsigned mask, float v, int o) { return __shfl_sync(mask, v, t_lane ^ o); }
static float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
#define __expf(x) std::exp(x)  // glibc declares its own __expf
#define __fdividef(a, b) ((a) / (b))  // the device's fast divide; exact here
static float rsqrtf(float x) { return 1.f / std::sqrt(x); }
static float bf16_to_f32(unsigned short x) { return __uint_as_float(((unsigned)x) << 16); }
static float f16_to_f32(unsigned short x) { _Float16 h; std::memcpy(&h, &x, 2); return (float)h; }
static float f32_to_f32(float x) { return x; }
static unsigned short f32_to_bf16(float x) {
  unsigned u; std::memcpy(&u, &x, 4);
  if (std::isnan(x)) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return (unsigned short)(u >> 16);
}
static unsigned short f32_to_f16(float x) { _Float16 h = (_Float16)x; unsigned short r; std::memcpy(&r, &h, 2); return r; }
static unsigned pack_bf16x2(float lo, float hi) { return f32_to_bf16(lo) | ((unsigned)f32_to_bf16(hi) << 16); }
static unsigned pack_f16x2(float lo, float hi) { return f32_to_f16(lo) | ((unsigned)f32_to_f16(hi) << 16); }
static void unpack_bf16x2(unsigned w, float& lo, float& hi) {
  lo = bf16_to_f32((unsigned short)(w & 0xffffu)); hi = bf16_to_f32((unsigned short)(w >> 16));
}
static void unpack_f16x2(unsigned w, float& lo, float& hi) {
  lo = f16_to_f32((unsigned short)(w & 0xffffu)); hi = f16_to_f32((unsigned short)(w >> 16));
}
"""

HOST_LAUNCH = r"""
// One std::thread per thread of a cluster's blocks (one block where there is no
// cluster), for the whole grid: the threads run the clusters one after another and meet
// at the block and cluster barriers in between. Each block has its own dynamic shared
// memory (SMEM bytes, filled with a pattern: nothing may read what it did not write).
extern "C" void host_launch(int grid_x, int block_x, int block_y, @PARAMS@) {
  constexpr int CL = @CLUSTER@;
  constexpr size_t SMEM = @SMEM@;
  blockDim = {(unsigned)block_x, (unsigned)block_y, 1};
  gridDim = {(unsigned)grid_x, 1, 1};
  const int block_threads = block_x * block_y;
  std::unique_ptr<std::barrier<>> blocks[CL];
  for (auto& b : blocks) b.reset(new std::barrier<>(block_threads));
  std::barrier<> cluster_barrier(CL * block_threads);
  std::vector<std::vector<unsigned char>> smem(CL, std::vector<unsigned char>(SMEM + 16, 0xa5));
  unsigned char* smem_ptr[CL];
  for (int c = 0; c < CL; ++c)
    smem_ptr[c] = smem[c].data() + ((16 - ((uintptr_t)smem[c].data() & 15)) & 15);
  std::unique_ptr<WarpExchange[]> warps(new WarpExchange[CL * ((block_threads + 31) / 32)]);
  g_warps = warps.get();
  std::vector<std::thread> threads;
  for (int c = 0; c < CL; ++c)
    for (int t = 0; t < block_threads; ++t)
      threads.emplace_back([&, c, t] {
        threadIdx = {(unsigned)(t % block_x), (unsigned)(t / block_x), 0};
        t_lane = t % 32; t_warp = c * ((block_threads + 31) / 32) + t / 32;
        g_block = blocks[c].get(); t_cluster = &cluster_barrier;
        t_smem = smem_ptr[c]; t_cluster_smem = smem_ptr; t_rank = c;
        for (int b = c; b < grid_x; b += CL) {
          blockIdx = {(unsigned)b, 0, 0};
          // each block meets the pattern, not what the cluster before it left
          if (t == 0) std::memset(t_smem, 0xa5, SMEM);
          blocks[c]->arrive_and_wait();
          @KERNEL@(@ARGS@);
          cluster_barrier.arrive_and_wait();
        }
      });
  for (auto& th : threads) th.join();
}
"""


def build(source: str, name: str, params, cluster: int = 1, smem: int = 0, extras: str = ""):
    """A kernel's CUDA source compiled for the host: the ctypes function
    host_launch(grid, block_x, block_y, *args) for the kernel ``name`` whose parameters are
    ``params`` ((C type, name) pairs), its blocks in clusters of ``cluster``, each with
    ``smem`` bytes of dynamic shared memory; ``extras``: host code the kernel needs beyond
    `HOST_PRELUDE`. Skips the test without a host C++ compiler."""
    compiler = shutil.which("g++")
    if compiler is None:
        pytest.skip("no host C++ compiler")
    src = source.replace(SNIPPETS["convert"].strip(), "").replace('extern "C" ', "")
    launch = (HOST_LAUNCH.replace("@PARAMS@", ", ".join(f"{t} {n}" for t, n in params))
              .replace("@CLUSTER@", str(cluster))
              .replace("@SMEM@", str(smem))
              .replace("@KERNEL@", name)
              .replace("@ARGS@", ", ".join(n for _, n in params)))
    work = Path(tempfile.mkdtemp(prefix="host_kernel_"))
    (work / "k.cpp").write_text(HOST_PRELUDE + extras + src + launch)
    subprocess.run([compiler, "-std=c++20", "-O0", "-w", "-shared", "-fPIC", "-pthread",
                    str(work / "k.cpp"), "-o", str(work / "k.so")], check=True)
    fn = ctypes.CDLL(str(work / "k.so")).host_launch
    kinds = {"float": ctypes.c_float, "int": ctypes.c_int, "long long": ctypes.c_longlong}
    fn.argtypes = [ctypes.c_int] * 3 + [kinds.get(t, ctypes.c_void_p) for t, _ in params]
    fn.restype = None
    return fn

