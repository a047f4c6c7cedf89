"""The matmul kernel bodies, in parts: setup, which tile and slice, the mainloop of
each instruction and feed, and the split-K epilogues; `BODIES` and `SNIPPET_NAMES`
say, per instruction and feed, which parts and which device functions make a kernel.
"""

from __future__ import annotations

WGMMA_SETUP = r"""
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  // Swizzle atoms start on SWIZZLE_ALIGN-byte boundaries (smem_bytes carries the slack).
  unsigned char* smem_base =
      smem_raw + ((SWIZZLE_ALIGN - (smem_addr(smem_raw) & (SWIZZLE_ALIGN - 1))) & (SWIZZLE_ALIGN - 1));
  in_t* smem = reinterpret_cast<in_t*>(smem_base);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wg = warp / 4, wq = warp % 4;  // warpgroup (WG_ROWS rows of C), warp in it
"""

# The wgmma accumulators of a warpgroup to the fp32 C tile in shared memory (rows padded
# by CPAD floats), as for mma.sync: m64nNk16's fragment layout, one place for every feed.
WGMMA_ACC_TO_SMEM = r"""#pragma unroll
  for (int mi = 0; mi < MI; ++mi)
#pragma unroll
    for (int i = 0; i < BN / 8; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = wg * WG_ROWS + mi * 64 + wq * 16 + h * 8 + (lane >> 2);
        const int c = i * 8 + (lane & 3) * 2;
        *reinterpret_cast<float2*>(sC + r * CLD + c) =
            make_float2(acc[mi][4 * i + 2 * h], acc[mi][4 * i + 2 * h + 1]);
      }
"""


def _indent_code(text: str, pad: str) -> str:
    """``text`` with ``pad`` before every line but the preprocessor's (which stay in
    column 0)."""
    return "".join(line if line.startswith("#") else pad + line
                   for line in text.splitlines(keepends=True))


WGMMA_MAINLOOP = r"""
  float acc[MI][NACC];
#pragma unroll
  for (int mi = 0; mi < MI; ++mi)
#pragma unroll
    for (int j = 0; j < NACC; ++j) acc[mi][j] = 0.f;

  // STAGES-2 K-tiles in flight ahead of the one computed, and one wgmma group in flight
  // behind it: the slot a load overwrites at step kt held K-tile kt-2, whose wgmma group
  // every warpgroup retired (wait_group 1 at step kt-1) before this step's barrier.
#pragma unroll
  for (int s = 0; s < STAGES - 2; ++s) {
    if (s < nk)
      load_stage(smem + s * STAGE_ELEMS, smem + s * STAGE_ELEMS + BM * BK, A, B, m0, n0,
                 (kt0 + s) * BK, M, N, K, lda, ldb, tid);
    cp_async_commit();
  }
  for (int kt = 0; kt < nk; ++kt) {
    cp_async_wait<STAGES - 3>();
    fence_proxy_async();
    __syncthreads();  // K-tile kt landed for everyone; K-tile kt-2's slot is free
    const int cs = kt % STAGES;
    issue_stage(acc, smem_addr(smem + cs * STAGE_ELEMS) + wg * WG_ROWS * BK * 2,
                smem_addr(smem + cs * STAGE_ELEMS + BM * BK));
    // The copies of K-tile kt+STAGES-2 overlap the tensor cores' work on K-tile kt.
    const int pre = kt + STAGES - 2;
    if (pre < nk) {
      const int ps = pre % STAGES;
      load_stage(smem + ps * STAGE_ELEMS, smem + ps * STAGE_ELEMS + BM * BK, A, B, m0, n0,
                 (kt0 + pre) * BK, M, N, K, lda, ldb, tid);
    }
    cp_async_commit();
    wgmma_wait<1>();
    fence_acc(acc);
  }
  wgmma_wait<0>();
  fence_acc(acc);
  cp_async_wait<0>();
  __syncthreads();  // the pipeline's shared memory becomes the fp32 C tile

  // Registers -> shared fp32 tile (rows padded by CPAD floats), as for mma.sync.
  float* sC = reinterpret_cast<float*>(smem_base);
""" + WGMMA_ACC_TO_SMEM

