"""Program -> program: GEMM+ReduceScatter as a ring of partial sums, this rank's rows last.

``lower_reduce_scatter`` multiplies a whole stage and reduce-scatters it with one
collective, so each stage's ReduceScatter (NCCL kernels, SMs taken from the next GEMM)
follows its GEMM. Here, for D ranks, each stage is D steps. Step j = 1 .. D-1 computes
the partial product of the rows that rank (rank - j) % D owns; the partial sum of those
rows that the previous rank sent (step j-1 of rank - 1, for the same rows) is added to it,
and the sum goes on to rank (rank + 1) % D by a SendRecv. The last step computes this
rank's own rows and adds the partial sum of every other rank, received in the last
transfer. Transfers run on worker stream 1, GEMMs and adds on worker stream 0; each
transfer is posted before the next step's GEMM and waited only by that step's add, so
transfer j overlaps GEMM j+1, and the last transfer hides behind the local GEMM (the
local-first ring of ``collective_permute``, mirrored). Whether a SendRecv moves through
NCCL or through the copy engine (no SMs) is the communicator's choice.

    FOR i in range(0, S):                         # stages (the Stream axis)
      P[i][(rank - 1) % D] = matmul(rows of rank - 1)          # stream 0
      FOR j in range(1, D - 1):                   # only for D > 2
        SetCurrentStream to Stream 1
        Synchronize Stream 0                      # the partial sum is complete
        C0 = Communication(SendRecv, in=P[i][(rank - j) % D], out=R[i][j - 1],
                           send_peer=((rank + 1) % worldSize), recv_peer=((rank - 1) % worldSize))
        SetCurrentStream to Stream 0
        P[i][(rank - j - 1) % D] = matmul(...)    # overlaps the transfer
        Wait C0
        P[i][(rank - j - 1) % D] = add(P[i][(rank - j - 1) % D], R[i][j - 1])
      ... the same transfer of P[i][(rank + 1) % D] into R[i][D - 2] ...
      C[i] = matmul(this rank's rows)             # hides the last transfer
      Wait C1
      C[i] = add(C[i], R[i][D - 2])

Accumulation: each ``add`` sums in the output dtype and rounds once (bf16 sums in bf16),
which is what NCCL's ring ReduceScatter does over bf16 (it rounds after every hop); the
order of the sum differs, so results match the pipelined program to rounding, and exactly
for D = 2 (a + b is commutative). (hostir's MPI transport, for CPU ranks, sums half types
in float32 and rounds once, so there the two forms differ by bf16 rounding for D > 2.)

The rows of a stage must be addressable by owner, so input A is re-typed from
``[Stream(S), M/S, DIDx(D), K/D]`` to ``[Stream(S), D, M/(S*D), DIDx(D), K/D]`` (without
a Stream axis: ``[M, DIDx(D), K/D]`` to ``[D, M/D, DIDx(D), K/D]``): the same contiguous
memory, so callers pass a view (``x.view(program.inputs[0].local_shape)``). B and the
output C ``[S, M/(S*D), N]`` keep their types.
"""

from __future__ import annotations

import dataclasses

from hostir import ir
from hostir.errors import LoweringError

COMM, COMPUTE = 1, 0
P = ir.ParallelType


def _pattern(program: ir.Program):
    """A, B, b_local, the output and the team of a ``lower_reduce_scatter`` program."""
    if program.provenance != "lower_reduce_scatter" or len(program.inputs) != 2 or \
            len(program.outputs) != 1:
        raise LoweringError("ring_reduce_scatter: expected the program of lower_reduce_scatter "
                            f"(inputs A, B; one output), got one from {program.provenance!r}")
    comms = [s for s in ir.walk(program.body) if isinstance(s, ir.Communication)]
    if len(comms) != 1 or comms[0].type is not ir.CommunicationType.ReduceScatter:
        raise LoweringError("ring_reduce_scatter: expected one ReduceScatter, got "
                            f"{[c.type.value for c in comms]}")
    if comms[0].reduce_op != "sum":
        raise LoweringError(f"ring_reduce_scatter: expected a sum, got {comms[0].reduce_op}")
    first = program.body[0]
    if not isinstance(first, ir.Select) or first.input != program.inputs[1]:
        raise LoweringError("ring_reduce_scatter: expected the program to start with the "
                            "select of this rank's rows of B")
    return program.inputs[0], program.inputs[1], first.out, program.outputs[0], comms[0].team


