"""The transformer-seam kernels (runtime.fused) on one GPU, beside torch eager and copy_.

For each hidden size and op: our fused kernel, torch's eager equivalent and a
device-to-device ``copy_`` of the same bytes (half read, half written), timed side by
side in carryover-balanced rounds of CUDA-graph replays (`runtime.autotune.
graph_side_by_side`), each call on the next of >= 4 input sets whose total is past 4x
the L2, so that every call reads from HBM. Before timing, every op's result is checked
against float64 (the bench exits 1 on a wrong result). ``over_copy`` = copy_us / ours_us:
the fraction of copy bandwidth the kernel reaches on the bytes it must move (1.0 = as fast
as copy); copy_us is the faster of the same bytes' copy as timed (``copy_same_us``) and
the device's copy-time model for those bytes (``copy_model``, `runtime.timing.
copy_reference_us`: some byte counts are copied on a path two thirds as fast). The norm
backward's time includes its column reduce of the per-CTA weight-gradient partials.

    python benchmarks/seams_bench.py --json benchmarks/results/seams_nvidia-h100.json
    python benchmarks/seams_bench.py --hidden 4096 --ops add_rms_norm_fwd --reps 5

Ops: add_{rms,layer}_norm_{fwd,bwd} (residual add + norm; the backward with dh),
swiglu_{fwd,bwd}, gelu_{fwd,bwd} (tanh), over [rows, hidden] tensors.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hostir.jobs.results import commit  # noqa: E402
from runtime import fused  # noqa: E402

OPS = ("add_rms_norm_fwd", "add_rms_norm_bwd", "add_layer_norm_fwd", "add_layer_norm_bwd",
       "swiglu_fwd", "swiglu_bwd", "gelu_fwd", "gelu_bwd")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
DEVICE = "cuda"
ROTATE_BYTES = 256 << 20  # > 4x the 60 MB L2 of an H200 (50 MB on an H100)
MIN_SETS = 4
EPS = 1e-5
# |ours - float64| <= TOL * max|float64| (bf16 / fp16 rounding of the output, with room)
TOL = {torch.bfloat16: 2e-2, torch.float16: 4e-3}
SWEEP_THREADS = (256, 512, 1024, 2048)
TARGET = 0.85  # of copy bandwidth: the norm kernels' goal at hidden 4096 and 8192


def _kind(op: str) -> str:
    return "rms_norm" if "rms" in op else "layer_norm"


def make_set(op: str, rows: int, hidden: int, dtype, gen) -> dict:
    """One input set of ``op`` (tensors by name; backward ops carry the forward's saved
    values, computed by the fused forward)."""
    def rnd(*shape, scale=1.0, shift=0.0):
        return (torch.randn(*shape, device=DEVICE, generator=gen) * scale + shift).to(dtype)

    if op.startswith("add_"):
        kind = _kind(op)
        t = {"x": rnd(rows, hidden), "r": rnd(rows, hidden), "w": rnd(hidden, scale=0.3, shift=1.0),
             "b": rnd(hidden) if kind == "layer_norm" else None}
        if op.endswith("bwd"):
            with torch.no_grad():
                _, h, mean, rstd = fused.add_norm_forward(t["x"], t["r"], t["w"], t["b"], EPS, kind)
            t = {"dy": rnd(rows, hidden), "h": h, "w": t["w"], "b": t["b"], "mean": mean,
                 "rstd": rstd, "dh": rnd(rows, hidden)}
        return t
    if op.startswith("swiglu"):
        t = {"gate": rnd(rows, hidden, scale=2.0), "up": rnd(rows, hidden)}
    else:
        t = {"x": rnd(rows, hidden, scale=2.0)}
    if op.endswith("bwd"):
        t["d"] = rnd(rows, hidden)
    return t


def ours(op: str, t: dict):
    if op.startswith("add_"):
        if op.endswith("fwd"):
            return fused.add_norm_forward(t["x"], t["r"], t["w"], t["b"], EPS, _kind(op))
        return fused.add_norm_backward(t["dy"], t["h"], t["w"], t["mean"], t["rstd"], _kind(op),
                                       t["dh"])
    return {"swiglu_fwd": lambda: fused.swiglu_forward(t["gate"], t["up"]),
            "swiglu_bwd": lambda: fused.swiglu_backward(t["d"], t["gate"], t["up"]),
            "gelu_fwd": lambda: fused.gelu_forward(t["x"]),
            "gelu_bwd": lambda: fused.gelu_backward(t["d"], t["x"])}[op]()


def torch_eager(op: str, t: dict):
    """What a torch user runs for the same result: torch's fused norm kernels (aten's
    rms / layer norm forward and backward), silu / gelu and their aten backwards."""
    aten, F = torch.ops.aten, torch.nn.functional
    if op.startswith("add_"):
        hidden = t["w"].shape[0]
        if op == "add_rms_norm_fwd":
            h = t["x"] + t["r"]
            return h, aten._fused_rms_norm(h, [hidden], t["w"], EPS)
        if op == "add_layer_norm_fwd":
            h = t["x"] + t["r"]
            return h, aten.native_layer_norm(h, [hidden], t["w"], t["b"], EPS)
        if op == "add_rms_norm_bwd":
            try:
                dx, dw = aten._fused_rms_norm_backward(t["dy"], t["h"], [hidden], t["rstd_t"],
                                                       t["w"], [True, True])
            except NotImplementedError:  # a build without it: the eager decomposition
                dx, dw, _ = fused.add_norm_backward_reference(t["dy"], t["h"], t["w"], None,
                                                              t["rstd"], "rms_norm")
            return dx + t["dh"], dw
        dx, dw, db = aten.native_layer_norm_backward(t["dy"], t["h"], [hidden], t["mean_t"],
                                                     t["rstd_t"], t["w"], t["b"],
                                                     [True, True, True])
        return dx + t["dh"], dw, db
    if op == "swiglu_fwd":
        return F.silu(t["gate"]) * t["up"]
    if op == "swiglu_bwd":
        return aten.silu_backward(t["d"] * t["up"], t["gate"]), t["d"] * F.silu(t["gate"])
    if op == "gelu_fwd":
        return F.gelu(t["x"], approximate="tanh")
    return aten.gelu_backward(t["d"], t["x"], approximate="tanh")


def prepare_torch(op: str, t: dict) -> None:
    """The statistics aten's backwards take, from aten's own forwards (their shapes and
    dtypes are aten's business)."""
    if op.startswith("add_") and op.endswith("bwd"):
        aten, hidden = torch.ops.aten, t["w"].shape[0]
        if op == "add_rms_norm_bwd":
            _, t["rstd_t"] = aten._fused_rms_norm(t["h"], [hidden], t["w"], EPS)
        else:
            _, t["mean_t"], t["rstd_t"] = aten.native_layer_norm(t["h"], [hidden], t["w"],
                                                                 t["b"], EPS)


def bytes_moved(op: str, rows: int, hidden: int, dtype) -> int:
    e = torch.tensor([], dtype=dtype).element_size()
    n = rows * hidden
    if op.startswith("add_"):
        layer = "layer" in op
        stats = 4 * rows * (2 if layer else 1)
        params = hidden * e * (2 if layer else 1)
        if op.endswith("fwd"):  # x, r in; h, y out; weights
            return 4 * n * e + params + stats
        return 4 * n * e + 2 * params + stats  # dy, h, dh in; dx out; w in, dw (db) out
    streams = {"swiglu_fwd": 3, "swiglu_bwd": 5, "gelu_fwd": 2, "gelu_bwd": 3}[op]
    return streams * n * e


def reference64(op: str, t: dict):
    """The float64 result(s) ``ours`` is checked against (the contract's math)."""
    d = {k: (v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v)
         for k, v in t.items()}
    name = {"fwd": "forward", "bwd": "backward"}[op[-3:]]
    if op.startswith("add_"):
        if name == "forward":
            y, h, _, _ = fused.add_norm_forward_reference(d["x"], d["r"], d["w"], d["b"], EPS,
                                                          _kind(op))
            return [y, h]
        dx, dw, db = fused.add_norm_backward_reference(d["dy"], d["h"], d["w"], d["mean"],
                                                       d["rstd"], _kind(op), d["dh"])
        return [dx, dw] + ([db] if db is not None else [])
    fn = getattr(fused, f"{op.split('_')[0]}_{name}_reference")
    args = {"swiglu_fwd": ("gate", "up"), "swiglu_bwd": ("d", "gate", "up"),
            "gelu_fwd": ("x",), "gelu_bwd": ("d", "x")}[op]
    out = fn(*(d[a] for a in args))
    return list(out) if isinstance(out, tuple) else [out]


def check(op: str, t: dict, hidden: int) -> float:
    """Largest error of ``ours`` against float64, over max|reference|; raises when over TOL."""
    got = ours(op, t)
    got = [g for g in (got if isinstance(got, tuple) else (got,)) if g is not None]
    if op.startswith("add_") and op.endswith("fwd"):
        got = got[:2]  # y, h (mean / rstd enter the backward's check)
    want = reference64(op, t)
    worst = 0.0
    for g, w in zip(got, want):
        err = ((g.double() - w).abs().max() / w.abs().max().clamp_min(1e-30)).item()
        worst = max(worst, err if math.isfinite(err) else math.inf)
    if not worst <= TOL[g.dtype]:
        raise RuntimeError(f"{op} at hidden {hidden}: relative error {worst:.3g} over {TOL[g.dtype]}")
    return worst


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--hidden", default="1024,2048,4096,5120,8192,16384")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--reps", type=int, default=9, help="side-by-side rounds")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--sweep", action="store_true",
                    help="also time the norm kernels at other persistent-grid sizes "
                         f"(threads per SM {SWEEP_THREADS}) and the norm backward under "
                         "each plan rule that plans otherwise, side by side; row fields "
                         "'sweep', 'plans', 'rules_us'")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("hostir seams_bench: error: needs a CUDA GPU", file=sys.stderr)
        return 1
    ops = [o for o in args.ops.split(",") if o]
    unknown = sorted(set(ops) - set(OPS))
    if unknown:
        print(f"hostir seams_bench: error: unknown op(s) {unknown}; expected some of {OPS}",
              file=sys.stderr)
        return 1
    from runtime.autotune import graph_side_by_side
    from runtime.timing import copy_model_summary, copy_reference_us

    dtype = DTYPES[args.dtype]
    torch.set_grad_enabled(False)
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows_out = []
    for hidden in (int(h) for h in args.hidden.split(",") if h):
        for op in ops:
            nbytes = bytes_moved(op, args.rows, hidden, dtype)
            sets = [make_set(op, args.rows, hidden, dtype, gen)
                    for _ in range(max(MIN_SETS, -(-ROTATE_BYTES // nbytes)))]
            first = sets[0]
            kernel = _kernel_path(op, first)
            if not kernel:
                print(f"hostir seams_bench: error: {op} at hidden {hidden} did not take the "
                      f"fused kernel", file=sys.stderr)
                return 1
            try:
                err = check(op, first, hidden)
            except RuntimeError as e:
                print(f"hostir seams_bench: error: {e}", file=sys.stderr)
                return 1
            half = nbytes // 2
            src = [torch.empty(half, dtype=torch.uint8, device="cuda") for _ in sets]
            dst = [torch.empty(half, dtype=torch.uint8, device="cuda") for _ in sets]
            calls = {"ours": [(lambda t=t: ours(op, t)) for t in sets],
                     "copy": [(lambda s=s, d=d: d.copy_(s)) for s, d in zip(src, dst)]}
            plans = {}
            if args.sweep and op.startswith("add_"):
                for threads in SWEEP_THREADS:
                    calls[f"t{threads}"] = [(lambda t=t, n=threads: _with_grid(n, op, t))
                                            for t in sets]
                if op.endswith("bwd"):  # the other plan rules, where their plan differs
                    plans = _backward_plans(op, first)
                    default = plans[fused.seams.DEFAULT_BACKWARD_RULE]
                    for rule in plans:
                        if plans[rule] != default:
                            try:
                                check_rule(op, first, hidden, rule)
                            except RuntimeError as e:
                                print(f"hostir seams_bench: error: {e}", file=sys.stderr)
                                return 1
                            calls[f"rule_{rule}"] = [(lambda t=t, r=rule: _with_rule(r, op, t))
                                                     for t in sets]
            try:
                for t in sets:
                    prepare_torch(op, t)
                torch_eager(op, first)
                calls["torch"] = [(lambda t=t: torch_eager(op, t)) for t in sets]
            except (RuntimeError, NotImplementedError, AttributeError) as e:
                print(f"  torch eager {op} unavailable: {e}", file=sys.stderr)
            us = graph_side_by_side(calls, args.reps)
            us["copy_same"] = us["copy"]  # the same bytes' copy as timed
            us["copy"] = copy_reference_us(nbytes, us["copy"], torch.cuda.current_device())
            row = {"op": op, "hidden": hidden, "dtype": args.dtype, "rows": args.rows,
                   "bytes": nbytes, "ours_us": round(us["ours"], 3),
                   "torch_us": round(us["torch"], 3) if "torch" in us else None,
                   "copy_us": round(us["copy"], 3), "copy_same_us": round(us["copy_same"], 3),
                   "over_copy": round(us["copy"] / us["ours"], 4),
                   "torch_over_copy": round(us["copy"] / us["torch"], 4) if "torch" in us else None,
                   "ours_gbps": round(nbytes / us["ours"] / 1e3, 1),
                   "rel_err": float(f"{err:.3g}")}
            if any(k.startswith("t") and k[1:].isdigit() for k in us):
                row["sweep"] = {k[1:]: round(v, 3) for k, v in us.items()
                                if k.startswith("t") and k[1:].isdigit()}
                row["sweep_default"] = (fused.BACKWARD_THREADS_PER_SM if op.endswith("bwd")
                                        else fused.FORWARD_THREADS_PER_SM)
            if plans:  # each rule's plan, and the time of those that differ from the default
                row["plans"] = plans
                row["rules_us"] = {k[5:]: round(v, 3) for k, v in us.items()
                                   if k.startswith("rule_")}
            rows_out.append(row)
            print(f"{op:<20} {hidden:>6} {row['ours_us']:>9.2f} us {row['ours_gbps']:>7.1f} GB/s "
                  f"over_copy {row['over_copy']:.3f}  torch {row['torch_us']} us"
                  + (f"  sweep {row['sweep']}" if "sweep" in row else "")
                  + (f"  rules {row['rules_us']}" if row.get("rules_us") else ""), flush=True)
            del sets, src, dst, calls
            torch.cuda.empty_cache()
    device = torch.cuda.get_device_name()
    result = {"device": device, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(
        timespec="seconds"), "commit": commit(), "torch": torch.__version__,
        "copy_model": copy_model_summary(torch.cuda.current_device()),
        "rows": rows_out}
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    print(f"\n{device}, {args.rows} rows, {args.dtype}; over_copy = copy_us / ours_us")
    print(f"{'op':<20} {'hidden':>6} {'ours_us':>9} {'torch_us':>9} {'copy_us':>9} "
          f"{'over_copy':>9} {'torch/copy':>10}")
    short = []
    for r in rows_out:
        tu = f"{r['torch_us']:9.2f}" if r["torch_us"] is not None else f"{'-':>9}"
        tc = f"{r['torch_over_copy']:10.3f}" if r["torch_over_copy"] is not None else f"{'-':>10}"
        print(f"{r['op']:<20} {r['hidden']:>6} {r['ours_us']:9.2f} {tu} {r['copy_us']:9.2f} "
              f"{r['over_copy']:9.3f} {tc}")
        if "norm" in r["op"] and r["hidden"] in (4096, 8192) and r["over_copy"] < TARGET:
            short.append(f"{r['op']}@{r['hidden']} {r['over_copy']:.3f}")
    print("norm target (>= %.2f of copy at 4096 / 8192): %s"
          % (TARGET, "met" if not short else "missed: " + ", ".join(short)))
    return 0


def _with_grid(threads_per_sm: int, op: str, t: dict):
    """The fused norm kernel of ``op`` with its persistent grid sized for
    ``threads_per_sm`` threads an SM."""
    if op.endswith("fwd"):
        return fused.add_norm_forward_fused(t["x"], t["r"], t["w"], t["b"], EPS, _kind(op),
                                            threads_per_sm=threads_per_sm)
    return fused.add_norm_backward_fused(t["dy"], t["h"], t["w"], t["mean"], t["rstd"],
                                         _kind(op), t["dh"], threads_per_sm=threads_per_sm)


def _with_rule(rule: str, op: str, t: dict):
    """The fused norm backward of ``op`` planned by ``rule`` (seams.BACKWARD_RULES)."""
    return fused.add_norm_backward_fused(t["dy"], t["h"], t["w"], t["mean"], t["rstd"],
                                         _kind(op), t["dh"], rule=rule)


def _backward_plans(op: str, t: dict) -> dict:
    """Each backward rule's plan of ``op`` on these tensors, described."""
    from lowering.kernels import seams

    h = t["h"]
    align = fused._alignment_of(t["dy"].data_ptr() | h.data_ptr() | t["w"].data_ptr()
                                | t["dh"].data_ptr())
    return {rule: fused._backward_spec(_kind(op), h.dtype, h.shape[-1], True, align,
                                       h.get_device(), rule).plan.describe()
            for rule in seams.BACKWARD_RULES}


def check_rule(op: str, t: dict, hidden: int, rule: str) -> None:
    """``rule``'s kernel against the default's result (exits through RuntimeError)."""
    want = ours(op, t)
    got = _with_rule(rule, op, t)
    for g, w in zip(got, want):
        if g is not None and not torch.allclose(g.float(), w.float(), rtol=1e-2, atol=1e-2):
            raise RuntimeError(f"{op} at hidden {hidden}: rule {rule} differs from the default")


def _kernel_path(op: str, t: dict) -> bool:
    if op.startswith("add_"):
        if op.endswith("fwd"):
            return fused.kernel_path("add_norm_forward", t["x"], t["r"], t["w"], t["b"], EPS, _kind(op))
        return fused.kernel_path("add_norm_backward", t["dy"], t["h"], t["w"], t["mean"],
                                 t["rstd"], _kind(op), t["dh"])
    name = {"fwd": "forward", "bwd": "backward"}[op[-3:]]
    args = {"swiglu_fwd": ("gate", "up"), "swiglu_bwd": ("d", "gate", "up"),
            "gelu_fwd": ("x",), "gelu_bwd": ("d", "x")}[op]
    return fused.kernel_path(f"{op.split('_')[0]}_{name}", *(t[a] for a in args))


if __name__ == "__main__":
    sys.exit(main())