WS_PROLOGUE = r"""
  // Warp-specialized: warps 0..CONSUMER_WARPS-1 (the warpgroups) compute, the
  // PRODUCER_WARPS after them fill the ring. No CTA-wide barrier until the epilogue.
  __shared__ __align__(8) unsigned long long full_bar[STAGES], empty_bar[STAGES];
  init_ring_barriers(full_bar, empty_bar, CONSUMER_WARPS * CLUSTER_M);
  // A cluster's peer multicasts into this CTA's ring: both CTAs' barriers must be
  // initialized before either producer starts.
  if constexpr (CLUSTER_M > 1) cluster_sync(); else __syncthreads();

  float acc[MI][NACC];
#pragma unroll
  for (int mi = 0; mi < MI; ++mi)
#pragma unroll
    for (int j = 0; j < NACC; ++j) acc[mi][j] = 0.f;

  if (warp >= CONSUMER_WARPS) {
"""

PRODUCER_CP_ASYNC = r"""
    // Producer: K-tile kt goes to slot kt % STAGES once the compute warps released the
    // tile that slot held (use kt / STAGES - 1 of empty[slot]).
    const int ptid = tid - CONSUMER_WARPS * 32;
    for (int kt = 0; kt < nk; ++kt) {
      const int s = kt % STAGES;
      if (kt >= STAGES) mbar_wait(smem_addr(&empty_bar[s]), ((kt / STAGES) + 1) & 1);
      load_stage<PRODUCER_WARPS * 32>(smem + s * STAGE_ELEMS, smem + s * STAGE_ELEMS + BM * BK,
                                      A, B, m0, n0, (kt0 + kt) * BK, M, N, K, lda, ldb, ptid);
      mbar_arrive_cp_async(smem_addr(&full_bar[s]));
    }
    cp_async_wait<0>();
"""

PRODUCER_TMA = r"""
    // Producer: one thread (see produce_stage).
    if (tid == CONSUMER_WARPS * 32) {
      const unsigned long long tmap_a = reinterpret_cast<unsigned long long>(&map_a);
      const unsigned long long tmap_b = reinterpret_cast<unsigned long long>(&map_b);
      for (int kt = 0; kt < nk; ++kt)
        produce_stage(smem, full_bar, empty_bar, kt, (kt0 + kt) * BK, m0, n0, tmap_a, tmap_b);
    }
"""

WS_CONSUMER = r"""
  } else {
    const unsigned base = smem_addr(smem) + wg * WG_ROWS * BK * 2;
    for (int kt = 0; kt < nk; ++kt) {
      const int s = kt % STAGES;
      consume_stage(acc, base, smem, s, smem_addr(&full_bar[s]), (kt / STAGES) & 1);
      // K-tile kt-1's group retired: its slot goes back to the producer(s)
      if (kt > 0 && lane == 0) release_slot(smem_addr(&empty_bar[(kt - 1) % STAGES]));
    }
    wgmma_wait<0>();
    fence_acc(acc);
  }
  // The ring's shared memory becomes the fp32 C tile. In a cluster, also wait for the
  // peer: its compute warps still arrive on this CTA's empty barriers.
  if constexpr (CLUSTER_M > 1) cluster_sync(); else __syncthreads();

  float* sC = reinterpret_cast<float*>(smem_base);
  if (warp < CONSUMER_WARPS) {
""" + _indent_code(WGMMA_ACC_TO_SMEM, "  ") + "  }\n"

