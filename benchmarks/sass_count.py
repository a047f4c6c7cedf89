"""Static SASS instruction counts of the generated normalization kernels; no GPU needed.

Compiles the reference fusion's kernel (the heuristic's plan, or one with --plan
overrides) with NVRTC for sm_90, disassembles it with nvdisasm and prints the number of
instructions and the most frequent opcodes, with a generator flag off and on if --flag
is given. nvdisasm comes with the CUDA toolkit or ``pip install nvidia-cuda-nvdisasm``;
pass its path with --nvdisasm if it is not on PATH.

    python benchmarks/sass_count.py --hidden 5140,4096 --flag LEAN_ADDRESSES
    python benchmarks/sass_count.py --hidden 5140 --plan param_cache=none,threads_per_row=192,batch=7,blocks_per_sm=5
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

INSTRUCTION = re.compile(r"^\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")


def opcodes(sass: str) -> collections.Counter:
    """Opcode (with its modifiers) -> count, over every instruction line of ``sass``."""
    return collections.Counter(m.group(1) for m in map(INSTRUCTION.match, sass.splitlines()) if m)


def disassemble(cubin: bytes, nvdisasm: str) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as fh:
        fh.write(cubin)
        fh.flush()
        return subprocess.run([nvdisasm, "-c", fh.name], check=True, capture_output=True,
                              text=True).stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", default="5140")
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--flag", help="a boolean flag of lowering.kernels.normalization, off then on")
    ap.add_argument("--plan", default="", help="spec overrides, name=value,...")
    ap.add_argument("--nvdisasm", default=shutil.which("nvdisasm") or "nvdisasm")
    ap.add_argument("--top", type=int, default=12)
    a = ap.parse_args()
    import lowering.kernels.normalization as nm
    from probe_common import plan_overrides
    from runtime import jit

    overrides = plan_overrides(a.plan)
    values = (False, True) if a.flag else (None,)
    if a.flag and not isinstance(getattr(nm, a.flag, None), bool):
        raise SystemExit(f"{a.flag} is no boolean flag of lowering.kernels.normalization")
    for hidden in (int(h) for h in a.hidden.split(",")):
        for value in values:
            if a.flag:
                setattr(nm, a.flag, value)
            spec = dataclasses.replace(nm.NormalizationSpec.reference_fusion(a.rows, hidden, 1e-5),
                                       **overrides)
            ck = jit.compile(nm.render_normalization(spec), [spec.kernel_name], "sm_90")
            count = opcodes(disassemble(ck.cubin, a.nvdisasm))
            tag = f" {a.flag}={value}" if a.flag else ""
            print(f"{hidden} {spec.plan.describe()}{tag}: {sum(count.values())} instructions, "
                  f"{ck.registers[spec.kernel_name]} registers; "
                  + ", ".join(f"{k} {n}" for k, n in count.most_common(a.top)), flush=True)


if __name__ == "__main__":
    main()
