"""Where the tensor-parallel MLP step spends its time beyond its GEMMs: a kernel trace.

Runs under the launcher like the bench (one process per GPU):

    mpirun -np 2 python benchmarks/trace_tp_step.py --out trace_dir

For the bench's default block (``hostir.run train_mlp --bench --activation gelu_tanh``:
the fused MLP, the ring over the copy engine, one stage) and for the six GEMMs alone (the
bench's ideal), it records a few steps with torch.profiler on every rank and reports per
step: the wall time on the GPU (first kernel start to last kernel end), the summed time of
the GEMM kernels, of the other kernels (by name) and of the copies, the time when no
kernel runs at all (waits on a peer or the host), and the time when two GEMMs overlap.
Every kernel of one step, with its stream and start, goes to ``steps_rank<r>.json``; the
summary to ``trace_rank<r>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

GEMM = re.compile(r"gemm|nvjet|xmma|cutlass|sm90_|sm80_|Kernel2", re.I)


def _intervals_union(iv):
    total, end = 0.0, -1e30
    for s, e in sorted(iv):
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total


def _overlap_of_two(iv):
    """Time when at least two of the intervals run at once."""
    pts = sorted([(s, 1) for s, _ in iv] + [(e, -1) for _, e in iv])
    depth, last, both = 0, None, 0.0
    for t, d in pts:
        if depth >= 2 and last is not None:
            both += t - last
        depth += d
        last = t
    return both


def analyse(events):
    """events: chrome-trace GPU events of one step (kernels and copies)."""
    t0 = min(e["ts"] for e in events)
    t1 = max(e["ts"] + e["dur"] for e in events)
    kernels = [e for e in events if e.get("cat") == "kernel"]
    copies = [e for e in events if e.get("cat") == "gpu_memcpy"]
    gemms = [e for e in kernels if GEMM.search(e["name"])]
    others = [e for e in kernels if not GEMM.search(e["name"])]
    by_name: dict = {}
    for e in others:
        short = e["name"][:90]
        n, d = by_name.get(short, (0, 0.0))
        by_name[short] = (n + 1, d + e["dur"])
    gemm_iv = [(e["ts"], e["ts"] + e["dur"]) for e in gemms]
    kern_iv = [(e["ts"], e["ts"] + e["dur"]) for e in kernels]
    return {
        "wall_ms": (t1 - t0) / 1e3,
        "gemm_sum_ms": sum(e["dur"] for e in gemms) / 1e3,
        "gemm_count": len(gemms),
        "gemm_busy_ms": _intervals_union(gemm_iv) / 1e3,
        "gemm_overlap_ms": _overlap_of_two(gemm_iv) / 1e3,
        "other_kernels_ms": sum(e["dur"] for e in others) / 1e3,
        "no_kernel_ms": (t1 - t0 - _intervals_union(kern_iv)) / 1e3,
        "copies_ms": sum(e["dur"] for e in copies) / 1e3,
        "copies_bytes": sum(int(e.get("args", {}).get("bytes", 0)) for e in copies),
        "others": sorted(([k, n, d / 1e3] for k, (n, d) in by_name.items()),
                         key=lambda r: -r[2]),
        "gemms_ms": [[e["name"][:60], e["args"].get("stream"), round(e["dur"] / 1e3, 4)]
                     for e in sorted(gemms, key=lambda e: e["ts"])],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=8192)
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--variant", action="append", default=[],
                    help="name=stages,streams,comm,schedule,fused (repeatable); default: the "
                         "bench's default block")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    from hostir.jobs import train_mlp as tm
    from hostir.nn import ColumnParallelLinear, RowParallelLinear

    args = tm.parse(["--bench", "--hidden", str(a.hidden), "--tokens", str(a.tokens),
                     "--activation", "gelu_tanh"])
    rank, world, device = tm._setup(args)
    dt = torch.bfloat16
    h, f, t = args.hidden, args.hidden * args.ffn_mult, args.tokens
    fl, m = f // world, t // world
    g = torch.Generator(device=device).manual_seed(rank)
    w1 = (torch.randn(h, fl, generator=g, device=device) / h ** 0.5).to(dt)
    w2 = (torch.randn(fl, h, generator=g, device=device) / f ** 0.5).to(dt)
    x = torch.randn(m, h, generator=g, device=device).to(dt)
    dy = torch.randn(m, h, generator=g, device=device).to(dt)

    def block(stages, streams, comm, schedule, fused):
        up = ColumnParallelLinear(h, f, stages=stages, streams=streams, comm=comm,
                                  device=device, dtype=dt, schedule=schedule)
        down = RowParallelLinear(f, h, stages=stages, streams=streams, comm=comm,
                                 device=device, dtype=dt, schedule=schedule)
        with torch.no_grad():
            up.weight.copy_(w1)
            down.weight.copy_(w2)
        b = tm.MLPBlock(up, down, "gelu_tanh", fused)

        def step():
            for p in b.parameters():
                p.grad = None
            xi = x.detach().requires_grad_()
            y = b(xi)
            y.backward(dy)
        return step

    xs = torch.randn(t, h, device=device, dtype=dt)
    hs = torch.randn(t, fl, device=device, dtype=dt)

    def gemms():
        xs @ w1; hs @ w2
        xs @ w2.t(); hs.t() @ xs
        hs @ w1.t(); xs.t() @ hs

    steps = {"ideal": gemms}
    specs = a.variant or ["ours=1,2,auto,auto,1"]
    for spec in specs:
        name, rest = spec.split("=")
        s, st, comm, sched, fused = rest.split(",")
        steps[name] = block(int(s), int(st), comm, sched, fused == "1")
    for fn in steps.values():
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    import torch.distributed as dist

    dist.barrier()
    marks = []
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for name, fn in steps.items():
            for i in range(a.steps):
                torch.cuda.synchronize()
                dist.barrier()
                torch.cuda.synchronize()
                time.sleep(0.03)  # a gap on the GPU timeline between steps
                marks.append(name)
                fn()
                torch.cuda.synchronize()
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, f"chrome_rank{rank}.json")
    prof.export_chrome_trace(path)
    with open(path) as fh:
        trace = json.load(fh)
    gpu = [e for e in trace["traceEvents"]
           if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
           and "ncclDevKernel" not in e["name"]]  # the barriers between steps
    gpu.sort(key=lambda e: e["ts"])
    # Split at the sleeps: gaps over 10 ms separate the steps.
    groups, cur = [], []
    for e in gpu:
        if cur and e["ts"] - max(c["ts"] + c["dur"] for c in cur[-50:]) > 10_000:
            groups.append(cur)
            cur = []
        cur.append(e)
    groups.append(cur)
    groups = groups[-len(marks):]  # a stray kernel of the first barrier may come before
    out = {"rank": rank, "world": world, "device": torch.cuda.get_device_name(device),
           "commit": os.environ.get("HOSTIR_COMMIT", "unknown"), "hidden": h, "tokens": t,
           "groups_found": len(groups), "marks": marks, "steps": {}}
    if len(groups) == len(marks):
        per: dict = {}
        for name, grp in zip(marks, groups):
            per.setdefault(name, []).append(analyse(grp))
        for name, rs in per.items():
            med = {k: statistics.median(r[k] for r in rs)
                   for k in rs[0] if isinstance(rs[0][k], (int, float))}
            med["others"] = rs[-1]["others"]
            med["gemms_ms"] = rs[-1]["gemms_ms"]
            out["steps"][name] = med
        last = {name: grp for name, grp in zip(marks, groups)}
        with open(os.path.join(a.out, f"steps_rank{rank}.json"), "w") as fh:
            json.dump({name: [[e["name"][:80], e.get("cat"), e.get("args", {}).get("stream"),
                               round(e["ts"] - grp[0]["ts"], 1), round(e["dur"], 1)]
                              for e in grp] for name, grp in last.items()}, fh, indent=0)
    os.remove(path)
    with open(os.path.join(a.out, f"trace_rank{rank}.json"), "w") as fh:
        json.dump(out, fh, indent=1)
    if rank == 0:
        for name, s in out["steps"].items():
            print(f"{name}: wall {s['wall_ms']:.2f} ms, gemms {s['gemm_sum_ms']:.2f} "
                  f"({s['gemm_count']}), gemm busy {s['gemm_busy_ms']:.2f}, other kernels "
                  f"{s['other_kernels_ms']:.2f}, no kernel {s['no_kernel_ms']:.2f}, copies "
                  f"{s['copies_ms']:.2f}")
        if not out["steps"]:
            print(f"could not split the trace: {len(groups)} groups for {len(marks)} steps: "
                  f"{[(len(g), g[0]['name'][:40]) for g in groups]}")


if __name__ == "__main__":
    main()
