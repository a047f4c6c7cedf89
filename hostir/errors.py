"""One error family for everything hostir refuses or fails at.

Every message names the statement, tensor, axis or kernel involved and says what was
expected and what was found, so a user reading one rank's log knows what to fix.
"""

from __future__ import annotations


class HostIrError(Exception):
    """Base of every error hostir raises on purpose."""


class OptionsError(HostIrError, ValueError):
    """A HOSTIR_* environment variable (or a flag) with a value hostir does not accept."""


class LoweringError(HostIrError, ValueError):
    """A definition that the lowering cannot turn into a host program."""


class VerificationError(HostIrError, ValueError):
    """A host program that breaks an invariant of well-formed programs."""


class ParseError(HostIrError, ValueError):
    """Text that is not a host program; carries the line and column."""

    def __init__(self, message: str, line: int, column: int):
        super().__init__(f"line {line}, column {column}: {message}")
        self.line = line
        self.column = column


class InputMismatchError(HostIrError, ValueError):
    """An input that does not match the program's signature (or differs between ranks)."""


class CompilationError(HostIrError, RuntimeError):
    """A generated kernel that NVRTC refused; the message carries the compiler log."""


class CommunicationError(HostIrError, RuntimeError):
    """A collective that failed, or a peer rank that failed."""


class CommTimeoutError(CommunicationError):
    """A collective that did not finish within HOSTIR_COMM_TIMEOUT."""


class ExecutionError(HostIrError, RuntimeError):
    """A failure while interpreting a statement; the message names the statement."""
