"""What every result file under benchmarks/results/ records about where it came from."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def commit() -> str:
    """HOSTIR_COMMIT when set (a copy of the tree, as on the device machines, may carry a
    .git that is not the commit being measured), else the checkout's HEAD, else
    "unknown"."""
    env = os.environ.get("HOSTIR_COMMIT")
    if env:
        return env
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True, cwd=Path(__file__).resolve().parents[2]).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
