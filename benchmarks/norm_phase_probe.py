"""Rows not 16-byte aligned (hidden % 8 == 4 at fp16, 5140): 16-byte vectors anyway, by
row phase, timed side by side with the generated kernel and copy_.

At 5140 a row is 10280 bytes, so every other row starts 8 bytes past a 16-byte boundary
and the generated kernel moves x and y in 8-byte vectors (twice the accesses of the
other sizes, warps' requests straddling sectors). Here a row is its 16-byte-aligned
body, 642 vectors of 8, plus one 4-element piece: its head on odd rows (a row starting
at element 4 mod 8), its tail on even ones. With the grid even (or two rows a block) a
thread's rows all have one phase, so its slice of the four 1-D tensors, held in
registers, stays put. x goes through the cp.async ring as in the generated kernel (16
bytes a copy), y out in 16-byte stores.

Hand-written kernels of the reference fusion (fp16), checked against float64 (NaN-
poisoned output, rows with a large mean) before they are timed; one that spills is
recorded and not timed.

    python benchmarks/norm_phase_probe.py --out probe.json
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

KERNEL = r"""
template <int kT, int kB, int kR, int kS>
__device__ __forceinline__ void phase_ln(const unsigned short* __restrict__ x,
    const unsigned short* __restrict__ b0, const unsigned short* __restrict__ b1,
    const unsigned short* __restrict__ w, const unsigned short* __restrict__ bias,
    unsigned short* __restrict__ y, const int rows) {
  dependent_launch_entry();
  constexpr int kH = HIDDEN, kBody = (kH - 4) / 8, kWarps = kT / 32, kSlots = kT * kB;
  const int lane = threadIdx.x % kT;
  const int rib = threadIdx.x / kT;
  const int groups = (rows + kR - 1) / kR;
  __shared__ float partials[2][kR][kWarps];
  extern __shared__ __align__(16) unsigned char staged[];
  // every row of this thread has the phase of its first (host: kR even or grid even)
  const int phase = (blockIdx.x * kR + rib) & 1;
  const int head = phase ? 4 : 0;
  const int odd_col = phase ? 0 : kH - 4;
  Vec<unsigned short, 8> c_b0[kB], c_b1[kB], c_w[kB], c_bias[kB];
  const unsigned short* ps[4] = {b0, b1, w, bias};
#pragma unroll
  for (int i = 0; i < kB; ++i) {
    const int k = i * kT + lane;
    uint4 r[4];
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      r[t] = make_uint4(0, 0, 0, 0);
      if (k < kBody) {
        const uint2* p = reinterpret_cast<const uint2*>(ps[t] + head + 8 * k);
        const uint2 lo = p[0], hi = p[1];
        r[t] = make_uint4(lo.x, lo.y, hi.x, hi.y);
      } else if (k == kBody) {
        const uint2 lo = *reinterpret_cast<const uint2*>(ps[t] + odd_col);
        r[t] = make_uint4(lo.x, lo.y, 0, 0);
      }
    }
    c_b0[i].raw = r[0]; c_b1[i].raw = r[1]; c_w[i].raw = r[2]; c_bias[i].raw = r[3];
  }
  uint4* ring = reinterpret_cast<uint4*>(staged) + rib * (kS + 1) * kSlots;
  auto stage = [&](uint4* buf, int row) {
    const bool in = row < rows;
    const unsigned short* xr = x + (size_t)(in ? row : 0) * kH;
#pragma unroll
    for (int i = 0; i < kB; ++i) {
      const int k = i * kT + lane;
      if (k < kBody) cp_async<16>(buf + k, xr + head + 8 * k, in);
      else if (k == kBody) cp_async<8>(buf + k, xr + odd_col, in);
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
  };
#pragma unroll
  for (int s = 0; s < kS; ++s) stage(ring + s * kSlots, (blockIdx.x + s * gridDim.x) * kR + rib);
  int buf = 0;
#pragma unroll 1
  for (int group = blockIdx.x; group < groups; group += gridDim.x) {
    const int row = group * kR + rib;
    const bool row_ok = row < rows;
#pragma unroll
    for (int i = 0; i < kB; ++i) {
      opaque(c_b0[i].raw); opaque(c_b1[i].raw); opaque(c_w[i].raw); opaque(c_bias[i].raw);
    }
    cp_async_wait_group<kS - 1>();
    Vec<unsigned short, 8> xv[kB];
#pragma unroll
    for (int i = 0; i < kB; ++i) xv[i].raw = ring[buf * kSlots + i * kT + lane];
    const int ahead = buf == 0 ? kS : buf - 1;
    buf = buf == kS ? 0 : buf + 1;
    stage(ring + ahead * kSlots, (group + kS * gridDim.x) * kR + rib);
    float v[kB][8];
#pragma unroll
    for (int i = 0; i < kB; ++i) {
      const int k = i * kT + lane;
      Vec<unsigned short, 8> h = xv[i];
      add2_fp16(h.raw, c_b0[i].raw);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const bool ok = k < kBody || (k == kBody && e < 4);
        const float a = f16_to_f32(h.e[e]) + f16_to_f32(c_b1[i].e[e]);
        v[i][e] = ok ? a : 0.f;
      }
    }
    const int l32 = threadIdx.x & 31, warp = lane >> 5;
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < kB; ++i)
#pragma unroll
      for (int e = 0; e < 8; ++e) s += v[i][e];
    s = warp_sum(s);
    if (l32 == 0) partials[0][rib][warp] = s;
    __syncthreads();
    const float mean = warp_sum(l32 < kWarps ? partials[0][rib][l32] : 0.f) * (1.f / kH);
    s = 0.f;
