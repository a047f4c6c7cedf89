"""Program -> program: AllGather+GEMM as a local-first collective permute (ring).

The stage loop of ``lower_communication`` gathers a whole stage before its GEMM. Here
each stage starts with the GEMM of this rank's own rows, which needs no communication and
hides the first transfer; then, for j = 1 .. D-1, the rows of rank (rank + j) % D arrive by
a SendRecv (this rank sends its rows to rank (rank - j) % D) and are multiplied as soon as
they land. Transfers run on worker stream 1, GEMMs on worker stream 0; a GEMM waits only
for its own transfer (an event wait), so transfer j+1 overlaps GEMM j. Whether a SendRecv
moves through NCCL or through the copy engine is the communicator's choice, not the
program's.

    FOR i in range(0, S):                         # stages (the Stream axis)
      ... T8 = matmul(local rows)                 # stream 0, no communication
      FOR j in range(1, D):
        SetCurrentStream to Stream 1
        C0 = Communication(SendRecv, ..., send_peer=((rank - j) % worldSize),
                                          recv_peer=((rank + j) % worldSize))
        SetCurrentStream to Stream 0
        Wait C0
        ... = matmul(rows of rank (rank + j) % D)

A matmul epilogue carries over: each row block's GEMM gets it with the same rows of the
pre-activation (written for ``gelu_aux``, read for ``dgelu``).
"""

from __future__ import annotations

import dataclasses

from hostir import ir
from hostir.errors import LoweringError

COMM, COMPUTE = 1, 0


def _pattern(program: ir.Program):
    """The pieces of a ``lower_communication`` stage loop, or a LoweringError: the loop,
    the gathered buffer, the output, the team, and the matmul (its epilogue, if any, and
    the tensor its aux is a stage of)."""
    loops = [s for s in program.body if isinstance(s, ir.ForLoop)]
    allocs = [s for s in program.body if isinstance(s, ir.Allocate)]
    if len(loops) != 1 or len(allocs) not in (2, 3) or len(program.inputs) not in (2, 3):
        raise LoweringError(
            "collective_permute: expected the stage loop of lower_communication (inputs A, B "
            "and a dgelu pre-activation if any; two allocations and a gelu_aux pre-activation "
            "if any; one FOR), got another program"
        )
    loop = loops[0]
    kinds = [type(s) for s in loop.body]
    plain = [ir.Select, ir.Select, ir.Communication, ir.Wait, ir.Select, ir.Matmul]
    with_aux = plain[:-1] + [ir.Select, ir.Matmul]
    if kinds not in (plain, with_aux) or loop.body[2].type is not ir.CommunicationType.Allgather:
        raise LoweringError("collective_permute: expected [select, select, Allgather, Wait, "
                            "select, (select of the pre-activation,) matmul] in the stage loop, "
                            f"got {[k.__name__ for k in kinds]}")
    mm = loop.body[-1]
    pre = loop.body[-2].input if mm.epilogue is not None else None
    return loop, allocs[0].out, allocs[1].out, loop.body[2].team, mm, pre


def collective_permute(program: ir.Program, number_of_streams: int = 2) -> ir.Program:
    if number_of_streams < 1:
        raise LoweringError(f"numberOfStreams must be a positive int, got {number_of_streams!r}")
    loop, gathered, out, team, mm, pre = _pattern(program)
    a, b = program.inputs[:2]
    names = ir.fresh_tensor_names(program)
    rank, world = ir.Var("rank"), ir.Var("worldSize")
    i, j = loop.index, ir.IndexVar("j")
    peer = ir.BinOp("%", ir.BinOp("+", rank, ir.Var(j.name)), world)
    back = ir.BinOp("%", ir.BinOp("-", rank, ir.Var(j.name)), world)
    # The tensors each select defines (axis 0 dropped); the indices go on the Select below.
    row = lambda src: ir.select_type(next(names), src, 0)  # noqa: E731
    a_i = row(a)
    mine = row(a_i)
    g_i, c_i = row(gathered), row(out)
    c_mine, g_peer, c_peer = row(c_i), row(g_i), row(c_i)
    handle = ir.CommHandle("C0")
    comm = ir.PoolStream(COMM)
    compute = ir.PoolStream(COMPUTE)

    def gemm(c_rows, g_rows, p_i, index) -> tuple:
        """The matmul of one rank's rows, with the epilogue on the same rows of the
        pre-activation."""
        if pre is None:
            return (ir.Matmul(c_rows, g_rows, b),)
        p_rows = row(p_i)
        return (ir.Select(p_rows, p_i, 0, index),
                ir.Matmul(c_rows, g_rows, b, mm.epilogue, p_rows))

    p_i = row(pre) if pre is not None else None
    ring = ir.ForLoop(j, 1, len(team), (
        ir.SetCurrentStream(comm),
        ir.Select(g_peer, g_i, 0, peer),
        ir.Communication(handle, ir.CommunicationType.SendRecv, team, mine, g_peer,
                         send_peer=back, recv_peer=peer),
        ir.SetCurrentStream(compute),
        ir.Wait(handle),
        ir.Select(c_peer, c_i, 0, peer),
        *gemm(c_peer, g_peer, p_i, peer),
    ))
    stage = ir.ForLoop(i, loop.start, loop.stop, (
        ir.Select(a_i, a, 0, i.name),
        ir.Select(mine, a_i, 0, 0),
        ir.Select(g_i, gathered, 0, i.name),
        ir.Select(c_i, out, 0, i.name),
        *((ir.Select(p_i, pre, 0, i.name),) if pre is not None else ()),
        ir.Select(c_mine, c_i, 0, rank),
        *gemm(c_mine, mine, p_i, rank),
        ring,
    ))
    user = ir.StreamValue("s0")
    allocations = tuple(s for s in program.body if isinstance(s, ir.Allocate))
    body = (
        ir.GetCurrentStream(user),
        *allocations,
        ir.SetCurrentStream(comm),
        ir.Synchronize(user),
        ir.SetCurrentStream(compute),
        ir.Synchronize(user),
        stage,
        ir.SetCurrentStream(user),
        ir.Synchronize(compute),
        ir.Synchronize(comm),
    )
    return dataclasses.replace(program, body=body, number_of_streams=number_of_streams,
                               provenance="collective_permute")
