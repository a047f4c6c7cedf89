"""Fill the kernel cache ahead of time, so that a job's first step does not wait on NVRTC.

    python -m hostir.run warmup train_transformer --hidden 4096 --ffn 11008 --world 8
    python -m hostir.run warmup matmul --shapes 8192x8192x8192,4096x14336x4096
    python -m hostir.run warmup layer_norm --hidden 4096,5140 --dtype float16

Every generated kernel the target would compile on its first call is rendered here and
compiled in parallel (one thread a core, ``--workers``) into the disk kernel
cache (``HOSTIR_CACHE_DIR``); kernels already there, verified as a job reads them, are
skipped, and an entry that does not verify is replaced. Run it once per machine image,
or in a job's launch script before ``mpirun``. Without a GPU it compiles for ``--arch``
(default sm_90); on a GPU machine for that GPU. A cache directory that cannot be used
or written is refused before any compile (exit 4, like an output path).

Targets: ``train_transformer`` (the fused residual+norm, SwiGLU and GELU kernels of a
block of width ``--hidden`` whose MLP is ``--ffn`` wide over ``--world`` ranks),
``matmul`` (the generated GEMM the heuristics pick for each ``--shapes`` MxNxK),
``layer_norm`` and ``rms_norm`` (the normalization kernel the planner picks for each
``--hidden``, 8192 rows).
"""

from __future__ import annotations

import re
import sys
import time

from hostir.jobs import preflight as pf

TARGETS = ("train_transformer", "matmul", "layer_norm", "rms_norm")
SHORT = {"bfloat16": "bf16", "float16": "fp16"}
# The generated kernels' oldest part: mma.sync, cp.async and bf16 need sm_80.
MIN_ARCH = 80
# sm_ and a compute capability of 2 or 3 ASCII digits, no leading zero ("\d" takes
# other scripts' digits too, which NVRTC refuses)
_ARCH_FLAG = re.compile(r"sm_([1-9][0-9]{1,2})")


def add_arguments(p) -> None:
    p.add_argument("target", choices=TARGETS, help="the job or kernel family to warm up")
    p.add_argument("--hidden", default="4096", help="model width(s), comma-separated")
    p.add_argument("--ffn", type=pf.at_least(1), default=None,
                   help="train_transformer: MLP width (default Llama's 8/3 hidden, to 256)")
    p.add_argument("--head-dim", type=pf.at_least(2), default=128,
                   help="train_transformer: attention head width (rotary kernels; even)")
    p.add_argument("--world", type=pf.at_least(1), default=1,
                   help="train_transformer: the tensor-parallel ranks the model runs on")
    p.add_argument("--shapes", type=pf.shape_list, default=None,
                   help="matmul: MxNxK list, comma-separated")
    p.add_argument("--dtype", default="bfloat16", choices=sorted(SHORT))
    p.add_argument("--arch", default=None,
                   help="sm_80, sm_90, sm_100... (default: this GPU's, else sm_90)")
    p.add_argument("--workers", type=pf.at_least(1), default=None,
                   help="compiler threads (default: one a core)")


def _widths(text: str) -> list[int]:
    try:
        widths = [int(w) for w in text.split(",") if w.strip()]
    except ValueError:
        raise pf.UsageError(f"--hidden {text}: expected comma-separated integers") from None
    if not widths or min(widths) < 1:
        raise pf.UsageError(f"--hidden {text}: expected widths >= 1")
    return widths


def _nvrtc_archs() -> tuple[int, ...]:
    """The compute capabilities this NVRTC compiles for (80, 86, 90, ...); () where it
    cannot say (then the compile itself refuses an arch it lacks)."""
    try:
        from cupy.cuda import nvrtc

        return tuple(int(a) for a in nvrtc.getSupportedArchs())
    except Exception:  # noqa: BLE001 -- an NVRTC older than 11.2, or none to load
        return ()


