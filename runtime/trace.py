"""Seeing the overlap: a Chrome/Perfetto trace (torch.profiler) and a timeline picture.

    python -m hostir.run pipelined_matmul --trace run.json --timeline run.png

The picture draws one row per (rank, CUDA stream) and one bar per kernel or copy,
coloured by what it is (GEMM, NCCL, copy engine, other), so the hidden transfers show.
"""

from __future__ import annotations

import json

import torch


def record(step, iters: int, path: str, warmup: int = 3) -> None:
    """Run ``step`` ``warmup + iters`` times under torch.profiler and write a Chrome trace
    of the last ``iters``: starting the profiler takes each rank a different time, and the
    first collective after it waits for the slowest; the warm-up steps absorb that skew so
    the recorded window is the steady state."""
    from torch.profiler import ProfilerActivity, profile, schedule

    cuda = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    if cuda:
        torch.cuda.synchronize()
    with profile(activities=activities,
                 schedule=schedule(wait=0, warmup=warmup, active=iters, repeat=1)) as prof:
        for _ in range(warmup + iters):
            step()
            prof.step()
        if cuda:
            torch.cuda.synchronize()
    prof.export_chrome_trace(path)


def _kind(name: str, cat: str) -> str:
    n = name.lower()
    if "nccl" in n:
        return "NCCL"
    if "barrier" in n or "signal" in n:
        return "barrier"
    if cat == "gpu_memcpy" or "memcpy" in n:
        return "copy engine"
    if "gemm" in n or "sm90" in n or "cutlass" in n or "nvjet" in n:
        return "GEMM"
    return "other"


COLORS = {"GEMM": "#4c72b0", "NCCL": "#dd8452", "copy engine": "#55a868",
          "barrier": "#c44e52", "other": "#999999"}


def device_events(trace_path: str):
    """(stream, kind, start µs, duration µs, name) of every GPU event in a trace."""
    with open(trace_path) as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    # Kineto writes timestamps relative to a base time; with it, ranks share one clock.
    base = float(data.get("baseTimeNanoseconds", 0)) / 1e3 if isinstance(data, dict) else 0.0
    out = []
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        stream = e.get("args", {}).get("stream", e.get("tid"))
        out.append((stream, _kind(e.get("name", ""), e["cat"]), base + float(e["ts"]), float(e["dur"]),
                    e.get("name", "")))
    return out


def draw(traces: dict, png: str, title: str = "") -> None:
    """``traces``: {label (e.g. "rank 0"): trace path}. Writes one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = []
    per_rank = {label: device_events(path) for label, path in traces.items()}
    starts = [e[2] for evs in per_rank.values() for e in evs]
    t0 = min(starts) if starts else 0.0  # one time axis for every rank
    for label, evs in per_rank.items():
        for stream in sorted({e[0] for e in evs}):
            rows.append((f"{label} stream {stream}", [(k, s - t0, d) for st, k, s, d, _ in evs if st == stream]))
    fig, ax = plt.subplots(figsize=(12, 0.5 + 0.45 * max(len(rows), 1)))
    for y, (_, bars) in enumerate(rows):
        for kind, start, dur in bars:
            ax.broken_barh([(start / 1e3, dur / 1e3)], (y - 0.4, 0.8), color=COLORS[kind])
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([r[0] for r in rows])
    ax.set_xlabel("ms")
    ax.invert_yaxis()
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLORS.values()]
    ax.legend(handles, list(COLORS), loc="upper center", bbox_to_anchor=(0.5, -0.25 - 0.5 / max(len(rows), 1)),
              ncol=5, fontsize=8, frameon=False)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