def ring_reduce_scatter(program: ir.Program, number_of_streams: int = 2) -> ir.Program:
    if not isinstance(number_of_streams, int) or number_of_streams < 1:
        raise LoweringError(f"numberOfStreams must be a positive int, got {number_of_streams!r}")
    a, b, b_local, out, team = _pattern(program)
    d = len(team)
    staged = a.parallel[0] is P.Stream
    S, m, N = out.shape
    k_local = a.shape[-1]
    if staged:
        a_ring = ir.Tensor(a.name, (S, d, m, d, k_local), a.dtype,
                           (P.Stream, P.Serial, P.Serial, P.DIDx, P.Serial), a.mesh)
    else:
        a_ring = ir.Tensor(a.name, (d, m, d, k_local), a.dtype,
                           (P.Serial, P.Serial, P.DIDx, P.Serial), a.mesh)
    names = ir.fresh_tensor_names(program)
    dtype = out.dtype
    partial = ir.Tensor(next(names), (S, d, m, N), dtype)        # P: each owner's rows
    received = ir.Tensor(next(names), (S, max(d - 1, 1), m, N), dtype)  # R: one per transfer
    rank, world = ir.Var("rank"), ir.Var("worldSize")
    comm, compute = ir.PoolStream(COMM), ir.PoolStream(COMPUTE)
    nxt = ir.BinOp("%", ir.BinOp("+", rank, ir.Const(1)), world)
    prv = ir.BinOp("%", ir.BinOp("-", rank, ir.Const(1)), world)

    def owner(j: ir.IndexExpr) -> ir.IndexExpr:  # whose rows step j computes
        return ir.BinOp("%", ir.BinOp("-", rank, j), world)

    def select(src: ir.Tensor, axis: int, index) -> tuple[ir.Tensor, ir.Select]:
        t = ir.select_type(next(names), src, axis)
        return t, ir.Select(t, src, axis, index)

    def gemm(a_i: ir.Tensor, rows: ir.IndexExpr, into: ir.Tensor | None, p_i: ir.Tensor):
        """The partial product of the rows ``rows`` of stage ``a_i``: into ``into`` when
        given, else into P's chunk of those rows. Returns (statements, the product)."""
        a_r, s1 = select(a_i, 0, rows)
        a_rl, s2 = select(a_r, 1, 0)   # this rank's K/D (its DIDx slice, local index 0)
        stmts = [s1, s2]
        if into is None:
            into, s3 = select(p_i, 0, rows)
            stmts.append(s3)
        return stmts + [ir.Matmul(into, a_rl, b_local)], into

    def transfer(handle: str, p_i, r_i, step: ir.IndexExpr, slot: ir.IndexExpr):
        """Send the partial sum of step ``step`` to the next rank, receive the previous
        rank's into R's ``slot``: on the comm stream, after the compute stream's work."""
        p_s, s1 = select(p_i, 0, owner(step))
        r_s, s2 = select(r_i, 0, slot)
        h = ir.CommHandle(handle)
        stmts = [ir.SetCurrentStream(comm), ir.Synchronize(compute), s1, s2,
                 ir.Communication(h, ir.CommunicationType.SendRecv, team, p_s, r_s,
                                  send_peer=nxt, recv_peer=prv),
                 ir.SetCurrentStream(compute)]
        return stmts, h, r_s

    def stage(a_i, p_i, r_i, c_i) -> list:
        if d == 1:
            return gemm(a_i, rank, c_i, p_i)[0]
        body, _ = gemm(a_i, owner(ir.Const(1)), None, p_i)
        if d > 2:
            j = ir.IndexVar("j")
            send, h, r_s = transfer("C0", p_i, r_i, ir.Var(j.name),
                                    ir.BinOp("-", ir.Var(j.name), ir.Const(1)))
            mm, p_n = gemm(a_i, owner(ir.BinOp("+", ir.Var(j.name), ir.Const(1))), None, p_i)
            body.append(ir.ForLoop(j, 1, d - 1, (
                *send, *mm, ir.Wait(h), ir.Add(p_n, p_n, r_s))))
        send, h, r_s = transfer("C1" if d > 2 else "C0", p_i, r_i, ir.Const(d - 1),
                                ir.Const(d - 2))
        mm, _ = gemm(a_i, rank, c_i, p_i)
        return body + [*send, *mm, ir.Wait(h), ir.Add(c_i, c_i, r_s)]

    if staged:
        i = ir.IndexVar("i")
        a_i, s_a = select(a_ring, 0, i.name)
    else:
        i, a_i, s_a = None, a_ring, None
    index = i.name if staged else 0
    p_i, s_p = select(partial, 0, index) if d > 1 else (None, None)
    r_i, s_r = select(received, 0, index) if d > 1 else (None, None)
    c_i, s_c = select(out, 0, index)
    stage_body = [s for s in (s_a, s_p, s_r, s_c) if s is not None] + stage(a_i, p_i, r_i, c_i)
    stages = [ir.ForLoop(i, 0, S, tuple(stage_body))] if staged else stage_body
    user = ir.StreamValue("s0")
    body = (
        ir.GetCurrentStream(user),
        ir.Select(b_local, b, 0, 0),
        *((ir.Allocate(partial), ir.Allocate(received)) if d > 1 else ()),
        ir.Allocate(out),
        ir.SetCurrentStream(comm),
        ir.Synchronize(user),
        ir.SetCurrentStream(compute),
        ir.Synchronize(user),
        *stages,
        ir.SetCurrentStream(user),
        ir.Synchronize(compute),
        ir.Synchronize(comm),
    )
    return dataclasses.replace(program, inputs=(a_ring, b), body=body,
                               number_of_streams=number_of_streams,
                               provenance="ring_reduce_scatter")