PTMA_BODY = r"""
  // Persistent: at most one CTA per SM; CTA b takes work units b, b + gridDim.x, ... in
  // the order of the non-persistent grid (unit = tile * split + slice), so a serial slice
  // still only waits for a unit that a resident CTA took before it. The producer thread
  // runs ahead across units: it loads the next unit's first K-tiles while the warpgroups
  // store this unit's C from registers. Ring slot and phase follow a running K-tile
  // count `it`, the same sequence on both sides.
  // PINGPONG: the warpgroups take the CTA's units in turn (local index j: warpgroup j % 2),
  // each the whole unit tile. The ring holds the units' K-tiles in order, so the
  // mainloops follow one another and a warpgroup's C store overlaps the other's
  // mainloop. A warpgroup counts the K-tiles of the units it skips into `it`; each slot
  // is released by the 4 warps of one warpgroup, and a warpgroup's turn-taking (serial
  // split-K) runs on its own leader thread and named barrier.
  __shared__ __align__(8) unsigned long long full_bar[STAGES], empty_bar[STAGES];
  init_ring_barriers(full_bar, empty_bar, PINGPONG ? 4 : CONSUMER_WARPS);
  __syncthreads();  // the last CTA-wide barrier: the producer warp leaves early
  const int tiles_m = (M + BM - 1) / BM, tiles_n = (N + BN - 1) / BN;
  const int ktiles = (K + BK - 1) / BK;
  // MODE_TAIL: whole tiles, but the tiles of the last, partial round (tiles % gridDim.x,
  // numbered last) each split `split` ways, serially summed in a tile-sized workspace slot
  // (not generated for PINGPONG, whose registers it would take: its mode never is)
  const bool tails = !PINGPONG && mode == MODE_TAIL;
  const int tail = tails ? (tiles_m * tiles_n) % gridDim.x : 0;
  const int units = tails ? tiles_m * tiles_n + tail * (split - 1) : tiles_m * tiles_n * split;
  int tile, slice, usplit, m0, n0, kt0, nk;

  if (warp >= CONSUMER_WARPS) {
    if (tid == CONSUMER_WARPS * 32) {
      const unsigned long long tmap_a = reinterpret_cast<unsigned long long>(&map_a);
      const unsigned long long tmap_b = reinterpret_cast<unsigned long long>(&map_b);
      int it = 0;
      for (int u = blockIdx.x; u < units; u += gridDim.x) {
        unit_coords(u, tiles_m, tiles_n, ktiles, split, tails, tail, tile, slice, usplit, m0, n0,
                    kt0, nk);
        for (int kt = 0; kt < nk; ++kt, ++it)
          produce_stage(smem, full_bar, empty_bar, it, (kt0 + kt) * BK, m0, n0, tmap_a, tmap_b);
      }
    }
    return;
  }

  const unsigned base = smem_addr(smem) + (PINGPONG ? 0 : wg * WG_ROWS * BK * 2);
  const int leader = PINGPONG ? wg * 128 : 0;  // the thread that takes the turns
  float acc[MI][NACC];
  int it = 0, j = 0;
  for (int u = blockIdx.x; u < units; u += gridDim.x, ++j) {
    unit_coords(u, tiles_m, tiles_n, ktiles, split, tails, tail, tile, slice, usplit, m0, n0,
                  kt0, nk);
    if (PINGPONG && (j & 1) != wg) {  // the other warpgroup's unit
      it += nk;
      continue;
    }
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
      for (int j = 0; j < NACC; ++j) acc[mi][j] = 0.f;
    // PINGPONG: a warpgroup waits for the other to have passed every wait of its
    // previous unit's mainloop before it waits on its own first K-tile: a full barrier's
    // parity tells only one phase from the next, and this unit's slots are several
    // phases ahead of the ring until then (named barrier 4 + wg: 128 arrive, 128 sync).
    if (PINGPONG && j > 0) turn_wait(4 + wg);
    for (int kt = 0; kt < nk; ++kt, ++it) {
      const int s = it % STAGES;
      consume_stage(acc, base, smem, s, smem_addr(&full_bar[s]), (it / STAGES) & 1);
      // K-tile it-1's group retired: its slot goes back to the producer
      if (kt > 0 && lane == 0) mbar_arrive(smem_addr(&empty_bar[(it - 1) % STAGES]));
    }
    if (PINGPONG && u + gridDim.x < units) turn_pass(4 + (1 - wg));
    wgmma_wait<0>();
    fence_acc(acc);
    if (nk > 0 && lane == 0) mbar_arrive(smem_addr(&empty_bar[(it - 1) % STAGES]));

    // the unit's own mode: a tail tile's slices are summed serially
    const int umode = !tails ? mode : usplit > 1 ? MODE_SERIAL : MODE_NONE;
    if constexpr (C_STAGED) {
      if (c_tma && umode == MODE_NONE) {
        // C through shared memory: the warpgroup writes its rows in 64x64 boxes (128-byte
        // rows, 16-byte chunk q of row r at chunk q ^ (r % 8): the map's swizzle, and no
        // bank conflict for the fragment's 8 rows x 4 threads) to its two buffers in
        // turn; its leader stores each box by TMA and waits only until the box two back
        // has been read out of the buffer it reuses. The stores drain during the next
        // unit's mainloop.
        // this thread's bytes in a box: rows wq * 16 + lane / 4 (+ 8), whose row % 8 is
        // lane / 4, at 4 bytes past their 16-byte chunk
        unsigned char* cbuf = smem_base + STAGES * STAGE_ELEMS * 2 + wg * 2 * C_BOX_BYTES +
                              (wq * 16 + (lane >> 2)) * 128 + (lane & 3) * 4;
        const unsigned long long tmap_c = reinterpret_cast<unsigned long long>(&map_c);
        const bool lead = (tid & 127) == 0;
#pragma unroll
        for (int mi = 0; mi < MI; ++mi)
#pragma unroll
          for (int jb = 0; jb < BN / C_BOX; ++jb) {
            unsigned char* buf = cbuf + ((mi * (BN / C_BOX) + jb) & 1) * C_BOX_BYTES;
            if (lead) bulk_wait_read<1>();
            wg_sync(wg);
#pragma unroll
            for (int q = 0; q < 8; ++q) {
              const int i = jb * 8 + q, col = n0 + i * 8 + (lane & 3) * 2;
#pragma unroll
              for (int h = 0; h < 2; ++h) {
                float x0 = acc[mi][4 * i + 2 * h], x1 = acc[mi][4 * i + 2 * h + 1];
                if (bias != nullptr) {
                  if (col < N) x0 += TO_FLOAT_OUT(bias[col]);
                  if (col + 1 < N) x1 += TO_FLOAT_OUT(bias[col + 1]);
                }
                *reinterpret_cast<unsigned*>(buf + h * 1024 + ((q ^ (lane >> 2)) << 4)) =
                    PACK2_OUT(x0, x1);
              }
              asm volatile("" ::: "memory");  // no bias loads hoisted past (registers)
            }
            fence_proxy_async();  // the writes, visible to the TMA unit
            wg_sync(wg);
            if (lead) {  // lane 0 of the warpgroup's first warp: buf is the box's start
              tma_store_2d(tmap_c, smem_addr(buf), n0 + jb * C_BOX, m0 + wg * WG_ROWS + mi * 64);
              bulk_commit();
            }
          }
        continue;
      }
    }

    // C from registers. Thread t of warpgroup wg holds, in m64 block mi, rows
    // r + {0, 8} (r = 16 * warp-in-group + lane / 4) and the column pairs 8i + 2 (lane % 4):
    // the wgmma accumulator layout. A later serial slice first waits its turn, then loads
    // the running sum for all its elements before it stores any (the loads batch).
    int* sem = sems + tile;
    const bool last = slice == usplit - 1;
    const bool add_earlier = umode == MODE_SERIAL && slice > 0;
    const bool to_workspace = umode == MODE_PARALLEL || (umode == MODE_SERIAL && !last);
    // the running sum of (row, col): W[row * ldw + col]; M x N planes, or (MODE_TAIL)
    // the tile's own BM x BN slot, tile % gridDim.x (the tail's tiles follow whole rounds;
    // W then based m0 rows and n0 columns before it)
    const int ldw = tails ? BN : N;
    float* W = ws + (umode == MODE_PARALLEL ? (long long)slice * M * N
                     : tails ? (long long)(tile % gridDim.x) * BM * BN
                                           - (long long)m0 * BN - n0
                                         : 0);
    const bool pairs_ws = (ldw % 2) == 0;
    const bool pairs_out = (N % 2) == 0 && (ldc % 2) == 0 &&
                           (reinterpret_cast<size_t>(C) % (2 * sizeof(out_t))) == 0;
    const int row0 = m0 + (PINGPONG ? 0 : wg * WG_ROWS) + wq * 16 + (lane >> 2);
    const int col0 = n0 + (lane & 3) * 2;
    if (add_earlier) {
      if (tid == leader) sem_spin(sem, slice);
      group_sync(wg);
    }
    // EPI_PAIRS column pairs at a time: their running-sum loads are issued together
    // (one round trip for the group), then the group is stored. A 9-warp CTA gets 168
    // registers a thread (3 warps share a quarter of the register file); beside the 128
    // accumulators of a 128x256 tile and the tail split's unit state, 4 pairs in flight
    // spilled 40 bytes, 2 none (ping-pong, without tail splits, keeps 4: 2 slowed its
    // serial splits by 5-12%, 82x9250x3832 0.93 -> 0.83 of cuBLAS on the H100).
    constexpr int EPI_PAIRS = PINGPONG ? 4 : 2;
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = row0 + mi * 64 + h * 8;
#pragma unroll
        for (int i0 = 0; i0 < BN / 8; i0 += EPI_PAIRS) {
          float2 w[EPI_PAIRS];
#pragma unroll
          for (int j = 0; j < EPI_PAIRS; ++j) {
            const int col = col0 + (i0 + j) * 8;
            w[j] = make_float2(0.f, 0.f);
            if (!add_earlier || row >= M || col >= N) continue;
            const float* p = W + (long long)row * ldw + col;
            if (pairs_ws) {
              w[j] = __ldcg(reinterpret_cast<const float2*>(p));
            } else {
              w[j].x = __ldcg(p);
              if (col + 1 < N) w[j].y = __ldcg(p + 1);
            }
          }
#pragma unroll
          for (int j = 0; j < EPI_PAIRS; ++j) {
            const int i = i0 + j, col = col0 + i * 8;
            if (row >= M || col >= N) continue;
            float x0 = acc[mi][4 * i + 2 * h] + w[j].x;
            float x1 = acc[mi][4 * i + 2 * h + 1] + w[j].y;
            const bool two = col + 1 < N;
            if (to_workspace) {
              float* p = W + (long long)row * ldw + col;
              if (pairs_ws) {
                __stcg(reinterpret_cast<float2*>(p), make_float2(x0, x1));
              } else {
                __stcg(p, x0);
                if (two) __stcg(p + 1, x1);
              }
              continue;
            }
            if (bias != nullptr) {
              x0 += TO_FLOAT_OUT(bias[col]);
              if (two) x1 += TO_FLOAT_OUT(bias[col + 1]);
            }
            out_t* q = C + (size_t)row * ldc + col;
            if (pairs_out) {
              if constexpr (OUT_IS_F32) {
                *reinterpret_cast<float2*>(q) = make_float2(x0, x1);
              } else {
                *reinterpret_cast<unsigned*>(q) = PACK2_OUT(x0, x1);
              }
            } else {
              q[0] = FROM_FLOAT_OUT(x0);
              if (two) q[1] = FROM_FLOAT_OUT(x1);
            }
          }
          asm volatile("" ::: "memory");
        }
      }
    if (umode == MODE_SERIAL) {
      if (last) {
        group_sync(wg);               // every compute thread has read the workspace
        if (tid == leader) *sem = 0;  // back to zero for the next matmul on this stream
      } else {
        __threadfence();
        group_sync(wg);
        if (tid == leader) sem_post(sem, slice + 1);
      }
    }
  }
  // the staged C stores done before the CTA's shared memory goes
  if constexpr (C_STAGED) {
    if (c_tma && (tid & 127) == 0) bulk_wait<0>();
  }
"""

