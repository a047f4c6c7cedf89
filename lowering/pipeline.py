"""The ordered passes from a fusion to a host program.

Each pass is a pure function; the result of each is verified, and printed under
``HOSTIR_DUMP=lowering`` with the name of the pass that produced it. The first pass is
chosen by the fusion's sharding: a sharded contraction axis (or a sharded output) is the
GEMM + ReduceScatter side, anything else the AllGather + GEMM side.

    >>> program = lower(fusion, world_size=2, number_of_streams=2)   # doctest: +SKIP
"""

from __future__ import annotations

from hostir import ir
from hostir.options import dump
from hostir.printer import print_program
from hostir.verify import verify
from lowering.fusion import Fusion
from lowering.passes.assign_streams import assign_streams
from lowering.passes.collective_permute import collective_permute
from lowering.passes.lower_communication import lower_communication
from lowering.passes.lower_normalization import NORM_OPS, is_normalization, lower_normalization
from lowering.passes.lower_reduce_scatter import lower_reduce_scatter
from lowering.passes.ring_reduce_scatter import ring_reduce_scatter
from lowering.patterns import is_reduce_scatter


SCHEDULES = ("pipelined", "ring")


def lower(fusion: Fusion, world_size: int, number_of_streams: int = 2, rank: int = 0,
          schedule: str = "pipelined", normalization_plan=None) -> ir.Program:
    """Lower ``fusion`` for ``world_size`` ranks onto ``number_of_streams`` worker streams.

    ``schedule``: ``pipelined`` runs each stage's collective (one Allgather before, or one
    ReduceScatter after, the stage's GEMM) on round-robin worker streams. ``ring`` moves
    data by SendRecv on a communication stream beside the compute stream: on the
    AllGather + GEMM side the local rows are multiplied first while the others arrive (a
    collective permute, ``collective_permute``); on the GEMM + ReduceScatter side partial
    sums travel round the ranks and this rank's own rows are multiplied last
    (``ring_reduce_scatter``, whose input A is re-typed to address each owner's rows: pass
    ``a.view(program.inputs[0].local_shape)``).

    ``normalization_plan`` (normalization fusions): the plan chooser of
    `lower_normalization`, e.g. ``functools.partial(runtime.normalization.choose,
    device_index=0)`` for the autotuner's stored winner on device 0; by default the
    heuristic's plan.
    """
    if schedule not in SCHEDULES:
        from hostir.errors import LoweringError

        raise LoweringError(f"unknown schedule {schedule!r}: expected one of {SCHEDULES}")
    if isinstance(fusion, Fusion) and not any(
            op.kind == "matmul" or op.kind in NORM_OPS for op in fusion.ops):
        from hostir.errors import LoweringError

        raise LoweringError(
            f"fusion ops {[op.kind for op in fusion.ops]}: no lowering for them; expected a "
            "sharded matmul (AllGather+GEMM or GEMM+ReduceScatter) or a normalization "
            "(layer_norm / rms_norm with pointwise add and cast)")
    if isinstance(fusion, Fusion) and is_normalization(fusion):
        # One device, one generated kernel on the current stream: no streams to assign.
        program = lower_normalization(fusion, normalization_plan)
        verify(program)
        dump("lowering", f"// after pass lower_normalization\n{print_program(program)}", rank)
        return program
    if isinstance(fusion, Fusion) and is_reduce_scatter(fusion):
        first = ("lower_reduce_scatter", lambda _: lower_reduce_scatter(fusion, world_size))
    else:
        first = ("lower_communication", lambda _: lower_communication(fusion, world_size))
    if schedule == "ring" and first[0] == "lower_communication":
        second = ("collective_permute", lambda p: collective_permute(p, number_of_streams))
    elif schedule == "ring":
        second = ("ring_reduce_scatter", lambda p: ring_reduce_scatter(p, number_of_streams))
    else:
        second = ("assign_streams", lambda p: assign_streams(p, number_of_streams))
    steps = [first, second]
    program = None
    for name, step in steps:
        program = step(program)
        verify(program)
        dump("lowering", f"// after pass {name}\n{print_program(program)}", rank)
    return program
