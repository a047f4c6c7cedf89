#!/usr/bin/env python3
"""One-shot GPU check of the wgmma (sm_90a) matmul path: correctness first, then speed
against cuBLAS, on the issue's five shapes. Meant for one run on an H100/H200:

    HOSTIR_COMMIT=$(git rev-parse HEAD) python3 benchmarks/gpu_wgmma_check.py --json $OUT/wgmma.json

Variants run in groups, one subprocess per group (one generated kernel source, or the
heuristics' picks), so that an illegal instruction or a misaligned address, which kills
the CUDA context, loses at most the variant it happened in: the parent marks that variant
as crashed and starts a fresh worker for the rest of the group. A hung kernel (a serial
split-K semaphore that never turns) is killed at the group's time limit the same way.

Per variant: the output is poisoned with NaN, the kernel runs once on torch.randn data and
its relative error against a float64 reference must be < 1e-2 (edge shapes with bias, fp32
output and every split mode are checked too, not timed); only then is it timed with CUDA
events (median of groups of back-to-back calls queued behind a GPU sleep, so host launch
overhead does not count), next to cuBLAS (F.linear, same data, same worker). The JSON is
rewritten after every group, so whatever happens, what was measured is on disk.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SHAPES = ((1024, 2048, 50304), (8192, 8192, 8192), (4096, 4096, 8192),
          (16384, 8192, 4096), (256, 4096, 16384))
# Correctness only: ragged M/N, a K tail, bias, fp32 output, every split mode.
EDGE_SHAPE = (200, 136, 1000)
TOL = 1e-2


# ---------------------------------------------------------------------------------------
# The plan (no CUDA here).

def _splits_for_shape(M, N, K):
    """(mode, split) pairs worth timing: split-K only where M x N is a few waves at most."""
    if M * N >= 4096 * 4096:
        return [("none", 1)]
    return [("none", 1), ("serial", 2), ("serial", 4), ("serial", 8), ("parallel", 4),
            ("cluster", 2)]


def plan(shapes, quick: bool = False) -> list[dict]:
    """Groups of variants: one per feed of the wgmma ring (sync cp.async, warp-specialized
    cp.async, TMA), each over every wgmma tile; then the heuristics' picks."""
    from lowering.kernels import heuristics

    groups = {}
    for config in heuristics.WGMMA_CONFIGS:
        base = heuristics.spec_for(config)
        variants = groups.setdefault(f"wgmma_{base.feed}", [])
        kernel = base.kernel_name
        # Edge checks first: a layout or descriptor bug shows here in milliseconds.
        for mode, split, out_dtype in (("none", 1, "bf16"), ("serial", 3, "fp32"),
                                       ("parallel", 4, "bf16"), ("cluster", 2, "fp32")):
            if not heuristics.mode_fits(base, mode, split):
                continue  # cluster split-K: the TMA feed's tiles only
            spec = dataclasses.replace(base, split_k=split, split_mode=mode, bias=True,
                                       out_dtype=out_dtype)
            variants.append({"label": f"{base.tile} {base.feed} edge {mode} s{split} "
                                      f"->{out_dtype}+bias",
                             "shape": EDGE_SHAPE, "spec": dataclasses.asdict(spec),
                             "time": False, "kernel": f"{kernel} {mode}"})
        fp16 = dataclasses.replace(base, a_dtype="fp16", b_dtype="fp16", out_dtype="fp16")
        variants.append({"label": f"{base.tile} {base.feed} edge fp16", "shape": EDGE_SHAPE,
                         "spec": dataclasses.asdict(fp16), "time": False,
                         "kernel": f"{fp16.kernel_name} none"})
        for M, N, K in shapes:
            pairs = _splits_for_shape(M, N, K)
            if quick:
                pairs = pairs[:2]
            for mode, split in pairs:
                if not heuristics.mode_fits(base, mode, split):
                    continue
                spec = dataclasses.replace(base, split_k=split, split_mode=mode)
                ktiles = -(-K // spec.tile_k)
                if split > 1 and ktiles // split < 4:
                    continue
                variants.append({"label": f"{spec.tile} {base.feed} {mode} s{split}",
                                 "shape": (M, N, K), "spec": dataclasses.asdict(spec),
                                 "time": True, "kernel": f"{kernel} {mode}"})
    out = [{"name": name, "variants": v} for name, v in groups.items()]
    # What the runtime would pick without autotuning, on Hopper (wgmma) and elsewhere
    # (mma.sync, the baseline of the issue).
    heur = []
    for M, N, K in shapes:
        for label, arch in (("heuristic wgmma", "sm_90"), ("heuristic mma.sync", None)):
            spec = heuristics.choose(M, N, K, arch=arch)
            heur.append({"label": f"{label} {spec.tile} {spec.feed if spec.instr == 'wgmma' else ''}"
                                  f" {spec.split_mode} s{spec.split_k}",
                         "shape": (M, N, K), "spec": dataclasses.asdict(spec), "time": True,
                         "kernel": f"{spec.kernel_name} {spec.split_mode}"})
    out.append({"name": "heuristics", "variants": heur})
    return out


# ---------------------------------------------------------------------------------------
# The worker (CUDA): runs the variants of one group from index `start`, one JSON line per
# event, flushed, so that the parent knows where a crash happened.

def fake_worker(job_path: str, results_path: str) -> int:
    """No GPU: exercises the parent's bookkeeping (HOSTIR_WGMMA_CHECK_FAKE=1). Variants
    whose label contains "serial s3" crash the process, "parallel s4" hang."""
    job = json.loads(Path(job_path).read_text())
    with open(results_path, "a", buffering=1) as f:
        f.write(json.dumps({"event": "device", "name": "fake", "capability": [9, 0]}) + "\n")
        skip = set(job.get("skip_kernels", ()))
        for idx in range(job["start"], len(job["variants"])):
            v = job["variants"][idx]
            if v.get("kernel") in skip:
                f.write(json.dumps({"event": "done", "idx": idx, "status": "skipped"}) + "\n")
                continue
            f.write(json.dumps({"event": "start", "idx": idx}) + "\n")
            f.flush()
            if " tma " in v["label"] and "serial s3" in v["label"]:
                os._exit(134)
            if "ws" in v["label"] and "parallel s4" in v["label"] and "edge" in v["label"]:
                time.sleep(3600)
            rec = {"event": "done", "idx": idx, "status": "ok", "rel_err": 1e-3}
            if v["time"]:
                rec.update(us=100.0, tflops=1.0, cublas_us=90.0, cublas_tflops=1.1, ratio=0.9)
            f.write(json.dumps(rec) + "\n")
    return 0


def worker(job_path: str, results_path: str) -> int:
    if os.environ.get("HOSTIR_WGMMA_CHECK_FAKE"):
        return fake_worker(job_path, results_path)
    import torch
    import torch.nn.functional as F

    from lowering.kernels.matmul import MatmulSpec, render
    from runtime import jit, workspace
    from runtime.matmul import DTYPE_TORCH, load, matmul

    job = json.loads(Path(job_path).read_text())
    deadline = job["deadline"]
    out_f = open(results_path, "a", buffering=1)

    def emit(**rec):
        out_f.write(json.dumps(rec) + "\n")
        out_f.flush()
        os.fsync(out_f.fileno())

    cap = torch.cuda.get_device_capability()
    emit(event="device", name=torch.cuda.get_device_name(), capability=list(cap),
         sm_count=torch.cuda.get_device_properties(0).multi_processor_count,
         torch=torch.__version__, nvrtc=".".join(map(str, jit.nvrtc_version())))
    sleep_cycles = int(job.get("sleep_cycles", 5_000_000))

    def time_us(fn, calls=10, groups=5, warmup=3):
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(groups):
            torch.cuda._sleep(sleep_cycles)  # the host queues the calls while this runs
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(calls):
                fn()
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e) * 1e3 / calls)
        return statistics.median(times)

    cache = {}  # shape -> (a, b, ref, cublas_us)

    def data(shape, dtype, out_dtype, bias):
        key = (tuple(shape), dtype, out_dtype, bias)
        if key not in cache:
            for k in list(cache):  # one shape's tensors at a time
                del cache[k]
            torch.cuda.empty_cache()
            M, N, K = shape
            g = torch.Generator(device="cuda").manual_seed(M * 7 + N * 3 + K)
            a = torch.randn(M, K, device="cuda", dtype=dtype, generator=g)
            b = torch.randn(N, K, device="cuda", dtype=dtype, generator=g)
            bv = torch.randn(N, device="cuda", dtype=out_dtype, generator=g) if bias else None
            ref = a.double() @ b.double().t()
            if bv is not None:
                ref += bv.double()
            cache[key] = {"a": a, "b": b, "bias": bv, "ref": ref, "cublas_us": None}
        return cache[key]

    skip = set(job.get("skip_kernels", ()))
    for idx in range(job["start"], len(job["variants"])):
        v = job["variants"][idx]
        if v.get("kernel") in skip:
            emit(event="done", idx=idx,
                 status="skipped (its kernel crashed or hung earlier in this split mode)")
            continue
        if time.time() > deadline:
            emit(event="done", idx=idx, status="not run (group time limit)")
            continue
        emit(event="start", idx=idx)
        rec = {"event": "done", "idx": idx}
        try:
            spec = MatmulSpec(**v["spec"])
            M, N, K = v["shape"]
            dt, odt = DTYPE_TORCH[spec.a_dtype], DTYPE_TORCH[spec.out_dtype]
            d = data((M, N, K), dt, odt, spec.bias)
            src = render(spec)
            load(spec)
            ck = jit.kernel_cache().get(src.source, src.names, spec.arch(*cap))
            sym = ck.lowered[src.kernel_name]
            rec.update(kernel=src.kernel_name, arch=ck.arch, registers=ck.registers.get(sym),
                       spill_bytes=ck.spill_bytes.get(sym, 0), smem_bytes=spec.smem_bytes)
            out = torch.full((M, N), float("nan"), device="cuda", dtype=odt)
            matmul(d["a"], d["b"], out=out, bias=d["bias"], spec=spec)
            torch.cuda.synchronize()
            err = ((out.double() - d["ref"]).norm() / d["ref"].norm()).item()
            rec["rel_err"] = err
            rec["arena_zero"] = True
            try:
                workspace.check_all_zeroed()
            except Exception as e:  # the serial semaphores must be back at 0
                rec["arena_zero"] = f"{type(e).__name__}: {e}"[:300]
            if not err < TOL:
                rec["status"] = f"WRONG (rel err {err:.3e})"
                emit(**rec)
                continue
            if rec["arena_zero"] is not True:
                rec["status"] = "WRONG (semaphore arena not zero)"
                emit(**rec)
                continue
            rec["status"] = "ok"
            if v["time"]:
                a, b = d["a"], d["b"]
                if d["cublas_us"] is None:
                    ref_out = F.linear(a, b)
                    d["cublas_rel_err"] = ((ref_out.double() - d["ref"]).norm()
                                           / d["ref"].norm()).item()
                    d["cublas_us"] = time_us(lambda: F.linear(a, b))
                us = time_us(lambda: matmul(a, b, out=out, spec=spec))
                flops = 2.0 * M * N * K
                rec.update(us=us, tflops=flops / us / 1e6, cublas_us=d["cublas_us"],
                           cublas_tflops=flops / d["cublas_us"] / 1e6,
                           cublas_rel_err=d.get("cublas_rel_err"),
                           ratio=d["cublas_us"] / us)
        except Exception as e:
            rec["status"] = f"error: {type(e).__name__}: {e}"[:600]
            rec["traceback"] = traceback.format_exc()[-1500:]
            # a sticky CUDA error (illegal address...) poisons the context: stop here and
            # let the parent start a fresh worker for the rest
            msg = str(e).lower()
            sticky = any(w in msg for w in ("illegal", "misaligned", "unspecified launch",
                                            "cuda error", "cudaerror", "cuda_error"))
            rec["sticky"] = sticky
            emit(**rec)
            if sticky:
                return 3
            continue
        emit(**rec)
    return 0


