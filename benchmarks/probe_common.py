"""What the normalization probes share: their arguments, a set of specs of one hidden
size timed side by side with copy_ (each checked first), the run over every size and its
report, plans built under a register estimate of the probe's choosing, and the results
file.

    from probe_common import parser, time_sizes
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import time

import torch


def parser(hidden: str, doc: str | None = None, reps: int = 12) -> argparse.ArgumentParser:
    """--hidden (comma-separated, default ``hidden``), --rows, --reps, --out."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", default=hidden)
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=reps, help="side-by-side rounds")
    ap.add_argument("--out", required=True)
    return ap


def plan_overrides(text: str) -> dict:
    """``name=value,...`` (a probe's --plan) as spec overrides: ints, floats, true/false,
    else strings. ``"param_cache=none,blocks_per_sm=5"`` -> that dict."""
    def value(v: str):
        for cast in (int, float):
            try:
                return cast(v)
            except ValueError:
                pass
        return {"true": True, "false": False}.get(v.lower(), v)

    return {k: value(v) for k, v in (kv.split("=", 1) for kv in text.split(",") if kv)}


def time_plans(rows: int, hidden: int, specs: dict, reps: int, info: dict | None = None,
               calls: dict | None = None):
    """Time ``specs`` (label -> NormalizationSpec of the reference fusion at ``rows`` x
    ``hidden``) side by side with ``copy_`` in carryover-balanced rounds of CUDA-graph
    replays, on input sets rotated past L2. Each spec is compiled first (registers and
    spills recorded; one that spills is not timed) and checked against float64 on rows
    with a large mean (NaN-poisoned output; an error over the tolerance raises).
    ``calls`` (label -> fn(inputs, out), inputs the list x, b0, b1, weight, bias) are
    kernels that are no spec (a probe's hand-written ones), checked and timed alike;
    what they compiled to is the caller's to record in ``info``.
    Returns (label -> {describe, registers, spill_bytes, rel_err, grid, us, over_copy},
    copy_ microseconds); ``info`` (label -> dict) is merged in."""
    from hostir.jobs.layer_norm import ROTATE_BYTES, TOLERANCE, make_inputs, relative_error
    from runtime import normalization as rn
    from runtime.autotune import graph_side_by_side

    info = {k: dict(v) for k, v in (info or {}).items()}
    first = next(iter(specs.values()))
    sets = max(2, -(-ROTATE_BYTES // first.bytes_moved()))
    ins = [make_inputs(rows, hidden) for _ in range(sets)]
    outs = [torch.empty_like(i[0]) for i in ins]
    named = lambda i: {"x": i[0], "b0": i[1], "b1": i[2], "weight": i[3], "bias": i[4]}  # noqa: E731
    ref = rn.reference(first, named(ins[0]))
    timed = {}
    for label, s in specs.items():
        ck = rn.compiled_kernel(s)
        row = info.setdefault(label, {})
        row.update(describe=s.plan.describe(), registers=ck.registers[s.kernel_name],
                   spill_bytes=ck.spill_bytes.get(s.kernel_name, 0))
        if row["spill_bytes"]:
            continue
        row["grid"] = rn.launch_grid(s, rn._kernel(s, ins[0][0].get_device()), ins[0][0].device)
        timed[label] = lambda i, o, s=s: rn.normalize(s, named(i), o)
    timed.update(calls or {})
    cands = {"copy": [lambda i=i, o=o: o.copy_(i[0]) for i, o in zip(ins, outs)]}
    for label, call in timed.items():
        row = info.setdefault(label, {})
        y = torch.full_like(outs[0], float("nan"))
        call(ins[0], y)
        row["rel_err"] = relative_error(y, ref)
        if not row["rel_err"] < TOLERANCE:
            raise AssertionError(f"{label} at {hidden}: relative error {row['rel_err']:.2e}")
        cands[label] = [lambda i=i, o=o, f=call: f(i, o) for i, o in zip(ins, outs)]
    del ref
    us = graph_side_by_side(cands, reps)
    copy_gbps = 4 * rows * hidden / (us["copy"] * 1e-6) / 1e9
    for label in timed:
        info[label]["us"] = round(us[label], 2)
        info[label]["over_copy"] = round(
            first.bytes_moved() / (us[label] * 1e-6) / 1e9 / copy_gbps, 3)
    del cands, ins, outs
    torch.cuda.empty_cache()
    return info, us["copy"]


def time_sizes(a, build, shown: str, **extra) -> list:
    """The probes' common run: for each size of ``a.hidden`` (comma-separated),
    ``build(hidden)`` gives (label -> spec, label -> info), `time_plans` times them with
    copy_, `report_size` prints the size (showing the field ``shown``); the results file
    goes to ``a.out`` (`write_results`, ``extra`` added). Returns the results rows."""
    res = []
    for hidden in (int(h) for h in a.hidden.split(",")):
        specs, info = build(hidden)
        info, copy_us = time_plans(a.rows, hidden, specs, a.reps, info)
        res.append(report_size(hidden, info, copy_us, shown))
    write_results(a.out, a.rows, a.reps, res, **extra)
    return res


def report_size(hidden: int, info: dict, copy_us: float, shown: str) -> dict:
    """Print one size's plans (over copy, and the field ``shown``); its results row."""
    print(hidden, json.dumps({k: (v.get("over_copy"), v.get(shown)) for k, v in info.items()}),
          flush=True)
    return {"hidden": hidden, "copy_us": round(copy_us, 2), "plans": info}


@contextlib.contextmanager
def register_estimate(estimate: int):
    """Inside, every persistent plan built takes ``estimate`` registers as its estimate
    (`persistent_register_estimate`), whatever its shape: the plans the estimate keeps
    out, or a higher block promise. Build the probe's specs inside with `built`."""
    import lowering.kernels.normalization as nm

    real = nm.persistent_register_estimate
    nm.persistent_register_estimate = lambda *a, **k: estimate
    try:
        yield
    finally:
        nm.persistent_register_estimate = real


def built(spec):
    """``spec``, its plan and its rows=1 twin's (what the kernel's name and cache key are
    made from) built now, so that both stay cached as built (`register_estimate`)."""
    spec.plan  # noqa: B018
    dataclasses.replace(spec, rows=1).plan  # noqa: B018
    return spec


def write_results(path: str, rows: int, reps: int, results: list, method: str | None = None,
                  **extra) -> None:
    """The probe's results file: device, date, commit (HOSTIR_COMMIT), rows, method (by
    default: graph replays in carryover-balanced rounds with copy_)."""
    method = method or ("CUDA-graph replays (48 launches, input sets rotated past L2), "
                        f"{reps}+ carryover-balanced rounds with copy_, median")
    with open(path, "w") as fh:
        json.dump({"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"),
                   "commit": os.environ.get("HOSTIR_COMMIT", "unknown"), "rows": rows, **extra,
                   "method": method, "results": results}, fh, indent=1)
