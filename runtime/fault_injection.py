"""Faults on purpose, for the fault tests: ``HOSTIR_INJECT_FAULT=rank:statement:kind``.

A documented test feature (docs/RELIABILITY.md, "Fault injection"). The interpreter reads
the variable once, when it is built; without it nothing here runs (the statement loop is
the plain one); a malformed value is an ``OptionsError`` on every rank. With it, the rank
named runs the fault just before the ``statement``-th statement it executes, counted over
all its calls (0-based, FOR bodies counted once per iteration, the FOR itself counted
too), once:

    raise   raise ExecutionError (an exception on one rank mid-program)
    exit    os._exit(3)            (a rank that dies without a word to MPI)
    kill    SIGKILL to itself      (a rank killed from outside)
    hang    sleep forever          (a rank stuck: its peers must time out)

Example::

    HOSTIR_INJECT_FAULT=1:24:raise mpirun -np 2 python -m hostir.run fault_injection
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import time

from hostir.errors import ExecutionError, OptionsError
from hostir.printer import format_statement

KINDS = ("raise", "exit", "kill", "hang")


@dataclasses.dataclass(frozen=True)
class Fault:
    rank: int
    statement: int
    kind: str

    @staticmethod
    def parse(text: str) -> "Fault":
        try:
            rank, index, kind = text.split(":")
            fault = Fault(int(rank), int(index), kind.strip())
        except ValueError:
            fault = None
        if fault is None or fault.kind not in KINDS or fault.rank < 0 or fault.statement < 0:
            raise OptionsError(
                f"HOSTIR_INJECT_FAULT={text}: expected rank:statement:kind (rank and "
                f"statement whole numbers >= 0, kind one of {', '.join(KINDS)}), e.g. 1:19:hang")
        return fault

    def trigger(self, statement) -> None:
        where = format_statement(statement)
        sys.stderr.write(f"[rank {self.rank}] hostir: injected fault {self.kind!r} before "
                         f"statement {self.statement} `{where}`\n")
        sys.stderr.flush()
        if self.kind == "raise":
            err = ExecutionError(f"rank {self.rank}: while executing `{where}`: injected "
                                 f"fault (HOSTIR_INJECT_FAULT) at statement {self.statement}")
            err._hostir_where = True
            raise err
        if self.kind == "exit":
            os._exit(3)
        if self.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        while True:  # hang
            time.sleep(3600)


def from_environ() -> Fault | None:
    text = os.environ.get("HOSTIR_INJECT_FAULT")
    return Fault.parse(text) if text else None


def instrument(interpreter, fault: Fault) -> None:
    """Give ``interpreter`` a statement loop that counts statements and fires ``fault``."""
    if interpreter.params["rank"] != fault.rank:
        return
    plain = interpreter._body
    count = [0]  # statements started, over all calls: the fault fires once

    def body(stmts, frame):
        for s in stmts:
            if count[0] == fault.statement:
                fault.trigger(s)
            count[0] += 1
            plain((s,), frame)

    interpreter._body = body
