"""How deep the ring of x must be: the planner's kernel with 1..8 rows of x in flight.

benchmarks/norm_ceiling_probe.py found the persistent kernel's own shape, with its math
taken out, at 0.88-0.93 of cudaMemcpy, and a plain copy kernel keeping 128 KiB an SM in
flight at 0.91-0.97: bytes in flight, not the math, bound it. This times the planner's
plan of the reference fusion per hidden size with the x ring (``stages``) 1..8 rows deep
wherever the shared memory holds it, by cp.async and by bulk copy, beside the
device-to-device copy, in carryover-balanced rounds of CUDA-graph replays; every
variant is checked against the float64 reference first (rows with a large mean).

    python benchmarks/norm_stage_probe.py --out probe.json
    python benchmarks/norm_stage_probe.py --mode long --hidden 12288,16384,20480 --out p.json

``--mode long``: for the longest rows, the tensors in shared memory with x prefetched
into registers, or in registers beside a packed row slice, over 512-1024 threads a row
(what the register and shared-memory budgets let through).
"""

from __future__ import annotations

import dataclasses
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

SIZES = "768,1024,1280,1536,1600,2048,2560,4096,5140,12288,16384,20480"
DEPTHS = (1, 2, 3, 4, 6, 8)


def variants(spec, depths=DEPTHS):
    """(label, spec) of the planner's plan with the ring ``depths`` deep, cp.async and
    bulk, where they fit one SM's shared memory."""
    import lowering.kernels.normalization as nm

    p = spec.plan
    out = [("planner", spec)]
    if not p.persistent:
        base = dict(threads_per_row=p.threads_per_row, batch=p.batch, rows_per_block=p.rows_per_block)
        # the row-wise pick has no ring: its persistent twin (registers) gets one
        p = dataclasses.replace(spec, **base, param_cache="registers", prefetch=True,
                                x_staged=True, stages=1).plan
    pinned = dict(threads_per_row=p.threads_per_row, batch=p.batch,
                  rows_per_block=p.rows_per_block, param_cache=p.param_cache, prefetch=True,
                  x_staged=True, one_pass=p.one_pass or None, packed=p.packed or None,
                  shared_param_bytes=p.shared_param_bytes or None)
    bases = [("", pinned)]
    if spec.hidden >= 12288:
        # the longest rows: the 1-D tensors through L2, or half of them in shared memory,
        # leave the shared memory to the ring
        bases.append(("g_", dict(pinned, param_cache="global", shared_param_bytes=None, packed=None)))
        bases.append(("gs4_", dict(pinned, param_cache="global", shared_param_bytes=4, packed=None)))
    seen = {spec.plan}
    for tag, base in bases:
        for bulk in (False, True):
            for d in depths:
                try:
                    s = dataclasses.replace(spec, **base, stages=d, x_bulk=bulk or None)
                    q = s.plan
                except nm.LoweringError:
                    continue
                if q.dynamic_shared_bytes + q.shared_bytes > nm.SHARED_PER_BLOCK or q in seen:
                    continue
                seen.add(q)
                out.append((f"{tag}{'bulk' if bulk else 'cpasync'}{d}", s))
    return out


