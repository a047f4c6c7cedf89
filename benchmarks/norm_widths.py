"""Normalization over widths with the default plans (no tuning, fresh cache), against the
copy bandwidth of the same bytes, as a new user meets them.

    python benchmarks/norm_widths.py --json benchmarks/results/norm_widths_nvidia-h100.json

Widths: every multiple of 512 in [512, 65536] (``--step`` for fewer), ten multiples of 8
whose rows start off a 128-byte line (`OFF_LINE`) and 24 widths that are not multiples
of 8, 8192 rows, bf16; and in fp16 the widths of `FP16_WIDTHS`. Kinds: ``rms_norm`` and ``layer_norm`` forward
(the persistent normalization kernels, `runtime.normalization`) and backward (the fused
seam kernels, `runtime.fused.add_norm_backward`: dx and the weight gradient). Each is
checked against float64 first, then timed by CUDA-graph replay beside a ``copy_`` moving
the same bytes (`runtime.timing.graph_side_by_side`, rotated inputs). Rows: hidden, kind,
over_copy (copy time over ours), ours_us, copy_us (the faster of that copy,
``copy_same_us``, and the device's copy-time model for the bytes: `runtime.timing.
copy_reference_us`), tuned false, dtype; or the error a width met.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time

ODD = [7, 100, 513, 1000, 1001, 1537, 2050, 3000, 4097, 5140, 6001, 7001, 8191, 9999, 12345,
       15000, 16385, 20001, 24575, 30001, 40001, 50001, 60001, 65535]
# multiples of 8 whose rows start 16-80 bytes off a 128-byte line (every multiple of 512
# starts on one): the aligned rows the kernels' cache-line alignment is for
OFF_LINE = [1032, 2056, 4104, 8200, 12296, 20488, 30008, 40008, 50008, 60008]
# fp16 too: every eighth aligned width of the default step and five odd ones
FP16_WIDTHS = list(range(512, 65537, 8192)) + [1001, 4097, 12345, 30001, 65535]
DTYPES = {"bf16": "bfloat16", "fp16": "float16"}


def measure(kind: str, direction: str, hidden: int, rows: int = 8192,
            dtype: str = "bf16") -> dict:
    import torch

    from runtime import fused
    from runtime import normalization as rn
    from runtime.timing import copy_reference_us, graph_side_by_side, input_copies

    dev = torch.cuda.current_device()
    dt = getattr(torch, DTYPES[dtype])
    per_set = rows * hidden * 2 * (2 if direction == "forward" else 3)
    sets = input_copies(per_set, dev)
    x = [torch.randn(rows, hidden, device="cuda", dtype=dt) for _ in range(sets)]
    w = torch.randn(hidden, device="cuda", dtype=dt)
    b = torch.randn(hidden, device="cuda", dtype=dt)
    y = [torch.empty_like(t) for t in x]
    if direction == "forward":
        call = ((lambda i: rn.rms_norm(x[i], w, 1e-6, out=y[i])) if kind == "rms_norm" else
                (lambda i: rn.layer_norm(x[i], w, b, 1e-5, out=y[i])))
        call(0)
        ref = (torch.nn.functional.rms_norm(x[0].double(), (hidden,), w.double(), 1e-6)
               if kind == "rms_norm" else torch.nn.functional.layer_norm(
                   x[0].double(), (hidden,), w.double(), b.double(), 1e-5))
        got = y[0].double()
        moved = 2 * rows * hidden * 2
    else:
        dy = [torch.randn_like(t) for t in x]
        stats = [fused.add_norm_forward(t, None, w, None, 1e-6, kind) for t in x]
        call = lambda i: fused.add_norm_backward(dy[i], x[i], w, stats[i][2], stats[i][3], kind)  # noqa: E731
        dx = call(0)[0]
        h = x[0].double().requires_grad_()
        out = (torch.nn.functional.rms_norm(h, (hidden,), w.double(), 1e-6) if kind == "rms_norm"
               else torch.nn.functional.layer_norm(h, (hidden,), w.double(), None, 1e-6))
        out.backward(dy[0].double())
        ref, got = h.grad, dx.double()
        moved = 3 * rows * hidden * 2
    err = ((got - ref).norm() / ref.norm()).item()
    if not err < 2e-2:
        raise AssertionError(f"{kind} {direction} {hidden}: relative error {err:.2e}")
    src = [torch.empty(moved // 4, device="cuda", dtype=torch.float16) for _ in range(sets)]
    dst = [torch.empty_like(s) for s in src]
    t = graph_side_by_side({"ours": [lambda i=i: call(i) for i in range(sets)],
                            "copy": [lambda i=i: dst[i].copy_(src[i]) for i in range(sets)]}, reps=6)
    copy = copy_reference_us(moved, t["copy"], dev)
    return {"hidden": hidden, "kind": f"{kind} {direction}", "over_copy": copy / t["ours"],
            "ours_us": t["ours"], "copy_us": copy, "copy_same_us": t["copy"], "rel_err": err,
            "tuned": False, "dtype": dtype}


def summarize(rows: list[dict]) -> dict:
    """The bf16 rows' counts (measured, failed, aligned widths at 0.90 of copy or more)
    and, under "fp16", the fp16 rows' (with the other widths at 0.85 or more)."""
    def of(part: list[dict]) -> dict:
        ok = [r for r in part if "over_copy" in r]
        aligned = [r for r in ok if r["hidden"] % 8 == 0]
        return {"rows": len(part), "measured": len(ok),
                "failed": sum("error" in r for r in part),
                "aligned_at_least_0.90": sum(r["over_copy"] >= 0.9 for r in aligned),
                "aligned_measured": len(aligned),
                "odd_at_least_0.85": sum(r["over_copy"] >= 0.85 for r in ok
                                         if r["hidden"] % 8 and r["hidden"] >= 512),
                "odd_measured": sum(1 for r in ok if r["hidden"] % 8 and r["hidden"] >= 512)}

    summary = of([r for r in rows if r.get("dtype", "bf16") == "bf16"])
    fp16 = [r for r in rows if r.get("dtype") == "fp16"]
    if fp16:
        summary["fp16"] = of(fp16)
    return summary


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None, metavar="FILE")
    ap.add_argument("--step", type=int, default=512, help="spacing of the aligned widths")
    ap.add_argument("--budget-s", type=float, default=240)
    args = ap.parse_args(argv)
    import torch

    from hostir.jobs.results import commit
    from runtime.timing import copy_model_summary

    if not torch.cuda.is_available():
        print("norm_widths: error: needs a CUDA GPU", file=sys.stderr)
        return 7
    jobs = ([(hidden, "bf16") for hidden in list(range(512, 65537, args.step)) + OFF_LINE + ODD]
            + [(hidden, "fp16") for hidden in FP16_WIDTHS])
    rows, start = [], time.perf_counter()
    for hidden, dtype in jobs:
        for kind in ("rms_norm", "layer_norm"):
            for direction in ("forward", "backward"):
                if time.perf_counter() - start > args.budget_s:
                    rows.append({"hidden": hidden, "kind": f"{kind} {direction}",
                                 "dtype": dtype, "skipped": "over --budget-s"})
                    continue
                try:
                    rows.append(measure(kind, direction, hidden, dtype=dtype))
                except Exception as e:  # noqa: BLE001 -- a width that fails is evidence too
                    rows.append({"hidden": hidden, "kind": f"{kind} {direction}",
                                 "dtype": dtype,
                                 "error": f"{type(e).__name__}: {str(e)[:160]}"})
                torch.cuda.empty_cache()
        done = rows[-4:]  # this width's two kinds, forward and backward
        print(hidden, dtype, " ".join(f"{r['kind']}={r['over_copy']:.3f}" if "over_copy" in r
                               else f"{r['kind']}=-" for r in done), flush=True)
    summary = summarize(rows)
    print(summary)
    if args.json:
        doc = {"bench": "norm_widths", "device": torch.cuda.get_device_name(),
               "date": datetime.date.today().isoformat(), "commit": commit(),
               "method": "8192 rows, bf16 (fp16 at FP16_WIDTHS), default plans, CUDA-graph replay beside copy_ of "
                         "the same bytes, rotated inputs; copy_us: the faster of that copy "
                         "and copy_model's time (runtime.timing.copy_reference_us)",
               "copy_model": copy_model_summary(torch.cuda.current_device()),
               "summary": summary, "rows": rows}
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
