"""Program -> program: run the stages of every top-level FOR on round-robin worker streams.

Each iteration switches to worker ``i % numberOfStreams``, makes it wait on the user's
stream (so it sees the inputs the user produced), runs the stage, switches back and makes
the user's stream wait on the worker. Both waits are event-based: the host never blocks,
and stage i+1's collective can run while stage i's matmul does. The program captures the
user's stream first and ends on it, ordered after every worker.
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
        worker = ir.PoolStream(ir.BinOp("%", ir.Var(s.index.name), ir.Var("numberOfStreams")))
        stage = (
            ir.SetCurrentStream(worker),
            ir.Synchronize(user),
            *s.body,
            ir.SetCurrentStream(user),
            ir.Synchronize(worker),
        )
        body.append(dataclasses.replace(s, body=stage))
    return dataclasses.replace(
        program, body=tuple(body), number_of_streams=number_of_streams,
        provenance="assign_streams",
    )