def _check_arch(arch: str, what: str = "--arch", hint: str = "") -> None:
    """Refuse an arch the generated kernels or this NVRTC cannot compile for."""
    m = _ARCH_FLAG.fullmatch(arch)
    if m is None:
        if arch.endswith("a") and _ARCH_FLAG.fullmatch(arch[:-1]):
            raise pf.UsageError(f"{what} {arch}: give {arch[:-1]} (the wgmma kernels are "
                                "compiled for its 'a' target by themselves)")
        raise pf.UsageError(f"{what} {arch}: expected sm_XY or sm_XYZ, e.g. sm_90{hint}")
    cc = int(m.group(1))
    if cc < MIN_ARCH:
        raise pf.UsageError(f"{what} {arch}: the generated kernels need sm_{MIN_ARCH} or "
                            f"newer{hint}")
    supported = _nvrtc_archs()
    if supported and cc not in supported:
        from runtime.jit import nvrtc_version

        version = ".".join(map(str, nvrtc_version()))
        raise pf.UsageError(f"{what} {arch}: NVRTC {version} does not compile for it; it takes "
                            + ", ".join(f"sm_{a}" for a in supported if a >= MIN_ARCH) + hint)


def _check_cache() -> None:
    """Refuse, before any compile, a kernel cache that cannot be filled: off, a directory
    that cannot be created or written, or one that is not private (a job would not read
    it). Creates the directory (0700) as a job would."""
    from hostir.errors import OptionsError
    from hostir.options import options
    from runtime import jit

    try:
        off = options().disable("kernel_cache")
    except OptionsError as e:
        raise pf.UsageError(f"{type(e).__name__}: {e}") from None
    if off:
        raise pf.UsageError("HOSTIR_DISABLE=kernel_cache turns the disk kernel cache off: "
                            "nothing to fill")
    cache = jit.kernel_cache()
    problem = cache.disk_problem()
    if problem is not None:
        raise pf.OutputPathError(f"the kernel cache cannot be used: {problem}")


def validate(args, world) -> None:
    args.widths = _widths(args.hidden)
    if args.head_dim % 2:
        raise pf.UsageError(f"--head-dim {args.head_dim}: expected an even head width (rotary)")
    if args.target == "matmul" and not args.shapes:
        raise pf.UsageError("warmup matmul needs --shapes MxNxK[,MxNxK...]")
    if args.arch is not None:  # a usage error even where CuPy is missing
        _check_arch(args.arch)
    pf.need_module("cupy", pf.cupy_install() if args.arch is None else "'cupy-cuda13x[ctk]'",
                   "warmup (NVRTC through CuPy)")
    if args.arch is None:
        import torch

        _check_arch(_arch(args)[0], "this GPU's arch" if torch.cuda.is_available()
                    else "the default arch", " (--arch chooses another)")
    _check_cache()


def _arch(args) -> tuple[str, int, int]:
    if args.arch:  # checked by validate: sm_ and 2 or 3 digits, the last the minor
        return args.arch, int(args.arch[3:-1]), int(args.arch[-1])
    import torch

    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        return f"sm_{major}{minor}", major, minor
    return "sm_90", 9, 0


def seam_hardware():
    """The seam kernels' model of this machine's GPU (`runtime.fused.device_hardware`: the
    norm backward's stages follow its bandwidth), SM90's without a GPU."""
    import torch

    from lowering.kernels.seams import SM90

    if not torch.cuda.is_available():
        return SM90
    from runtime import fused

    return fused.device_hardware(torch.cuda.current_device())


def transformer_units(widths, ffn, world, dtype, arch, head_dim: int = 128) -> list:
    """Every seam kernel of a block: both norms (a Llama block uses RMSNorm, GPT-2 style
    LayerNorm), with and without residual, bias and dh; the column reduces; SwiGLU and
    GELU; the rotary embedding of ``head_dim``-wide heads, both ways. The elementwise
    kernels do not depend on the width."""
    from lowering.kernels import rotary
    from lowering.kernels.seams import every_variant, render

    hw = seam_hardware()
    specs = []
    for hidden in widths:
        specs += every_variant(hidden, SHORT[dtype], hw=hw)
    del ffn, world  # the MLP's seams are elementwise: one kernel for any width
    unique = {render(s): s for s in specs}
    unique.update({rotary.render(s): s for s in rotary.every_variant(head_dim, SHORT[dtype])})
    return [(src, [s.kernel_name], arch) for src, s in unique.items()]


