"""What every results file records about where it came from, and how results files are named."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path


def commit() -> str:
    """HOSTIR_COMMIT when set (a copy of the tree, as on the device machines, may carry
    a stale .git or none), else the checkout's HEAD, else "unknown"."""
    if os.environ.get("HOSTIR_COMMIT"):
        return os.environ["HOSTIR_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True, cwd=Path(__file__).resolve().parents[2]).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def device_slug(name: str) -> str:
    """One spelling of a device in file names: the CUDA device name lowercased, words joined
    by '-', the memory size and kind left out (``NVIDIA H200`` → ``nvidia-h200``,
    ``NVIDIA H100 80GB HBM3`` → ``nvidia-h100``; ``NVIDIA H100 NVL`` keeps ``-nvl``)."""
    words = re.split(r"[^a-z0-9]+", name.lower())
    kept = [w for w in words if w and not re.fullmatch(r"\d+gb|hbm\d*e?", w)]
    return "-".join(kept) or "unknown"


def results_name(bench: str, device: str, world_size: int = 1) -> str:
    """``<bench>_<device>[_x<N>].json``: the name of a results file (N = world size > 1)."""
    return f"{bench}_{device_slug(device)}{f'_x{world_size}' if world_size > 1 else ''}.json"


def results_path(json_flag: str, bench: str, device: str, world_size: int = 1) -> Path:
    """Where ``--json`` writes: the file named, or, given a directory (an existing one, or
    a path ending in '/'), `results_name` inside it."""
    p = Path(json_flag).expanduser()
    if p.is_dir() or json_flag.endswith(os.sep):
        return p / results_name(bench, device, world_size)
    return p


def write_json(path: Path, doc: dict) -> None:
    """Write ``doc`` to ``path`` whole (a reader never sees half a file)."""
    import json

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(doc, indent=1) + "\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