# ---------------------------------------------------------------------------------------
# The parent.

def _git_commit() -> str:
    if os.environ.get("HOSTIR_COMMIT"):
        return os.environ["HOSTIR_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, timeout=10).stdout.strip() or "unknown"
    except Exception:
        return "unknown"


def run_group(group: dict, group_deadline: float, doc: dict, max_restarts: int = 12,
              variant_timeout: float = float(os.environ.get("HOSTIR_WGMMA_VARIANT_TIMEOUT", 30))
              ) -> None:
    """Run one group's variants in worker processes; fill doc["variants"] and groups.

    A worker that dies (illegal instruction, misaligned address...) or spends more than
    `variant_timeout` seconds in one variant (a hung kernel) is killed; that variant is
    recorded as crashed or hung, later variants of the same kernel are skipped, and a
    fresh worker goes on with the rest.
    """
    variants = group["variants"]
    done: dict[int, dict] = {}
    info = {"name": group["name"], "workers": []}
    doc["groups"].append(info)
    start, restarts, bad_kernels = 0, 0, set()
    with tempfile.TemporaryDirectory() as tmp:
        while start < len(variants):
            job = Path(tmp, f"job{restarts}.json")
            res = Path(tmp, f"res{restarts}.jsonl")
            err = Path(tmp, f"err{restarts}.txt")
            job.write_text(json.dumps({"variants": variants, "start": start,
                                       "skip_kernels": sorted(bad_kernels),
                                       "deadline": group_deadline - 3}))
            env = dict(os.environ, PYTHONPATH=f"{ROOT}:{os.environ.get('PYTHONPATH', '')}")
            t0 = time.time()
            started, started_at, n_lines = None, time.time(), 0
            status = None
            with open(err, "w") as ef:
                proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()),
                                         "--worker", str(job), "--results", str(res)],
                                        cwd=ROOT, env=env, stdout=ef, stderr=subprocess.STDOUT)
                while True:
                    rc = proc.poll()
                    try:
                        lines = res.read_text().splitlines()
                    except FileNotFoundError:
                        lines = []
                    for line in lines[n_lines:]:
                        try:
                            r = json.loads(line)
                        except ValueError:
                            break  # a half-written line: read it next time
                        n_lines += 1
                        if r.get("event") == "device":
                            if not doc.get("device"):
                                doc["device"], doc["device_info"] = r["name"], r
                        elif r.get("event") == "start":
                            started, started_at = r["idx"], time.time()
                        elif r.get("event") == "done":
                            done[r["idx"]] = r
                            started = None
                            if r.get("sticky"):
                                bad_kernels.add(variants[r["idx"]].get("kernel"))
                    if rc is not None:
                        break
                    now = time.time()
                    if started is not None and now - started_at > variant_timeout:
                        status = f"hung (killed after {variant_timeout:.0f} s)"
                    elif now > group_deadline:
                        status = "killed at the group's time limit"
                    if status:
                        proc.kill()
                        proc.wait()
                        rc = "killed"
                        break
                    time.sleep(0.2)
            tail = err.read_text(errors="replace")[-1500:] if err.exists() else ""
            info["workers"].append({"start": start, "rc": rc, "seconds": round(time.time() - t0, 1),
                                    "status": status, "output_tail": tail if rc != 0 else ""})
            if started is not None:  # died (or hung) inside this variant
                done[started] = {"idx": started, "status": status or f"crashed (worker rc {rc})",
                                 "output_tail": tail[-800:]}
                bad_kernels.add(variants[started].get("kernel"))
            nxt = max(done) + 1 if done else start
            if nxt <= start and rc != 0:
                # died before starting a variant (import error, no GPU): count it once
                done.setdefault(start, {"idx": start, "status": f"worker failed (rc {rc})",
                                        "output_tail": tail[-800:]})
                nxt = start + 1
            if rc == 0 or nxt >= len(variants):
                break
            restarts += 1
            if restarts > max_restarts or time.time() > group_deadline - 5:
                break
            start = nxt
    for i, v in enumerate(variants):
        r = done.get(i, {"status": "not run (worker kept failing or out of time)"})
        r = {k: val for k, val in r.items() if k not in ("event", "idx")}
        doc["variants"].append({"group": group["name"], "label": v["label"],
                                "shape": "x".join(map(str, v["shape"])),
                                "kernel": v.get("kernel"), "spec": v["spec"], **r})