def matmul_units(shapes, dtype, major, minor) -> list:
    """The heuristics' pick for each shape (an autotuned winner, if one is stored later,
    compiles on its first use). On a GPU machine, the GPU's SM count; else the model's
    default part."""
    import torch

    from lowering.kernels import heuristics
    from lowering.kernels.matmul import render

    on_gpu = torch.cuda.is_available()
    sms = (torch.cuda.get_device_properties(0).multi_processor_count if on_gpu
           else heuristics.DEFAULT_SM_COUNT)
    units = {}
    for M, N, K in shapes:
        spec = heuristics.choose(M, N, K, a_dtype=SHORT[dtype], out_dtype=SHORT[dtype],
                                 layout="TN", sm_count=sms, arch=f"sm_{major}{minor}")
        src = render(spec)
        units[src.source] = (src.source, list(src.names), spec.arch(major, minor))
    return list(units.values())


def norm_units(kind, widths, dtype, arch) -> list:
    """The kernels `runtime.normalization`'s calls of ``kind`` at these widths run: their
    specs as a call builds them (16-byte aligned tensors, the API's default eps), planned
    by this machine's GPU model (`device_hardware`: SM90's without a GPU; a GPU whose
    model picks another plan for a width compiles that kernel on first use)."""
    import torch

    from lowering.kernels.normalization import render_normalization
    from runtime import normalization as rn

    device = 0 if torch.cuda.is_available() else -1
    eps = 1e-5 if kind == "layer_norm" else 1e-6
    units = {}
    for hidden in widths:
        spec = rn.call_spec(kind, 8192, hidden, eps, dtype, 16, device)
        units[render_normalization(spec)] = (render_normalization(spec), [spec.kernel_name], arch)
    return list(units.values())


def _bar(done: int, total: int, start: float) -> None:
    width = 30
    filled = width * done // max(total, 1)
    line = (f"warmup [{'#' * filled}{'.' * (width - filled)}] {done}/{total} kernels "
            f"{time.perf_counter() - start:5.1f} s")
    if sys.stderr.isatty():
        print("\r" + line, end="" if done < total else "\n", file=sys.stderr, flush=True)
    elif done == total or (done and done % max(1, total // 10) == 0):
        print(line, file=sys.stderr, flush=True)


def main(args) -> int:
    from runtime import jit

    if not hasattr(args, "widths"):
        validate(args, None)
    arch, major, minor = _arch(args)
    if args.target == "train_transformer":
        units = transformer_units(args.widths, args.ffn, args.world, args.dtype, arch,
                                  args.head_dim)
    elif args.target == "matmul":
        units = matmul_units(args.shapes, args.dtype, major, minor)
    else:
        units = norm_units(args.target, args.widths, args.dtype, arch)
    start = time.perf_counter()
    cache = jit.kernel_cache()
    try:
        errors = jit.precompile(units, args.workers, lambda d, t: _bar(d, t, start))
    except jit.CacheWriteError as e:
        # the cache is what warmup makes: an entry not written is its failure, one line
        if sys.stderr.isatty():
            print(file=sys.stderr)  # ends the progress bar's line
        raise pf.OutputPathError(f"the kernel cache cannot be filled: {e}") from None
    failed = [e for e in errors if e]
    replaced = cache.stats.rebuilt_corrupt + cache.stats.refused
    print(f"warmup {args.target}: {len(units) - len(failed)} of {len(units)} kernels in "
          f"{cache.directory} ({arch}), {time.perf_counter() - start:.1f} s"
          + (f"; {replaced} that did not verify rebuilt" if replaced else ""))
    for e in failed[:5]:
        print(f"  failed: {e[:300]}", file=sys.stderr)
    return 1 if failed else 0