# The kernel body in parts: setup, which tile and slice, mainloop + staging of the fp32
# C tile in shared memory (per instruction), then the split-K epilogue (shared).
MMA_SETUP = r"""
  extern __shared__ __align__(128) unsigned char smem_raw[];
  in_t* smem = reinterpret_cast<in_t*>(smem_raw);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp / WARPS_N, wn = warp % WARPS_N;

"""

TILE_HEAD = r"""
  // Which tile and K-slice: slices of a tile are consecutive CTAs (or clusters), so a
  // slice only ever waits for a CTA launched before it; tiles are rastered in groups of
  // GROUP_M rows of clusters (`group_tile`). A cluster's CTAs take CLUSTER_M vertically
  // adjacent tiles (same columns, same slice): the B tile they share is multicast.
  const int cl_rank = blockIdx.x % CLUSTER_M, cl_id = blockIdx.x / CLUSTER_M;
  const int tiles_m = (M + BM - 1) / BM, tiles_n = (N + BN - 1) / BN;
  const int tiles_mc = (tiles_m + CLUSTER_M - 1) / CLUSTER_M;
  const int slice = cl_id % split, ctile = cl_id / split;
  const int tile = ctile * CLUSTER_M + cl_rank;
  int tmc, tn;
  group_tile(ctile, tiles_mc, tiles_n, tmc, tn);
  const int m0 = (tmc * CLUSTER_M + cl_rank) * BM, n0 = tn * BN;

  const int ktiles = (K + BK - 1) / BK;
  const int per_slice = (ktiles + split - 1) / split;
  const int kt0 = imin(slice * per_slice, ktiles);
  const int nk = imin(ktiles, kt0 + per_slice) - kt0;

"""