def summarize(doc: dict, shapes) -> None:
    per_shape = {}
    for M, N, K in shapes:
        key = f"{M}x{N}x{K}"
        rows = [v for v in doc["variants"] if v["shape"] == key and v.get("ratio")]
        entry = {"cublas_us": None, "best_ratio": None, "best": None, "tried": 0,
                 "wgmma_ok": 0, "wgmma_wrong_or_failed": 0}
        for v in doc["variants"]:
            if v["shape"] == key and v["spec"].get("instr") == "wgmma":
                entry["tried"] += 1
                if v.get("status") == "ok":
                    entry["wgmma_ok"] += 1
                else:
                    entry["wgmma_wrong_or_failed"] += 1
        if rows:
            best = max(rows, key=lambda v: v["ratio"])
            entry.update(cublas_us=statistics.median(v["cublas_us"] for v in rows),
                         best_ratio=best["ratio"], best={k: best.get(k) for k in (
                             "group", "label", "us", "tflops", "cublas_us", "cublas_tflops",
                             "rel_err", "registers", "spill_bytes")})
            wg = [v for v in rows if v["spec"].get("instr") == "wgmma"]
            mma = [v for v in rows if v["spec"].get("instr") == "mma"]
            entry["best_wgmma_ratio"] = max((v["ratio"] for v in wg), default=None)
            entry["best_mma_ratio"] = max((v["ratio"] for v in mma), default=None)
        per_shape[key] = entry
    doc["shapes"] = per_shape


