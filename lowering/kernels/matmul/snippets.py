"""The matmul kernels' device functions, one table: PTX wrappers, the swizzle, the
cp.async stage loads, the mma.sync and wgmma steps, the mbarrier ring, TMA, the
split-K semaphores and the epilogue stores. The renderer picks the entries a feed needs
(`bodies.SNIPPET_NAMES`); the constants they use come from the prelude.
"""

from __future__ import annotations

MATMUL_SNIPPETS: dict[str, str] = {
    "ptx": r"""
__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return (unsigned)__cvta_generic_to_shared(p);
}
// 16 bytes global -> shared, bypassing L1; zero-filled when pred is false (the source
// address is then never read).
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, bool pred) {
  int n = pred ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(dst), "l"(src), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" :: "n"(N));
}
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void mma_16816(float (&d)[4], const unsigned (&a)[4],
                                          const unsigned (&b)[2]) {
  asm volatile(MMA_INSTR
      " {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
""",
    "semaphore": r"""
// Cross-CTA turn-taking. Thread 0 spins with acquire loads; the barrier then publishes
// what it saw to the CTA. Release: every thread fences its partial stores, the barrier
// orders them before thread 0's release store.
__device__ __forceinline__ void sem_spin(const int* sem, int value) {
  int v;
  while (true) {
    asm volatile("ld.global.acquire.gpu.b32 %0, [%1];\n" : "=r"(v) : "l"(sem) : "memory");
    if (v == value) break;
    __nanosleep(40);
  }
}
__device__ __forceinline__ void sem_post(int* sem, int value) {
  asm volatile("st.global.release.gpu.b32 [%0], %1;\n" :: "l"(sem), "r"(value) : "memory");
}
__device__ __forceinline__ void sem_wait(const int* sem, int value) {
  if (threadIdx.x == 0) sem_spin(sem, value);
  __syncthreads();
}
__device__ __forceinline__ void sem_release(int* sem, int value) {
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) sem_post(sem, value);
}
""",
    "swizzle": r"""
// Element offset of 16-byte chunk `chunk` of row `row` in a tile whose rows hold CHUNKS
// chunks. The chunk index is XORed with the row so that 8 consecutive rows at the same
// logical chunk land in 8 distinct 16-byte bank groups (conflict-free ldmatrix).
template <int CHUNKS> __device__ __forceinline__ int swz(int row, int chunk) {
  constexpr int ROWS_PER_LINE = CHUNKS >= 8 ? 1 : 8 / CHUNKS;
  constexpr int MASK = CHUNKS >= 8 ? 7 : CHUNKS - 1;
  return (row * CHUNKS + (chunk ^ ((row / ROWS_PER_LINE) & MASK))) * 8;
}
""",
    "load_stage": r"""
// Issue the cp.async copies of one K-tile of A and B into one pipeline stage; threads
// 0..NT-1 (`tid`) share the copies.
template <int NT = THREADS>
__device__ __forceinline__ void load_stage(in_t* sA, in_t* sB, const in_t* A, const in_t* B,
                                           int m0, int n0, int k0, int M, int N, int K,
                                           int lda, int ldb, int tid) {
  constexpr int KCH = BK / 8;
#pragma unroll
  for (int it = 0; it < BM * KCH / NT; ++it) {
    int i = tid + it * NT;
    int r = i / KCH, c = i % KCH;
    int gm = m0 + r, gk = k0 + c * 8;
    bool p = gm < M && gk < K;
    cp_async16(smem_addr(sA + swz<KCH>(r, c)), p ? A + (size_t)gm * lda + gk : A, p);
  }
  if constexpr (B_KMAJOR) {
#pragma unroll
    for (int it = 0; it < BN * KCH / NT; ++it) {
      int i = tid + it * NT;
      int r = i / KCH, c = i % KCH;
      int gn = n0 + r, gk = k0 + c * 8;
      bool p = gn < N && gk < K;
      cp_async16(smem_addr(sB + swz<KCH>(r, c)), p ? B + (size_t)gn * ldb + gk : B, p);
    }
  } else {
    constexpr int NCH = BN / 8;
#pragma unroll
    for (int it = 0; it < BK * NCH / NT; ++it) {
      int i = tid + it * NT;
      int r = i / NCH, c = i % NCH;
      int gk = k0 + r, gn = n0 + c * 8;
      bool p = gk < K && gn < N;
      cp_async16(smem_addr(sB + swz<NCH>(r, c)), p ? B + (size_t)gk * ldb + gn : B, p);
    }
  }
}
""",
    "compute_stage": r"""
// All MMAs of one K-tile held in shared memory, for this warp's WTM x WTN sub-tile.
__device__ __forceinline__ void compute_stage(const in_t* sA, const in_t* sB,
                                              float (&acc)[MI][NI][4], int wm, int wn,
                                              int lane) {
  constexpr int KCH = BK / 8;
#pragma unroll
  for (int kk = 0; kk < BK / 16; ++kk) {
    unsigned af[MI][4];
    unsigned bf[NI][2];
#pragma unroll
    for (int mi = 0; mi < MI; ++mi) {
      int row = wm * WTM + mi * 16 + (lane & 15);
      ldmatrix_x4(af[mi], smem_addr(sA + swz<KCH>(row, kk * 2 + (lane >> 4))));
    }
#pragma unroll
    for (int nj = 0; nj < NI / 2; ++nj) {
      unsigned t[4];
      if constexpr (B_KMAJOR) {
        int row = wn * WTN + nj * 16 + ((lane >> 4) << 3) + (lane & 7);
        ldmatrix_x4(t, smem_addr(sB + swz<KCH>(row, kk * 2 + ((lane >> 3) & 1))));
      } else {
        int row = kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3);
        int chunk = (wn * WTN + nj * 16) / 8 + (lane >> 4);
        ldmatrix_x4_trans(t, smem_addr(sB + swz<BN / 8>(row, chunk)));
      }
      bf[2 * nj][0] = t[0]; bf[2 * nj][1] = t[1];
      bf[2 * nj + 1][0] = t[2]; bf[2 * nj + 1][1] = t[3];
    }
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
      for (int ni = 0; ni < NI; ++ni) mma_16816(acc[mi][ni], af[mi], bf[ni]);
  }
}
""",
    "store_out": r"""
// Epilogue for four horizontally adjacent elements (col % 4 == 0): bias, cast, store.
// `vec`: the four are in bounds and 8/16-byte aligned, so one vector store does.
__device__ __forceinline__ void store_out4(out_t* C, const out_t* bias, int row, int col,
                                          int N, int ldc, bool vec, float4 v) {
  float x[4] = {v.x, v.y, v.z, v.w};
  if (bias != nullptr) {
#pragma unroll
    for (int j = 0; j < 4; ++j)
      if (col + j < N) x[j] += TO_FLOAT_OUT(bias[col + j]);
  }
  out_t* p = C + (size_t)row * ldc + col;
  if (vec) {
    if constexpr (OUT_IS_F32) {
      *reinterpret_cast<float4*>(p) = make_float4(x[0], x[1], x[2], x[3]);
    } else {
      *reinterpret_cast<uint2*>(p) = make_uint2(PACK2_OUT(x[0], x[1]), PACK2_OUT(x[2], x[3]));
    }
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j)
      if (col + j < N) p[j] = FROM_FLOAT_OUT(x[j]);
  }
}
// fp32 partials in a row-major [M, N] workspace (ld = N), through L2 only.
__device__ __forceinline__ void store_partial4(float* W, int row, int col, int N, bool vec,
                                              float4 v) {
  float* p = W + (size_t)row * N + col;
  if (vec) { __stcg(reinterpret_cast<float4*>(p), v); return; }
  float x[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int j = 0; j < 4; ++j)
    if (col + j < N) __stcg(p + j, x[j]);
}
__device__ __forceinline__ float4 load_partial4(const float* W, int row, int col, int N,
                                               bool vec) {
  const float* p = W + (size_t)row * N + col;
  if (vec) return __ldcg(reinterpret_cast<const float4*>(p));
  float x[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int j = 0; j < 4; ++j)
    if (col + j < N) x[j] = __ldcg(p + j);
  return make_float4(x[0], x[1], x[2], x[3]);
}
__device__ __forceinline__ float4 add4(float4 a, float4 b) {
  return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}
__device__ __forceinline__ float4 add_partial4(const float* W, int row, int col, int N,
                                              bool vec, float4 v) {
  return add4(v, load_partial4(W, row, col, N, vec));
}
""",
    "wgmma_ptx": r"""
// Shared-memory matrix descriptor of a K-major operand in the 128-byte swizzle layout:
// rows of 64 16-bit elements (128 bytes), 16-byte chunk c of row r stored at chunk
// c ^ (r % 8) (what swz<8> does), 8-row atoms of 1024 bytes stacked along M (or N).
// Fields (PTX ISA, "matrix descriptor"): bits 0-13 start address >> 4; 16-29 leading
// byte offset >> 4 (unused by swizzled K-major layouts, 1 by convention); 32-45 stride
// byte offset >> 4 (1024 bytes from one 8-row atom to the next); 49-51 base offset (0:
// atoms start 1024-byte aligned); 62-63 swizzle mode (1 = 128-byte). A k16 step inside
// the 128-byte row is +32 bytes on the start address: the hardware swizzles the address.
__device__ __forceinline__ unsigned long long sw128_desc(unsigned addr) {
  return (unsigned long long)((addr & 0x3FFFF) >> 4) | (1ull << 16) |
         ((unsigned long long)(1024 >> 4) << 32) | (1ull << 62);
}
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N> __device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(N) : "memory");
}
// cp.async fills shared memory through the generic proxy; wgmma reads it through the
// async proxy: each thread fences its landed copies before the barrier.
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Keeps the compiler from moving accumulator reads or writes across wgmma fences/waits.
template <int A, int B> __device__ __forceinline__ void fence_acc(float (&d)[A][B]) {
#pragma unroll
  for (int i = 0; i < A; ++i)
#pragma unroll
    for (int j = 0; j < B; ++j) asm volatile("" : "+f"(d[i][j]) :: "memory");
}
""",
    "raster": r"""
// Tile t of a grid of `rows` x `tiles_n` tiles: rastered in groups of GROUP_M tile rows,
// down the rows of a group column by column, so that the CTAs of a wave share A rows and B
// columns in L2. A last group of fewer than GROUP_M / 2 rows joins the group before it:
// alone it would read every B column from DRAM again for a few rows (1152x10560x7040 in
// 128x256 tiles, nine rows: 0.86 of cuBLAS on the H100 as 8 + 1, 1.00 as one group).
__device__ __forceinline__ void group_tile(int t, int rows, int tiles_n, int& tm, int& tn) {
  const int rem = rows % GROUP_M;
  // the first row of the joined last group (rows: none joined)
  const int last = rows > GROUP_M && 2 * rem < GROUP_M ? rows - GROUP_M - rem : rows;
  const int first = imin(t / (GROUP_M * tiles_n) * GROUP_M, last);
  const int size = first == last ? rows - last : imin(rows - first, GROUP_M);
  const int local = t - first * tiles_n;
  tm = first + local % size;
  tn = local / size;
}
""",
    "unit_coords": r"""
// Work unit u of a matmul (u = tile * split + slice; with `tails`, MODE_TAIL: the first
// tiles whole, u = tile, then the last `tail` tiles (none where the rounds are full)
// `split` slices each): its output tile, rastered in groups of GROUP_M tile rows (CTAs
// running together share A rows and B columns in L2), its slice of `usplit`, and the
// K-tiles [kt0, kt0 + nk) of that slice.
__device__ __forceinline__ void unit_coords(int u, int tiles_m, int tiles_n, int ktiles,
                                            int split, bool tails, int tail, int& tile,
                                            int& slice, int& usplit, int& m0, int& n0,
                                            int& kt0, int& nk) {
  const int whole = tiles_m * tiles_n - tail;
  if (tails && u < whole) {
    tile = u, slice = 0, usplit = 1;
  } else if (tails) {
    tile = whole + (u - whole) / split, slice = (u - whole) % split, usplit = split;
  } else {
    tile = u / split, slice = u % split, usplit = split;
  }
  int tm, tn;
  group_tile(tile, tiles_m, tiles_n, tm, tn);
  m0 = tm * BM;
  n0 = tn * BN;
  const int per_slice = (ktiles + usplit - 1) / usplit;
  kt0 = imin(slice * per_slice, ktiles);
  nk = imin(ktiles, kt0 + per_slice) - kt0;
}
// The compute warps' own barrier (named barrier 1): the producer warp never joins.
__device__ __forceinline__ void consumer_sync() {
  asm volatile("bar.sync 1, %0;\n" :: "n"(CONSUMER_WARPS * 32) : "memory");
}
// PINGPONG turns: the warpgroup whose turn it is waits (bar.sync) on named barrier
// `id` until the other, done with its mainloop, arrives (bar.arrive): 256 threads.
__device__ __forceinline__ void turn_wait(int id) {
  asm volatile("bar.sync %0, 256;\n" :: "r"(id) : "memory");
}
__device__ __forceinline__ void turn_pass(int id) {
  asm volatile("bar.arrive %0, 256;\n" :: "r"(id) : "memory");
}
// The 128 threads of warpgroup wg alone (named barrier 6 + wg): the staged C store.
__device__ __forceinline__ void wg_sync(int wg) {
  asm volatile("bar.sync %0, 128;\n" :: "r"(6 + wg) : "memory");
}
// The barrier of the threads that store one unit: every compute warp, or (PINGPONG) the
// 4 warps of warpgroup wg (named barrier 2 + wg).
__device__ __forceinline__ void group_sync(int wg) {
  if constexpr (PINGPONG) asm volatile("bar.sync %0, 128;\n" :: "r"(2 + wg) : "memory");
  else consumer_sync();
}
""",
    "issue_stage": r"""
// The wgmmas of one K-tile in shared memory (A at a0, this warpgroup's rows; B at b0),
// committed as one group. Accumulators are fenced first: wgmma reads them asynchronously.
__device__ __forceinline__ void issue_stage(float (&acc)[MI][NACC], unsigned a0, unsigned b0) {
  fence_acc(acc);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < BK / 16; ++kk)
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
      wgmma_tile(acc[mi], sw128_desc(a0 + mi * 64 * BK * 2 + kk * 32), sw128_desc(b0 + kk * 32));
  wgmma_commit();
}
""",
    "consume_stage": r"""
// A compute warp's step of the warp-specialized ring: wait until slot s holds its K-tile
// (phase parity `parity`), issue the tile's wgmmas on it, and return once the previous
// K-tile's group retired (one group stays in flight): that slot may go back.
__device__ __forceinline__ void consume_stage(float (&acc)[MI][NACC], unsigned a_base,
                                              const in_t* smem, int s, unsigned full,
                                              unsigned parity) {
  mbar_wait(full, parity);
  // cp.async copies are generic-proxy writes: fence them before wgmma reads them
  // (TMA writes through the async proxy already).
  if constexpr (!USE_TMA) fence_proxy_async();
  issue_stage(acc, a_base + s * STAGE_ELEMS * 2, smem_addr(smem + s * STAGE_ELEMS + BM * BK));
  wgmma_wait<1>();
  fence_acc(acc);
}
""",
    "mbarrier": r"""
// mbarriers of the warp-specialized ring (PTX ISA, "mbarrier"): `full[s]` completes a
// phase when every producer thread's copies into slot s have landed (cp.async's own
// arrive, counted in the init count: .noinc); `empty[s]` when every compute warp has
// retired the wgmma group that read slot s. Waits are on the phase's parity.
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_fence_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_arrive_cp_async(unsigned bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" :: "r"(bar) : "memory");
}
// The ring's barriers, by thread 0: `full[s]` completes on FULL_ARRIVALS arrivals (and
// its transaction bytes), `empty[s]` on `empty_arrivals` (the compute warps that read s).
__device__ __forceinline__ void init_ring_barriers(unsigned long long* full_bar,
                                                   unsigned long long* empty_bar,
                                                   unsigned empty_arrivals) {
  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(smem_addr(&full_bar[s]), FULL_ARRIVALS);
      mbar_init(smem_addr(&empty_bar[s]), empty_arrivals);
    }
    mbar_fence_init();
  }
}
// A compute warp is done with a ring slot: tell this CTA's producer and, in a cluster,
// the peer's (it multicasts into this CTA's slot too; CLUSTER_M is 1 or 2).
__device__ __forceinline__ void release_slot(unsigned bar) {
  mbar_arrive(bar);
  if constexpr (CLUSTER_M > 1) {
    unsigned remote;
    const unsigned peer = (blockIdx.x % CLUSTER_M) ^ 1u;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(bar), "r"(peer));
    // Release at CTA scope (the default), as CUTLASS's cluster barrier does: the slot's
    // readers are this CTA's wgmmas, retired by wgmma.wait_group before the arrive. A
    // .release.cluster arrive (a cluster-scope fence for every warp at every K-tile) ran
    // the kernel at 0.62-0.65 of the unclustered one.
    asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" :: "r"(remote) : "memory");
  }
}
// Every thread of every CTA of the cluster (release/acquire at cluster scope).
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\n"
               "barrier.cluster.wait.acquire;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
  asm volatile(
      "{\n.reg .pred done;\nWAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n}\n" :: "r"(bar), "r"(parity) : "memory");
}
""",
    "tma": r"""
// TMA (PTX ISA, cp.async.bulk.tensor): the producer announces a stage's bytes on its
// full barrier, then each bulk copy completes its share of that transaction. `tmap` is
// the generic address of a CUtensorMap: a __grid_constant__ kernel parameter.
struct __align__(64) TensorMap { unsigned long long word[TENSOR_MAP_BYTES / 8]; };
__device__ __forceinline__ void mbar_expect_tx(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n"
               :: "r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void tma_load_2d(unsigned dst, unsigned long long tmap, int c0,
                                            int c1, unsigned bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];\n"
      :: "r"(dst), "l"(tmap), "r"(c0), "r"(c1), "r"(bar) : "memory");
}
// The same box to offset `dst` of every CTA in `mask` (cluster ranks), completing bytes
// on the barrier at offset `bar` of each.
__device__ __forceinline__ void tma_load_2d_multicast(unsigned dst, unsigned long long tmap,
                                                      int c0, int c1, unsigned bar,
                                                      unsigned short mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      ".multicast::cluster [%0], [%1, {%2, %3}], [%4], %5;\n"
      :: "r"(dst), "l"(tmap), "r"(c0), "r"(c1), "r"(bar), "h"(mask) : "memory");
}
// TMA stores (cp.async.bulk.tensor, shared -> global) of one thread, grouped: a box of C
// at (c0, c1) = (column, row) from shared offset `src`; rows and columns past the map's
// M x N are not written. A thread's groups complete in order; `.read` waits only until
// the shared memory of all but the newest N groups has been read.
__device__ __forceinline__ void tma_store_2d(unsigned long long tmap, unsigned src, int c0,
                                             int c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n"
               :: "l"(tmap), "r"(src), "r"(c0), "r"(c1) : "memory");
}
__device__ __forceinline__ void bulk_commit() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
template <int N> __device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" :: "n"(N) : "memory");
}
template <int N> __device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;\n" :: "n"(N) : "memory");
}
// The TMA producer's step: the `count`-th K-tile it loads (at K offset k0) goes to slot
// count % STAGES once the compute warps released the tile that slot held. The box of A
// is BK x BM at (k0, m0), of B BK x BN at (k0, n0); out-of-bounds rows and the K tail
// arrive as zeros, and the bytes of whole boxes count towards the stage's transaction.
__device__ __forceinline__ void produce_stage(const in_t* smem, unsigned long long* full_bar,
                                              unsigned long long* empty_bar, int count,
                                              int k0, int m0, int n0,
                                              unsigned long long tmap_a,
                                              unsigned long long tmap_b) {
  const int s = count % STAGES;
  if (count >= STAGES) mbar_wait(smem_addr(&empty_bar[s]), ((count / STAGES) + 1) & 1);
  const unsigned bar = smem_addr(&full_bar[s]);
  mbar_expect_tx(bar, STAGE_ELEMS * 2);
  tma_load_2d(smem_addr(smem + s * STAGE_ELEMS), tmap_a, k0, m0, bar);
  if constexpr (CLUSTER_M > 1) {
    // This CTA's share of the B tile, to the same slot of every CTA of the cluster
    // (each one's full barrier expects the whole tile).
    constexpr int B_ROWS = BN / CLUSTER_M;
    const int cl_rank = blockIdx.x % CLUSTER_M;
    tma_load_2d_multicast(smem_addr(smem + s * STAGE_ELEMS + BM * BK + cl_rank * B_ROWS * BK),
                          tmap_b, k0, n0 + cl_rank * B_ROWS, bar,
                          (unsigned short)((1u << CLUSTER_M) - 1));
  } else {
    tma_load_2d(smem_addr(smem + s * STAGE_ELEMS + BM * BK), tmap_b, k0, n0, bar);
  }
}
""",
    "dsmem": r"""
// Four floats at shared-memory offset `addr` of the cluster's CTA `rank` (distributed
// shared memory, sm_90): mapa turns this CTA's offset into the peer's window.
__device__ __forceinline__ float4 ld_cluster4(unsigned addr, unsigned rank) {
  unsigned remote;
  float4 v;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(addr), "r"(rank));
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(remote) : "memory");
  return v;
}
""",
    # Rendered per tile_n by `_wgmma_instr`: @N@, @REGS@, @OPERANDS@, @IDX_*@, @TYPE@.
    "wgmma_instr": r"""
// D[64 x @N@] += A[64 x 16] * B[@N@ x 16]^T, both operands K-major in shared memory.
// Thread t of the warpgroup holds, for each 8-column block i, d[4i..4i+3] = D[r][c],
// D[r][c+1], D[r+8][c], D[r+8][c+1] with r = 16 * (t / 32) + (t % 32) / 4 and
// c = 8i + 2 * (t % 4) (the mma.sync m16n8 accumulator layout, repeated).
__device__ __forceinline__ void wgmma_tile(float (&d)[@N@ / 2], unsigned long long da,
                                           unsigned long long db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %@IDX_SCALE@, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n@N@k16.f32.@TYPE@.@TYPE@ {@REGS@}, %@IDX_A@, %@IDX_B@, p, 1, 1, 0, 0;\n}\n"
      : @OPERANDS@
      : "l"(da), "l"(db), "r"(1));
}
""",
}