MMA_MAINLOOP = r"""
  float acc[MI][NI][4];
#pragma unroll
  for (int mi = 0; mi < MI; ++mi)
#pragma unroll
    for (int ni = 0; ni < NI; ++ni)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[mi][ni][j] = 0.f;

  // Multistage pipeline: STAGES-1 K-tiles in flight while one is computed.
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < nk)
      load_stage(smem + s * STAGE_ELEMS, smem + s * STAGE_ELEMS + BM * BK, A, B, m0, n0,
                 (kt0 + s) * BK, M, N, K, lda, ldb, tid);
    cp_async_commit();
  }
  for (int kt = 0; kt < nk; ++kt) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();  // stage kt landed for everyone; stage kt-1 is free to overwrite
    const int pre = kt + STAGES - 1;
    if (pre < nk) {
      const int ps = pre % STAGES;
      load_stage(smem + ps * STAGE_ELEMS, smem + ps * STAGE_ELEMS + BM * BK, A, B, m0, n0,
                 (kt0 + pre) * BK, M, N, K, lda, ldb, tid);
    }
    cp_async_commit();
    const int cs = kt % STAGES;
    compute_stage(smem + cs * STAGE_ELEMS, smem + cs * STAGE_ELEMS + BM * BK, acc, wm, wn,
                  lane);
  }
  cp_async_wait<0>();
  __syncthreads();  // the pipeline's shared memory becomes the fp32 C tile

  // Registers -> shared fp32 tile (rows padded by CPAD floats: conflict-free float2
  // stores), so that the epilogue reads whole rows and stores 16 bytes per thread.
  float* sC = reinterpret_cast<float*>(smem_raw);
#pragma unroll
  for (int mi = 0; mi < MI; ++mi)
#pragma unroll
    for (int ni = 0; ni < NI; ++ni)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = wm * WTM + mi * 16 + h * 8 + (lane >> 2);
        const int c = wn * WTN + ni * 8 + (lane & 3) * 2;
        *reinterpret_cast<float2*>(sC + r * CLD + c) =
            make_float2(acc[mi][ni][2 * h], acc[mi][ni][2 * h + 1]);
      }

"""