#pragma unroll
    for (int i = 0; i < kB; ++i) {
      const int k = i * kT + lane;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const bool ok = k < kBody || (k == kBody && e < 4);
        const float d = v[i][e] - mean;
        s += ok ? d * d : 0.f;
      }
    }
    s = warp_sum(s);
    if (l32 == 0) partials[1][rib][warp] = s;
    __syncthreads();
    const float rstd = rsqrtf(warp_sum(l32 < kWarps ? partials[1][rib][l32] : 0.f) * (1.f / kH) + 1e-05f);
    unsigned short* yr = y + (size_t)row * kH;
#pragma unroll
    for (int i = 0; i < kB; ++i) {
      const int k = i * kT + lane;
      if (!row_ok || k > kBody) continue;
      Vec<unsigned short, 8> o;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        float a = (v[i][e] - mean) * rstd;
        a = a * f16_to_f32(c_w[i].e[e]) + f16_to_f32(c_bias[i].e[e]);
        o.e[e] = f32_to_f16(a);
      }
      if (k < kBody) __stcs(reinterpret_cast<uint4*>(yr + head + 8 * k), o.raw);
      else __stcs(reinterpret_cast<uint2*>(yr + odd_col), make_uint2(o.raw.x, o.raw.y));
    }
  }
  cp_async_wait_all();
}
"""

# name: (threads a row, batch of 16-byte vectors, rows a block, stages, min blocks an SM)
VARIANTS = {
    "phase t224 b3 r1 s2": (224, 3, 1, 2, 2),
    "phase t224 b3 r1 s3": (224, 3, 1, 3, 2),
    "phase t224 b3 r1 s2 x3": (224, 3, 1, 2, 3),
    "phase t224 b3 r1 s4": (224, 3, 1, 4, 2),
    "phase t352 b2 r1 s2 x2": (352, 2, 1, 2, 2),
    "phase t672 b1 r1 s2 x2": (672, 1, 1, 2, 2),
    "phase t672 b1 r1 s3 x2": (672, 1, 1, 3, 2),
}


def source(base_source: str, hidden: int) -> tuple[str, list[str]]:
    """The generated kernel's helpers (everything before its ``#define VAL``), the
    template and one extern "C" kernel a variant."""
    helpers = base_source.split("#define VAL")[0]
    out, names = [helpers, KERNEL.replace("HIDDEN", str(hidden))], []
    for i, (t, b, r, s, m) in enumerate(VARIANTS.values()):
        name = f"phase_ln_{i}"
        names.append(name)
        out.append(
            f'extern "C" __global__ void __launch_bounds__({t * r}, {m}) {name}('
            "const unsigned short* x, const unsigned short* b0, const unsigned short* b1, "
            "const unsigned short* w, const unsigned short* bias, unsigned short* y, int rows) "
            f"{{ phase_ln<{t}, {b}, {r}, {s}>(x, b0, b1, w, bias, y, rows); }}\n")
    return "".join(out), names


def main() -> None:
    import dataclasses

    import numpy as np
    import torch
    from cupy.cuda import driver

    from lowering.kernels import normalization as nm
    from probe_common import parser, report_size, time_plans, write_results
    from runtime import jit
    from runtime import normalization as rn

    a = parser("5140", __doc__).parse_args()
    dev = torch.cuda.current_device()
    sms = rn.sm_count(torch.device("cuda", dev))
    res = []
    for hidden in (int(h) for h in a.hidden.split(",")):
        if hidden % 8 != 4:
            raise SystemExit(f"{hidden}: the probe is for hidden % 8 == 4")
        base = nm.NormalizationSpec.reference_fusion(a.rows, hidden, 1e-5)
        ours = {"ours " + base.plan.describe(): base}
        packed = dataclasses.replace(base, packed=True)
        ours.setdefault("ours " + packed.plan.describe(), packed)
        text, names = source(nm.PersistentRenderer(base).render(), hidden)
        ck = jit.compile(text, names, jit.device_arch(dev))
        kernels = jit.load(ck, dev)
        info, calls = {}, {}
        for (label, (t, b, r, st, m)), name in zip(VARIANTS.items(), names):
            sym = ck.lowered[name]
            row = info[label] = {"registers": ck.registers[sym],
                                 "spill_bytes": ck.spill_bytes.get(sym, 0)}
            if row["spill_bytes"]:
                continue
            k = kernels[name]
            smem = r * (st + 1) * t * b * 16
            k.ensure_smem(smem)
            per_sm = driver.occupancyMaxActiveBlocksPerMultiprocessor(k.function.ptr, t * r, smem)
            grid = min(sms * per_sm, -(-a.rows // r))
            if r % 2:
                grid -= grid % 2  # one phase a thread: an even grid-stride
            row.update(blocks_per_sm=per_sm, grid=grid, shared_bytes=smem)

            def launch(i, o, k=k, grid=grid, t=t, r=r, smem=smem):
                args = tuple(np.uint64(z.data_ptr()) for z in i) + (np.uint64(o.data_ptr()), np.int32(a.rows))
                k.launch_raw((grid, 1, 1), (t * r, 1, 1), args, smem,
                             jit.current_stream_handle(dev), True)

            calls[label] = launch
        info, copy_us = time_plans(a.rows, hidden, ours, a.reps, info, calls)
        res.append(report_size(hidden, info, copy_us, "registers"))
    write_results(a.out, a.rows, a.reps, res)


if __name__ == "__main__":
    main()
