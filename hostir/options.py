"""Runtime knobs, read once from the environment into one frozen object.

    HOSTIR_DUMP=host_ir,lowering,cuda_kernel,launch_params,ptxas,autotune
    HOSTIR_ENABLE=autotune,check_zeroed
    HOSTIR_DISABLE=input_agreement,weight_agreement,kernel_cache,direct_sendrecv,wgmma,
                   stream_memops,dependent_launch,auto_graph
    HOSTIR_CACHE_DIR=~/.cache/hostir
    HOSTIR_COMM_TIMEOUT=300   (seconds, at most a week; 0 waits forever)

Example:
    >>> from hostir.options import options
    >>> options().dump("host_ir")
    False
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

from hostir.errors import OptionsError

DUMP_OPTIONS = frozenset(
    {"host_ir", "lowering", "cuda_kernel", "launch_params", "ptxas", "autotune"}
)
ENABLE_OPTIONS = frozenset({"check_zeroed", "autotune"})
DISABLE_OPTIONS = frozenset({"input_agreement", "weight_agreement", "kernel_cache",
                             "direct_sendrecv", "wgmma", "stream_memops", "dependent_launch",
                             "auto_graph"})
DEFAULT_CACHE_DIR = Path.home() / ".cache" / "hostir"
# The longest HOSTIR_COMM_TIMEOUT (a week): longer ones overflow the transports' own
# timeouts (a timedelta, milliseconds in an integer); 0 waits forever instead.
MAX_COMM_TIMEOUT_S = 7 * 24 * 3600


def _parse_list(var: str, allowed: frozenset[str], environ) -> frozenset[str]:
    raw = environ.get(var, "")
    names = frozenset(x.strip() for x in raw.split(",") if x.strip())
    unknown = names - allowed
    if unknown:
        raise OptionsError(
            f"{var}: unknown option(s) {sorted(unknown)}; expected some of {sorted(allowed)}"
        )
    return names


@dataclasses.dataclass(frozen=True, slots=True)
class Options:
    dumps: frozenset[str] = frozenset()
    enabled: frozenset[str] = frozenset()
    disabled: frozenset[str] = frozenset()
    cache_dir: Path = DEFAULT_CACHE_DIR
    comm_timeout_s: float = 300.0

    def dump(self, name: str) -> bool:
        assert name in DUMP_OPTIONS, name
        return name in self.dumps

    def enable(self, name: str) -> bool:
        assert name in ENABLE_OPTIONS, name
        return name in self.enabled

    def disable(self, name: str) -> bool:
        assert name in DISABLE_OPTIONS, name
        return name in self.disabled

    @staticmethod
    def from_environ(environ=None) -> "Options":
        environ = os.environ if environ is None else environ
        cache = environ.get("HOSTIR_CACHE_DIR")
        return Options(
            dumps=_parse_list("HOSTIR_DUMP", DUMP_OPTIONS, environ),
            enabled=_parse_list("HOSTIR_ENABLE", ENABLE_OPTIONS, environ),
            disabled=_parse_list("HOSTIR_DISABLE", DISABLE_OPTIONS, environ),
            cache_dir=Path(cache).expanduser() if cache else DEFAULT_CACHE_DIR,
            comm_timeout_s=_seconds(environ.get("HOSTIR_COMM_TIMEOUT", "300")),
        )


def _seconds(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 0 <= value <= MAX_COMM_TIMEOUT_S:  # also refuses nan and inf
        raise OptionsError(f"HOSTIR_COMM_TIMEOUT: expected seconds from 0 to "
                           f"{MAX_COMM_TIMEOUT_S} (a week; 0 waits forever), got {raw!r}")
    return value


_OPTIONS: Options | None = None


def options() -> Options:
    """The process's options, parsed from the environment on first use."""
    global _OPTIONS
    if _OPTIONS is None:
        _OPTIONS = Options.from_environ()
    return _OPTIONS


def set_options(new: Options | None) -> None:
    """Replace the process's options (tests); None re-reads the environment on next use."""
    global _OPTIONS
    _OPTIONS = new


def dump(name: str, text: str, rank: int = 0) -> None:
    """Print a dump to stdout when HOSTIR_DUMP names it (rank 0 only)."""
    if rank == 0 and options().dump(name):
        print(text, file=sys.stdout, flush=True)