EPILOGUE = r"""
  int* sem = sems + tile;
  const bool last = slice == split - 1;
  if (mode == MODE_SERIAL && slice > 0) sem_wait(sem, slice);  // includes a barrier
  else __syncthreads();

  // The tile, four columns per thread: add earlier slices, then either hand the running
  // sum on (fp32 workspace) or apply the epilogue.
  const bool vec_ws = (N % 4 == 0);
  const bool vec_out = (N % 4 == 0) && (ldc % 4 == 0) &&
                       ((reinterpret_cast<size_t>(C) & 15) == 0);
  float* W = ws + (mode == MODE_PARALLEL ? (size_t)slice * M * N : 0);
  // A later serial slice reads the running sum while the slices after it wait: its
  // loads are the critical path of the whole tile. Each thread issues EPI_BATCH of them
  // before it uses any (one round trip per batch instead of one per quad).
  constexpr int QUADS = BN / 4, ITEMS = BM * QUADS, EPI_BATCH = 8;
  const bool add_earlier = mode == MODE_SERIAL && slice > 0;
  const bool to_workspace = mode == MODE_PARALLEL || (mode == MODE_SERIAL && !last);
  for (int base = tid; base < ITEMS; base += EPI_BATCH * THREADS) {
    float4 w[EPI_BATCH];
#pragma unroll
    for (int u = 0; u < EPI_BATCH; ++u) {
      const int i = base + u * THREADS;
      const int r = i / QUADS, c = (i % QUADS) * 4;
      const int row = m0 + r, col = n0 + c;
      w[u] = make_float4(0.f, 0.f, 0.f, 0.f);
      if (add_earlier && i < ITEMS && row < M && col < N)
        w[u] = load_partial4(W, row, col, N, vec_ws && col + 4 <= N);
    }
#pragma unroll
    for (int u = 0; u < EPI_BATCH; ++u) {
      const int i = base + u * THREADS;
      const int r = i / QUADS, c = (i % QUADS) * 4;
      const int row = m0 + r, col = n0 + c;
      if (i >= ITEMS || row >= M || col >= N) continue;
      const float4 v = add4(*reinterpret_cast<const float4*>(sC + r * CLD + c), w[u]);
      const bool in_bounds = col + 4 <= N;
      if (to_workspace)
        store_partial4(W, row, col, N, vec_ws && in_bounds, v);
      else
        store_out4(C, bias, row, col, N, ldc, vec_out && in_bounds, v);
    }
  }

  if (mode == MODE_SERIAL) {
    if (last) {
      __syncthreads();         // every thread has read the workspace
      if (tid == 0) *sem = 0;  // back to zero for the next matmul on this stream
    } else {
      sem_release(sem, slice + 1);
    }
  }
"""

