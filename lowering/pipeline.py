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
from lowering.passes.lower_communication import lower_communication
from lowering.passes.lower_reduce_scatter import lower_reduce_scatter
from lowering.patterns import is_reduce_scatter


def lower(fusion: Fusion, world_size: int, number_of_streams: int = 2, rank: int = 0) -> ir.Program:
    """Lower ``fusion`` for ``world_size`` ranks onto ``number_of_streams`` worker streams."""
    if isinstance(fusion, Fusion) and is_reduce_scatter(fusion):
        first = ("lower_reduce_scatter", lambda _: lower_reduce_scatter(fusion, world_size))
    else:
        first = ("lower_communication", lambda _: lower_communication(fusion, world_size))
    steps = [first, ("assign_streams", lambda p: assign_streams(p, number_of_streams))]
    program = None
    for name, step in steps:
        program = step(program)
        verify(program)
        dump("lowering", f"// after pass {name}\n{print_program(program)}", rank)
    return program
