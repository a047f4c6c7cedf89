"""The warmup GPU tests' shared step: fill a kernel cache with ``hostir.run warmup``, then
count what a fresh process that reads it still compiles."""

from __future__ import annotations

import os
import subprocess
import sys


def compiles_after_warmup(cache_dir, warmups: list[list[str]], calls: str,
                          warmup_timeout: int = 600) -> tuple[int, int]:
    """Run ``python -m hostir.run warmup ARGS`` for each ARGS in ``warmups`` with the
    kernel cache in ``cache_dir`` (each within ``warmup_timeout`` seconds), then ``calls``
    (Python source that imports torch) in a new process on the same cache: that process's (compiles, disk
    hits)."""
    env = dict(os.environ, HOSTIR_CACHE_DIR=str(cache_dir))
    for argv in warmups:
        done = subprocess.run([sys.executable, "-m", "hostir.run", "warmup", *argv], env=env,
                              capture_output=True, text=True, timeout=warmup_timeout)
        assert done.returncode == 0, done.stderr[-2000:]
    probe = (calls + "torch.cuda.synchronize()\n"
             "from runtime import jit\n"
             "s = jit.kernel_cache().stats\n"
             "print(s.compiles, s.disk_hits)\n")
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    compiles, disk_hits = map(int, done.stdout.split()[-2:])
    return compiles, disk_hits