# split_mode "cluster": replaces EPILOGUE. Every CTA of the cluster holds its slice's fp32
# partial of the same tile in sC; CTA `slice` owns the tile's rows
# [slice * BM / CLUSTER_K, (slice + 1) * BM / CLUSTER_K) and sums them over the cluster's
# partials in K order (the same order on every run: deterministic).
CLUSTER_EPILOGUE = r"""
  // Every slice's partial is in its CTA's shared memory (release/acquire at cluster
  // scope makes the sC stores visible to the peers' loads).
  cluster_sync();
  {
    constexpr int QUADS = BN / 4, ROWS = BM / CLUSTER_K, ITEMS = ROWS * QUADS;
    const bool vec_out = (N % 4 == 0) && (ldc % 4 == 0) &&
                         ((reinterpret_cast<size_t>(C) & 15) == 0);
    const unsigned sc = smem_addr(sC);
    // Four items a thread in flight: a remote load's round trip crosses the GPC.
#pragma unroll 4
    for (int i = tid; i < ITEMS; i += THREADS) {
      const int r = slice * ROWS + i / QUADS, c = (i % QUADS) * 4;
      const int row = m0 + r, col = n0 + c;
      const unsigned off = sc + (unsigned)(r * CLD + c) * 4u;
      float4 v = ld_cluster4(off, 0);
#pragma unroll
      for (int s = 1; s < CLUSTER_K; ++s) v = add4(v, ld_cluster4(off, s));
      if (row < M && col < N) store_out4(C, bias, row, col, N, ldc, vec_out && col + 4 <= N, v);
    }
  }
  // A CTA's shared memory must outlive its peers' reads of it.
  cluster_sync();
"""