def table(doc: dict) -> str:
    lines = [f"device {doc.get('device', '?')}  commit {doc.get('commit', '?')[:12]}  "
             f"{doc.get('elapsed_s', 0):.0f} s",
             f"{'shape':>18} {'cuBLAS us':>10} {'best us':>9} {'ratio':>6} {'wgmma':>6} "
             f"{'mma':>6}  best variant"]
    for key, e in doc.get("shapes", {}).items():
        b = e.get("best") or {}
        f = lambda x, fmt: (fmt % x) if isinstance(x, (int, float)) else "-"
        lines.append(f"{key:>18} {f(e.get('cublas_us'), '%10.1f'):>10} "
                     f"{f(b.get('us'), '%9.1f'):>9} {f(e.get('best_ratio'), '%6.2f'):>6} "
                     f"{f(e.get('best_wgmma_ratio'), '%6.2f'):>6} "
                     f"{f(e.get('best_mma_ratio'), '%6.2f'):>6}  {b.get('label', '-')}"
                     f" ({e.get('wgmma_ok', 0)}/{e.get('tried', 0)} wgmma ok)")
    bad = [v for v in doc.get("variants", []) if v.get("status") != "ok"]
    lines.append(f"{len(doc.get('variants', [])) - len(bad)} variants ok, {len(bad)} not:")
    for v in bad[:40]:
        lines.append(f"  {v['group']:>28} {v['shape']:>16} {v['label']:<36} {v.get('status')}")
    return "\n".join(lines)


