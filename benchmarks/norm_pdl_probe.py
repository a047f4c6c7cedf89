"""What a launch costs between two back-to-back normalization kernels, and how much of it
programmatic dependent launch (PDL) takes back.

The bench times 48 back-to-back launches in a CUDA graph. Between two launches the GPU
drains the first kernel (its last rows run on part of the SMs), launches the next and
ramps it up; the copy engine's copy has its own gap. This probe measures:

- the per-launch time of an empty kernel in such a graph, plain and as a programmatic
  dependent launch (the floor of the gap);
- for each size: the plan given (by default the tuned plans of the committed bench file),
  launched plain (``plain``) and as a programmatic dependent launch (``pdl_launch``,
  `runtime.jit.launch_ex`); copy_ and the SM copy, all side by side, at 8192 rows and at
  ``--long-rows`` (the same per-launch cost over 4x the bytes shows as the difference
  between the two ratios). Every generated kernel begins with
  ``griddepcontrol.launch_dependents`` and ``griddepcontrol.wait``
  (``dependent_launch_entry``); ``--strip-entry`` also times the kernel without them,
  launched plain (``no_entry``: what the two instructions cost).

At 6b44bd1 the kernels had no entry yet and the probe inserted it (``pdl_plain`` was
the inserted kernel launched plain): norm_pdl_probe_nvidia-h200.json.

Every variant is checked against float64 first (NaN-poisoned output).

    python benchmarks/norm_pdl_probe.py --out probe.json
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

ENTRY = "  dependent_launch_entry();\n"
EMPTY = r"""
extern "C" __global__ void hostir_empty(int* p) { if (p[0] == 12345) p[1] = 1; }
extern "C" __global__ void hostir_empty_pdl(int* p) {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");
  if (p[0] == 12345) p[1] = 1;
}
"""


def without_entry(source: str) -> str:
    """``source`` with its kernel's call of ``dependent_launch_entry`` removed."""
    if source.count(ENTRY) != 1:
        raise ValueError("expected one dependent_launch_entry() call in the kernel")
    return source.replace(ENTRY, "")


def tuned_plans(path: str) -> dict:
    from lowering.kernels.normalization import LaunchPlan

    fields = {f.name for f in dataclasses.fields(LaunchPlan)}
    doc = json.load(open(path))
    return {r["hidden"]: LaunchPlan(**{k: v for k, v in r["plan"].items() if k in fields})
            for r in doc["results"] if "plan" in r}


