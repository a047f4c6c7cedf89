"""Where one rank's MLP-block step spends its GPU time, without communication.

The step of `python -m hostir.run train_mlp --bench` on one GPU (hidden 8192, 16384
tokens, ffn 4x, two ranks' share of the ffn): its kernels by total time (torch.profiler),
and side-by-side medians of the six GEMMs alone, the whole step, and the pieces that are
not GEMMs (GELU forward and backward, the residual add), so that a fusion can be judged
before it is written:

    python benchmarks/profile_mlp_step.py --json profile.json
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
import torch.nn.functional as F


def side_by_side(fns: dict, reps: int = 15, warmup: int = 3) -> dict:
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times = {k: [] for k in fns}
    for _ in range(reps):
        for k, fn in fns.items():
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            times[k].append(s.elapsed_time(e))
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=8192)
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--json", default=None, help="results JSON")
    args = ap.parse_args()
    dev, dt = torch.device("cuda"), torch.bfloat16
    h, t = args.hidden, args.tokens
    fl = 4 * h // args.world
    w1 = torch.nn.Parameter(torch.randn(h, fl, device=dev, dtype=dt) / h ** 0.5)
    w2 = torch.nn.Parameter(torch.randn(fl, h, device=dev, dtype=dt) / fl ** 0.5)
    xs = torch.randn(t, h, device=dev, dtype=dt)
    hs = torch.randn(t, fl, device=dev, dtype=dt)
    dy = torch.randn(t, h, device=dev, dtype=dt)
    zero_bias = torch.zeros(fl, device=dev, dtype=dt)

    def gemms():
        xs @ w1; hs @ w2
        xs @ w2.t(); hs.t() @ xs
        hs @ w1.t(); xs.t() @ hs

    def step(approximate="none"):
        def run():
            w1.grad = w2.grad = None
            xi = xs.detach().requires_grad_()
            y = xi + F.gelu(xi @ w1, approximate=approximate) @ w2
            y.backward(dy)
        return run

    def no_residual():
        w1.grad = w2.grad = None
        xi = xs.detach().requires_grad_()
        y = F.gelu(xi @ w1) @ w2
        y.backward(dy)

    def gelu_fwd():
        F.gelu(hs)

    def gelu_bwd():
        torch.ops.aten.gelu_backward(hs, hs)

    def residual():
        xs + dy

    def up_gemm():
        xs @ w1

    def up_gemm_lt_gelu():  # cuBLASLt GELU epilogue (tanh form), through torch
        torch._addmm_activation(zero_bias, xs, w1.detach(), use_gelu=True)

    # The fused epilogues of hostir's ParallelMLP (cuBLASLt, tanh GELU) against the GEMM
    # and the separate elementwise pass, on the up projection's forward and the down
    # projection's input-gradient GEMM.
    from runtime import cublaslt
    up_out, up_pre = torch.empty(t, fl, device=dev, dtype=dt), torch.empty(t, fl, device=dev, dtype=dt)
    w1d, w2t = w1.detach(), w2.detach().t().contiguous()

    def up_lt_gelu_aux():
        cublaslt.matmul(xs, w1d, up_out, "gelu_aux", up_pre)

    def up_lt_plain():
        cublaslt.matmul(xs, w1d, up_out)

    def up_mm_then_gelu():
        F.gelu(xs @ w1d, approximate="tanh")

    def dgrad_lt_dgelu():
        cublaslt.matmul(dy, w2t, up_out, "dgelu", hs)

    def dgrad_mm_then_gelu_backward():
        torch.ops.aten.gelu_backward(dy @ w2t, hs, approximate="tanh")

    fused = {"up_lt_gelu_aux": up_lt_gelu_aux, "up_lt_plain": up_lt_plain,
             "up_mm_then_gelu": up_mm_then_gelu, "dgrad_lt_dgelu": dgrad_lt_dgelu,
             "dgrad_mm_then_gelu_backward": dgrad_mm_then_gelu_backward}
    fns = {**fused, "gemms": gemms, "step": step(), "step_tanh": step("tanh"),
           "step_no_residual": no_residual, "gelu_fwd": gelu_fwd, "gelu_bwd": gelu_bwd,
           "residual_add": residual, "up_gemm": up_gemm, "up_gemm_lt_gelu": up_gemm_lt_gelu}
    ms = side_by_side(fns)
    from torch.profiler import ProfilerActivity, profile
    run = step()
    run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            run()
        torch.cuda.synchronize()
    kernels = {}
    for e in prof.key_averages():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            us = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
            kernels[e.key[:120]] = {"ms_per_step": us / 3e3, "calls_per_step": e.count / 3}
    top = dict(sorted(kernels.items(), key=lambda kv: -kv[1]["ms_per_step"])[:20])
    import datetime

    from hostir.jobs.results import commit
    doc = {"device": torch.cuda.get_device_name(),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "commit": commit(), "hidden": h, "tokens": t, "ffn_local": fl,
           "ms": ms, "kernels": top}
    print(json.dumps(doc, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