REDUCE_BODY = r"""
  // Sum the split fp32 partials of each element, apply bias and cast; four columns per
  // thread, grid-stride over the [M, N] output.
  const long long quads_per_row = (N + 3) / 4;
  const long long total = (long long)M * quads_per_row;
  const size_t plane = (size_t)M * N;
  const bool vec_ws = (N % 4 == 0);
  const bool vec_out = vec_ws && (ldc % 4 == 0) && ((reinterpret_cast<size_t>(C) & 15) == 0);
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
       i += (long long)gridDim.x * blockDim.x) {
    const int row = (int)(i / quads_per_row), col = (int)(i % quads_per_row) * 4;
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int s = 0; s < split; ++s) v = add_partial4(ws + s * plane, row, col, N, vec_ws, v);
    store_out4(C, bias, row, col, N, ldc, vec_out, v);
  }
"""

MMA_INSTR = {
    "bf16": "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
    "fp16": "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
}
# PTX type of each input dtype in wgmma.mma_async.
WGMMA_TYPE = {"bf16": "bf16", "fp16": "f16"}

# Per instruction: the kernel body's parts and the snippets it needs, in order.
BODIES: dict[str, tuple[str, ...]] = {
    "mma": (MMA_SETUP, TILE_HEAD, MMA_MAINLOOP, EPILOGUE),
    "wgmma": (WGMMA_SETUP, TILE_HEAD, WGMMA_MAINLOOP, EPILOGUE),
    "wgmma_ws": (WGMMA_SETUP, TILE_HEAD, WS_PROLOGUE, PRODUCER_CP_ASYNC, WS_CONSUMER, EPILOGUE),
    "wgmma_tma": (WGMMA_SETUP, TILE_HEAD, WS_PROLOGUE, PRODUCER_TMA, WS_CONSUMER, EPILOGUE),
    "wgmma_ptma": (WGMMA_SETUP, PTMA_BODY),
    "wgmma_pptma": (WGMMA_SETUP, PTMA_BODY),
    "wgmma_ctma": (WGMMA_SETUP, TILE_HEAD, WS_PROLOGUE, PRODUCER_TMA, WS_CONSUMER, EPILOGUE),
}
SNIPPET_NAMES: dict[str, tuple[str, ...]] = {
    "mma": ("convert", "min_max", "ptx", "raster", "semaphore", "swizzle", "load_stage",
            "compute_stage", "store_out"),
    "wgmma": ("convert", "min_max", "ptx", "raster", "semaphore", "swizzle", "load_stage",
              "wgmma_ptx", "wgmma_instr", "issue_stage", "store_out"),
    "wgmma_ws": ("convert", "min_max", "ptx", "raster", "semaphore", "swizzle", "load_stage",
                 "wgmma_ptx", "wgmma_instr", "issue_stage", "mbarrier", "consume_stage",
                 "store_out"),
    "wgmma_tma": ("convert", "min_max", "ptx", "raster", "semaphore", "wgmma_ptx", "wgmma_instr",
                  "issue_stage", "mbarrier", "consume_stage", "tma", "store_out"),
    "wgmma_ptma": ("convert", "min_max", "ptx", "raster", "semaphore", "wgmma_ptx", "wgmma_instr",
                   "issue_stage", "unit_coords", "mbarrier", "consume_stage", "tma", "store_out"),
    "wgmma_pptma": ("convert", "min_max", "ptx", "raster", "semaphore", "wgmma_ptx", "wgmma_instr",
                    "issue_stage", "unit_coords", "mbarrier", "consume_stage", "tma",
                    "store_out"),
    "wgmma_ctma": ("convert", "min_max", "ptx", "raster", "semaphore", "wgmma_ptx", "wgmma_instr",
                   "issue_stage", "mbarrier", "consume_stage", "tma", "store_out"),
}
