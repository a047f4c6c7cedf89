"""Program -> program: run the stages of every top-level FOR on round-robin worker streams.

Before the stages, each worker stream that will be used waits once on the user's stream
(so it sees the inputs the user produced). Each stage then switches to worker
``i % numberOfStreams``, runs, switches back and makes the user's stream wait on the
worker. A worker waits on the user's stream only that once: the user's stream waits on
every finished stage, so a wait on it inside the loop would chain each stage after all
earlier ones and nothing would overlap. All waits are events: the host never blocks.
The program captures the user's stream first and ends on it, ordered after every worker.

    FOR k in range(0, min(S, numberOfStreams)):
      SetCurrentStream to Stream k
      Synchronize Stream s0
    FOR i in range(0, S):
      SetCurrentStream to Stream (i % numberOfStreams)
      ... the stage ...
      SetCurrentStream to Stream s0
      Synchronize Stream (i % numberOfStreams)

Collectives posted from different worker streams stay in program order on the
communicator: NCCL communicators post on their own stream (``runtime.comm.nccl``).
"""

from __future__ import annotations

import dataclasses

from hostir import ir
from hostir.errors import LoweringError


def assign_streams(program: ir.Program, number_of_streams: int) -> ir.Program:
    if not isinstance(number_of_streams, int) or number_of_streams < 1:
        raise LoweringError(f"numberOfStreams must be a positive int, got {number_of_streams!r}")
    if any(isinstance(s, ir.GetCurrentStream) for s in program.body):
        raise LoweringError("assign_streams: the program already manages streams")
    user = ir.StreamValue("s0")
    body: list = [ir.GetCurrentStream(user)]
    for s in program.body:
        if not isinstance(s, ir.ForLoop):
            body.append(s)
            continue
        k = ir.IndexVar("k" if s.index.name != "k" else "w")
        workers = min(s.stop - s.start, number_of_streams)
        if workers > 0:
            body.append(ir.ForLoop(k, 0, workers, (
                ir.SetCurrentStream(ir.PoolStream(ir.Var(k.name))),
                ir.Synchronize(user),
            )))
        worker = ir.PoolStream(ir.BinOp("%", ir.Var(s.index.name), ir.Var("numberOfStreams")))
        stage = (
            ir.SetCurrentStream(worker),
            *s.body,
            ir.SetCurrentStream(user),
            ir.Synchronize(worker),
        )
        body.append(dataclasses.replace(s, body=stage))
    return dataclasses.replace(
        program, body=tuple(body), number_of_streams=number_of_streams,
        provenance="assign_streams",
    )