def long_row_variants(spec):
    """(label, spec) for the longest rows: the four 1-D tensors in shared memory with x
    prefetched into registers (no ring: 160 KiB of tensors at 20480 leave no room for
    one), or in registers beside a packed row slice with a ring of x."""
    import lowering.kernels.normalization as nm

    p, out, seen = spec.plan, [("planner", spec)], {spec.plan}
    vectors = -(-spec.hidden // p.vector_width)
    for t in (512, 640, 768, 1024):
        b = -(-vectors // t)
        for label, kw in (("shared_regprefetch", dict(param_cache="shared", x_staged=False)),
                          ("registers_packed", dict(param_cache="registers", x_staged=True,
                                                    packed=True, stages=1)),
                          ("registers_packed_bulk", dict(param_cache="registers", x_staged=True,
                                                         packed=True, stages=1, x_bulk=True))):
            try:
                s = dataclasses.replace(spec, threads_per_row=t, batch=b, rows_per_block=1,
                                        prefetch=True, **kw)
                q = s.plan
            except nm.LoweringError:
                continue
            if q in seen:
                continue
            seen.add(q)
            out.append((f"{label}_t{t}", s))
    return out


def main() -> None:
    from probe_common import parser, write_results

    ap = parser(SIZES, __doc__, reps=6)
    ap.add_argument("--mode", choices=("stages", "long"), default="stages")
    a = ap.parse_args()
    import lowering.kernels.normalization as nm
    from hostir.jobs.layer_norm import ROTATE_BYTES, TOLERANCE, make_inputs, relative_error
    from runtime import jit
    from runtime.autotune import graph_side_by_side
    from runtime.normalization import precompile
    from runtime import normalization as rn

    nm.MAX_STAGES = max(nm.MAX_STAGES, max(DEPTHS))
    arch = jit.device_arch()
    make = {"stages": variants, "long": long_row_variants}[a.mode]
    todo = {h: make(nm.NormalizationSpec.reference_fusion(a.rows, h, 1e-5))
            for h in (int(x) for x in a.hidden.split(","))}
    precompile([s for vs in todo.values() for _, s in vs], arch)
    res = []
    for hidden, vs in todo.items():
        spec = vs[0][1]
        sets = max(2, -(-ROTATE_BYTES // spec.bytes_moved()))
        ins = [make_inputs(a.rows, hidden) for _ in range(sets)]
        outs = [torch.empty_like(i[0]) for i in ins]
        named = lambda i: {"x": i[0], "b0": i[1], "b1": i[2], "weight": i[3], "bias": i[4]}  # noqa: E731
        ref = rn.reference(spec, named(ins[0]))
        cands, info = {"memcpy": [lambda i=i, o=o: o.copy_(i[0]) for i, o in zip(ins, outs)]}, {}
        for label, s in vs:
            entry = {"describe": s.plan.describe()}
            try:
                ck = rn.compiled_kernel(s, arch)
                entry.update(registers=ck.registers[s.kernel_name],
                             spill_bytes=ck.spill_bytes.get(s.kernel_name, 0),
                             shared_bytes=s.plan.dynamic_shared_bytes + s.plan.shared_bytes,
                             grid=rn.launch_grid(s, rn._kernel(s, 0), ins[0][0].device))
                y = rn.normalize(s, named(ins[0]), torch.full_like(ins[0][0], float("nan")))
                entry["rel_err"] = relative_error(y, ref)
                if not entry["rel_err"] < TOLERANCE:
                    raise AssertionError(f"relative error {entry['rel_err']:.2e}")
                cands[label] = [lambda i=i, o=o, s=s: rn.normalize(s, named(i), o)
                                for i, o in zip(ins, outs)]
            except Exception as e:  # noqa: BLE001 -- one variant's failure is its result
                entry["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                torch.cuda.synchronize()
            info[label] = entry
        del ref
        us = graph_side_by_side(cands, a.reps)
        copy_gbps = 4 * a.rows * hidden / (us["memcpy"] * 1e-6) / 1e9
        for label, t in us.items():
            if label != "memcpy":
                info[label].update(us=round(t, 2), over_copy=round(
                    spec.bytes_moved() / (t * 1e-6) / 1e9 / copy_gbps, 3))
        best = max((k for k in info if "us" in info[k]), key=lambda k: info[k]["over_copy"])
        row = {"hidden": hidden, "copy_gbps": round(copy_gbps, 1), "memcpy_us": round(us["memcpy"], 2),
               "best": best, "variants": info}
        print(hidden, "best", best, info[best]["describe"], info[best]["over_copy"],
              "planner", info["planner"].get("over_copy"),
              {k: v.get("over_copy") for k, v in info.items()}, flush=True)
        res.append(row)
        del cands, ins, outs
        torch.cuda.empty_cache()
    write_results(a.out, a.rows, a.reps, res, method=(
        "CUDA-graph replays (48 launches, input sets rotated past L2), "
        f"{a.reps}+ carryover-balanced rounds with the copy, median"))


if __name__ == "__main__":
    main()
