"""What every result file under benchmarks/results/ records about where it came from."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def commit() -> str:
    """The checkout's HEAD, else HOSTIR_COMMIT (a copy of the tree without .git, as on
    the device machines), else "unknown"."""
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True, cwd=Path(__file__).resolve().parents[2]).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return os.environ.get("HOSTIR_COMMIT", "unknown")