def device_slug() -> str:
    """The device as results files spell it: ``NVIDIA H200`` -> ``nvidia-h200``."""
    import torch
    return torch.cuda.get_device_name(0).lower().replace(" ", "-")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--json", default=None,
                    help="results JSON (default benchmarks/results/wgmma_check_<device>.json)")
    ap.add_argument("--budget-s", type=float, default=150.0,
                    help="wall-clock budget for all groups (default 150 s)")
    ap.add_argument("--shapes", default=None, help="MxNxK,... (default: the issue's five)")
    ap.add_argument("--quick", action="store_true", help="fewer split variants")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--results", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args.worker, args.results)

    t_start = time.time()
    shapes = SHAPES if not args.shapes else tuple(
        tuple(int(x) for x in s.split("x")) for s in args.shapes.split(","))
    out = (Path(args.json) if args.json
           else ROOT / "benchmarks" / "results" / f"wgmma_check_{device_slug()}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"device": None, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
           "commit": _git_commit(), "tolerance": TOL, "budget_s": args.budget_s,
           "shapes_requested": ["x".join(map(str, s)) for s in shapes],
           "groups": [], "variants": [], "shapes": {}}

    def write():
        doc["elapsed_s"] = time.time() - t_start
        try:
            summarize(doc, shapes)
        except Exception as e:
            doc["summary_error"] = f"{type(e).__name__}: {e}"
        tmp = out.with_suffix(out.suffix + ".tmp")
        tmp.write_text(json.dumps(doc, indent=1, default=str))
        os.replace(tmp, out)

    try:
        groups = plan(shapes, args.quick)
        doc["planned_variants"] = sum(len(g["variants"]) for g in groups)
        for gi, group in enumerate(groups):
            left = args.budget_s - (time.time() - t_start)
            # an even share of what is left for each remaining group
            share = left / (len(groups) - gi)
            run_group(group, time.time() + max(share, 10.0), doc)
            write()
            print(f"[{time.time() - t_start:5.0f} s] group {group['name']}: "
                  f"{sum(1 for v in doc['variants'] if v['group'] == group['name'] and v.get('status') == 'ok')}"
                  f"/{len(group['variants'])} ok", flush=True)
    except BaseException as e:  # still write what was measured
        doc["error"] = f"{type(e).__name__}: {e}"
        doc["traceback"] = traceback.format_exc()[-3000:]
    finally:
        write()
    print(table(doc))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
