"""The staged copy-engine SendRecv with large messages, beside GEMMs: does it complete?

The staged path (a receive buffer the program returns goes through the transport's
staging buffer) stopped in a device barrier in five of eight overlap-bench runs with
512 MiB - 1 GiB messages when its barriers were torch's barrier kernel (README, known
issues). This sends such messages round the ranks many times, a GEMM stream keeping every
SM busy, checks every message, and writes what it saw:

    mpirun -np 2 python benchmarks/staged_sendrecv_stress.py --json stress.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", default="256,512,1024")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--json", required=True, help="results JSON")
    a = ap.parse_args()
    from runtime.comm.copy_engine import CopyEngineCommunicator, _SignalBarrier
    from runtime.comm.torch_pg import TorchCommunicator
    from runtime.session import init_torch_distributed_from_mpi, local_rank

    torch.cuda.set_device(local_rank() % torch.cuda.device_count())
    init_torch_distributed_from_mpi("nccl")
    comm = CopyEngineCommunicator(TorchCommunicator())
    rank, d = comm.rank, comm.world_size
    dev = torch.device("cuda", torch.cuda.current_device())
    send_peer, recv_peer = (rank + 1) % d, (rank - 1) % d
    big = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    side = torch.cuda.Stream(dev)
    results = []
    for mib in (int(x) for x in a.mib.split(",")):
        n = (mib << 20) // 2
        inp = torch.empty(n, device=dev, dtype=torch.bfloat16)
        out = torch.empty_like(inp)
        bad, t0 = 0, time.perf_counter()
        for i in range(a.rounds):
            inp.fill_(float((i * d + rank) % 200))
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(4):
                    big @ big
            comm.sendrecv(out, inp, send_peer, recv_peer).wait(torch.cuda.current_stream())
            torch.cuda.current_stream().wait_stream(side)
            bad += int(not torch.all(out == float((i * d + recv_peer) % 200)))
        torch.cuda.synchronize()
        results.append({"mib": mib, "rounds": a.rounds, "wrong_messages": bad,
                        "seconds": round(time.perf_counter() - t0, 3)})
        print(f"rank {rank}: {mib} MiB x {a.rounds}: {bad} wrong, "
              f"{results[-1]['seconds']} s", flush=True)
    if rank == 0:
        with open(a.json, "w") as fh:
            json.dump({"device": f"{d}x {torch.cuda.get_device_name(dev)}",
                       "date": time.strftime("%Y-%m-%d"),
                       "commit": os.environ.get("HOSTIR_COMMIT", "unknown"),
                       "barrier": "stream memory operations" if isinstance(
                           comm._signals, _SignalBarrier) else "torch barrier kernel",
                       "results": results}, fh, indent=1)


if __name__ == "__main__":
    main()