def main() -> None:
    import numpy as np
    import torch

    from probe_common import parser, write_results
    from hostir.jobs.layer_norm import (ROTATE_BYTES, TOLERANCE, make_inputs, relative_error,
                                        sm_copy)
    from lowering.kernels.normalization import (NormalizationSpec, render_normalization,
                                                spec_with_plan)
    from runtime import jit
    from runtime import normalization as rn
    from runtime.autotune import graph_side_by_side

    ap = parser("768,1024,1280,1536,1600,2048,2560,4096,5140,12288,16384,20480", __doc__)
    ap.add_argument("--plans", default="benchmarks/results/layer_norm_nvidia-h200.json",
                    help="bench results whose 'plan' per size is timed")
    ap.add_argument("--long-rows", type=int, default=32768)
    ap.add_argument("--long-hidden", default="1280,1600,5140,20480")
    ap.add_argument("--strip-entry", action="store_true",
                    help="also time the kernel without its griddepcontrol entry")
    a = ap.parse_args()
    dev = torch.cuda.current_device()
    arch = jit.device_arch(dev)

    # the floor: an empty kernel, 48 launches a graph
    empty = jit.load(jit.kernel_cache().get(EMPTY, ["hostir_empty", "hostir_empty_pdl"], arch), dev)
    buf = torch.zeros(4, dtype=torch.int32, device="cuda")
    arg = (np.uint64(buf.data_ptr()),)
    stream = lambda: jit.current_stream_handle(dev)  # noqa: E731
    floor = graph_side_by_side({
        "plain": [lambda: empty["hostir_empty"].launch_raw((132, 1, 1), (128, 1, 1), arg, 0, stream())],
        "pdl": [lambda: empty["hostir_empty_pdl"].launch_raw((132, 1, 1), (128, 1, 1), arg, 0,
                                                            stream(), dependent=True)],
    }, a.reps)
    print("empty kernel, us a launch:", json.dumps(floor), flush=True)

    plans = tuned_plans(a.plans)
    runs = [(int(h), a.rows) for h in a.hidden.split(",")]
    runs += [(int(h), a.long_rows) for h in a.long_hidden.split(",")]
    results = []
    for hidden, rows in runs:
        base = NormalizationSpec.reference_fusion(rows, hidden, 1e-5)
        spec = spec_with_plan(base, plans[hidden]) if hidden in plans else base
        name = spec.kernel_name
        kernels = {"plain": rn._kernel(spec, dev)}
        ck = rn.compiled_kernel(spec, arch)
        kinds = ("plain", "pdl_launch")
        if a.strip_entry:
            stripped = jit.kernel_cache().get(without_entry(render_normalization(spec)), [name], arch)
            kernels["no_entry"] = jit.load(stripped, dev)[name]
            kinds += ("no_entry",)
        grid = (rn.launch_grid(spec, kernels["plain"], torch.device("cuda", dev)), 1, 1)
        block, smem = (spec.plan.block_threads, 1, 1), spec.plan.dynamic_shared_bytes
        sets = max(2, -(-ROTATE_BYTES // spec.bytes_moved()))
        ins = [make_inputs(rows, hidden) for _ in range(sets)]
        outs = [torch.empty_like(i[0]) for i in ins]

        def args(i, o):
            return tuple(np.uint64(t.data_ptr()) for t in (*i, o)) + (np.int32(rows),)

        def call(kind, i, o):
            if kind == "pdl_launch":
                return lambda: kernels["plain"].launch_raw(grid, block, args(i, o), smem,
                                                           stream(), dependent=True)
            k = kernels[kind]
            return lambda: k.launch_raw(grid, block, args(i, o), smem, stream())

        named = {"x": ins[0][0], "b0": ins[0][1], "b1": ins[0][2], "weight": ins[0][3],
                 "bias": ins[0][4]}
        ref = rn.reference(spec, named)
        row = {"hidden": hidden, "rows": rows, "plan": spec.plan.describe(), "grid": grid[0],
               "registers": ck.registers[name], "spill_bytes": ck.spill_bytes.get(name, 0)}
        for kind in kinds:
            outs[0].fill_(float("nan"))
            call(kind, ins[0], outs[0])()
            torch.cuda.synchronize()
            row[f"rel_err_{kind}"] = relative_error(outs[0], ref)
            if not row[f"rel_err_{kind}"] < TOLERANCE:
                raise AssertionError(f"{kind} at {hidden}: {row[f'rel_err_{kind}']:.2e}")
        del ref
        cands = {kind: [call(kind, i, o) for i, o in zip(ins, outs)] for kind in kinds}
        cands["copy"] = [lambda i=i, o=o: o.copy_(i[0]) for i, o in zip(ins, outs)]
        cands["sm_copy"] = [lambda i=i, o=o: sm_copy(i[0], o) for i, o in zip(ins, outs)]
        us = graph_side_by_side(cands, a.reps)
        copy_gbps = 4 * rows * hidden / (us["copy"] * 1e-6) / 1e9
        row["us"] = {k: round(v, 2) for k, v in us.items()}
        row["over_copy"] = {k: round(spec.bytes_moved() / (us[k] * 1e-6) / 1e9 / copy_gbps, 3)
                            for k in kinds}
        row["sm_copy_over_copy"] = round(us["copy"] / us["sm_copy"], 3)
        print(json.dumps(row), flush=True)
        results.append(row)
        del cands, ins, outs
        torch.cuda.empty_cache()
    write_results(a.out, a.rows, a.reps, results, empty_kernel_us=floor,
                  method="CUDA-graph replays (48 launches, input sets rotated past L2), "
                         f"{a.reps}+ carryover-balanced rounds, median; plans from {a.plans}")


if __name__ == "__main__":
    main()
