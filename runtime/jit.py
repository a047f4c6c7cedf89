"""NVRTC through CuPy: compile CUDA C++ to a cubin, cache it, load it, launch it.

Three layers, each usable alone:

1. `compile(source, names, arch)` calls `cupy.cuda.nvrtc` directly (createProgram,
   compileProgram, getCUBIN). That needs no GPU and no driver, so CI compiles every
   generated kernel. ptxas' verbose output is parsed for registers and spills.
2. `KernelCache`: memory by key, then disk under `options().cache_dir / "kernels"`. The key
   is sha256 of (source, options, arch, NVRTC version). Entries are read and written
   through `runtime.store`: the directory must be private (else the disk is bypassed,
   since a cubin read back runs in this process), only a regular file of at most
   `runtime.store.MAX_ENTRY_BYTES` is read, writes are atomic. Every entry carries a
   sha256 of its payload (corruption, not trust) and its own key, names and arch; any
   field out of shape or range is a miss, rebuilt, never loaded.
3. `load(compiled)` / `Kernel.launch(...)`: the cubin becomes a `cupy.RawModule` and is
   launched on the current torch stream (CuPy's `Stream.from_external`) over `data_ptr()`s.

Dumps: HOSTIR_DUMP=cuda_kernel (source), ptxas (registers, spills), launch_params.

Example:
    >>> from runtime import jit
    >>> ck = jit.compile('extern "C" __global__ void k(float* x) { x[0] = 1.f; }', ["k"])
    >>> ck.registers["k"] > 0
    True
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import hashlib
import json
import os
import re
import struct
import sys
import tempfile
import threading
from pathlib import Path
from typing import Sequence

from hostir.errors import CompilationError
from hostir.options import dump, options
from runtime import store
from runtime.store import write_atomically  # noqa: F401 - the writers' one way, named here too

DEFAULT_ARCH = "sm_90"
BASE_OPTIONS = ("-std=c++17", "--ptxas-options=-v")
# Entries of the format before the key, names and arch were in the header read as misses.
_ENTRY_MAGIC = b"HOSTIRK2"
MAX_HEADER_BYTES = 1 << 20   # an entry's JSON header (ptxas' log is most of it)
MAX_KERNELS_AN_ENTRY = 256
MAX_REGISTERS = 255          # a thread's registers on every arch ptxas targets
MAX_FRAME_BYTES = 1 << 24    # spill and stack bytes a kernel may report
_ARCH = re.compile(r"sm_[0-9]{2,3}a?")
_KEY = re.compile(r"[0-9a-f]{64}")


@dataclasses.dataclass(frozen=True, slots=True)
class CompiledKernel:
    """A cubin and what ptxas said about each kernel in it."""

    cubin: bytes
    names: tuple[str, ...]        # the kernels' names as asked for (extern "C": unmangled)
    lowered: dict[str, str]       # asked-for name -> symbol in the cubin
    registers: dict[str, int]     # symbol -> registers per thread
    spill_bytes: dict[str, int]   # symbol -> spill stores + loads (bytes)
    local_bytes: dict[str, int]   # symbol -> stack frame (local memory) bytes
    log: str
    arch: str


def nvrtc_version() -> tuple[int, int]:
    from cupy.cuda import nvrtc
    return tuple(nvrtc.getVersion())


_PTXAS_FUNC = re.compile(r"Compiling entry function '([^']+)'")
# ptxas reports each function's frame under "Function properties for <name>", a called
# (non-inlined) device function's after its caller's: those lines are the callee's, kept
# under its own (mangled) name, not the entry's
_PTXAS_PROPS = re.compile(r"Function properties for (\S+)")
_PTXAS_REGS = re.compile(r"Used (\d+) registers")
_PTXAS_SPILL = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
_PTXAS_STACK = re.compile(r"(\d+) bytes stack frame")


def parse_ptxas(log: str) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
    """Registers, spill bytes and stack bytes per function from `ptxas -v` text: each
    entry under its name, each non-inlined function it calls under its mangled one."""
    regs: dict[str, int] = {}
    spills: dict[str, int] = {}
    stack: dict[str, int] = {}
    current = None
    for line in log.splitlines():
        if m := _PTXAS_FUNC.search(line):
            current = m.group(1)
            continue
        if m := _PTXAS_PROPS.search(line):
            current = m.group(1)
            continue
        if current is None:
            continue
        if m := _PTXAS_REGS.search(line):
            regs[current] = int(m.group(1))
        if m := _PTXAS_SPILL.search(line):
            spills[current] = int(m.group(1)) + int(m.group(2))
        if m := _PTXAS_STACK.search(line):
            stack[current] = int(m.group(1))
    return regs, spills, stack


def compile(source: str, names: Sequence[str], arch: str = DEFAULT_ARCH,
            options: Sequence[str] = ()) -> CompiledKernel:  # noqa: A001 - the field's word
    """Compile `source` to a cubin for `arch` ("sm_90", "sm_90a", "sm_80"). No GPU needed.

    `names` are the kernels to look up: extern "C" names, or C++ name expressions (then
    their mangled symbols are found through NVRTC's lowered names).
    Raises CompilationError carrying NVRTC's log, or when ptxas' report of a kernel is
    missing (registers and spills unknown) in `PTXAS_ATTEMPTS` compiles.
    """

    dump("cuda_kernel", f"// ---- hostir kernel {', '.join(names)} ({arch})\n{source}")
    for attempt in range(1, PTXAS_ATTEMPTS + 1):
        ck = _compile_once(source, names, arch, options)
        silent = [n for n in names if ck.lowered[n] not in ck.registers]
        if not silent:
            break
        # Seen on the H200 machines before `NVRTC_NO_CACHE`: an empty log, so ptxas'
        # registers and spills of the kernel unknown. A kernel whose spills are unknown
        # must not be reported (or cached) as spilling nothing.
        print(f"hostir.jit: NVRTC returned no ptxas report for {silent} ({arch}, attempt "
              f"{attempt} of {PTXAS_ATTEMPTS}; log {ck.log[:200]!r})", file=sys.stderr)
    else:
        raise CompilationError(
            f"NVRTC compiled {silent} for {arch} but gave no ptxas report (registers, spills) "
            f"in {PTXAS_ATTEMPTS} attempts")
    regs, spills, stack = ck.registers, ck.spill_bytes, ck.local_bytes
    dump("ptxas", "\n".join(
        f"ptxas {arch} {sym}: {regs.get(sym, '?')} registers, {spills.get(sym, 0)} B spills, "
        f"{stack.get(sym, 0)} B stack" for sym in ck.lowered.values()))
    return ck


# NVRTC compiles of one kernel before an empty ptxas report is an error (see `compile`).
PTXAS_ATTEMPTS = 2
# NVRTC 12.9 and later keep a cache of their own; a compile it serves runs no ptxas, so
# the log has no report (registers, spills) of the kernel: on the H200 machines 3 of 956
# kernels of a test run came back so, and the bench could not say their spills. nvFuser
# met the same (NVIDIA/Fuser#4694) and passes --no-cache where it wants the report; so
# do we, always: our own cache (`KernelCache`) already keeps every cubin with its report.
NVRTC_NO_CACHE = (12, 9)


def _compile_once(source: str, names: Sequence[str], arch: str,
                  options: Sequence[str]) -> CompiledKernel:
    from cupy.cuda import nvrtc

    opts = [f"-arch={arch}", *BASE_OPTIONS, *options]
    if nvrtc_version() >= NVRTC_NO_CACHE:
        opts.append("--no-cache")
    prog = nvrtc.createProgram(source, f"{names[0] if names else 'kernel'}.cu", [], [])
    try:
        templated = [n for n in names if "<" in n or "::" in n]
        for n in templated:
            nvrtc.addNameExpression(prog, n)
        try:
            nvrtc.compileProgram(prog, opts)
        except nvrtc.NVRTCError as e:
            log = nvrtc.getProgramLog(prog)
            raise CompilationError(
                f"NVRTC failed on kernel(s) {list(names)} for {arch} with options {opts}: "
                f"{e}\n{log}") from None
        log = nvrtc.getProgramLog(prog)
        cubin = nvrtc.getCUBIN(prog)
        lowered = {n: (nvrtc.getLoweredName(prog, n) if n in templated else n) for n in names}
    finally:
        nvrtc.destroyProgram(prog)
    regs, spills, stack = parse_ptxas(log)
    return CompiledKernel(cubin=whole_elf(bytes(cubin)), names=tuple(names), lowered=lowered,
                          registers=regs, spill_bytes=spills, local_bytes=stack, log=log,
                          arch=arch)


def whole_elf(cubin: bytes) -> bytes:
    """``cubin`` padded with zero bytes to the length its ELF headers declare.

    CuPy's ``nvrtc.getCUBIN`` drops the last byte of the cubin: it strips a trailing NUL
    as from the PTX and the log, but a cubin has none (cupy/cuda/nvrtc.pyx; seen with
    CuPy 13 and NVRTC 13.5: 3439 of 3440 bytes). The byte lost is the last of the ELF's
    program header table, the high byte of the last segment's alignment, which is 0; the
    driver loads the short image, nvdisasm and cuobjdump refuse it. So it is put back,
    and a unit test compares the result with NVRTC's own bytes."""
    if len(cubin) < 64 or cubin[:4] != b"\x7fELF" or cubin[4] != 2:  # ELF64 only
        return cubin
    phoff, shoff = struct.unpack_from("<QQ", cubin, 0x20)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", cubin, 0x36)
    end = max(phoff + phentsize * phnum, shoff + shentsize * shnum)
    if len(cubin) < end <= len(cubin) + 8:
        return cubin + b"\0" * (end - len(cubin))
    return cubin


# ---------------------------------------------------------------------------------------
# The cache.

def cache_key(source: str, names: Sequence[str], arch: str, options: Sequence[str] = ()) -> str:
    """sha256 over everything that changes the cubin: source, names, options, arch, NVRTC."""
    h = hashlib.sha256()
    for part in (source, "\0".join(names), "\0".join((*BASE_OPTIONS, *options)), arch,
                 ".".join(map(str, nvrtc_version()))):
        h.update(part.encode())
        h.update(b"\x1f")
    return h.hexdigest()


def _encode(ck: CompiledKernel, key: str = "") -> bytes:
    meta = dataclasses.asdict(ck)
    meta.pop("cubin")
    meta["key"] = key
    header = json.dumps(meta, sort_keys=True).encode()
    payload = len(header).to_bytes(8, "little") + header + ck.cubin
    return _ENTRY_MAGIC + hashlib.sha256(payload).digest() + payload


def _check_meta(meta, key: str | None, names: Sequence[str] | None,
                arch: str | None) -> CompiledKernel:
    """The header's fields, each type- and range-checked, and compared with what the
    entry was looked up for (key, names, arch). Raises `store.Invalid`."""
    need, need_int, need_str = store.need, store.need_int, store.need_str
    fields = {f.name for f in dataclasses.fields(CompiledKernel)} - {"cubin"} | {"key"}
    need(type(meta) is dict and set(meta) == fields, "header fields are not an entry's")
    got_names = meta["names"]
    need(type(got_names) is list and 1 <= len(got_names) <= MAX_KERNELS_AN_ENTRY,
         f"names must be a list of 1 to {MAX_KERNELS_AN_ENTRY} names")
    for n in got_names:
        need_str(n, "a kernel name", max_len=4096)
    lowered = store.need_dict(meta["lowered"], "lowered")
    need(set(lowered) == set(got_names), "lowered names are not the entry's names")
    for v in lowered.values():
        need_str(v, "a lowered name", max_len=4096)
    for what, hi in (("registers", MAX_REGISTERS), ("spill_bytes", MAX_FRAME_BYTES),
                     ("local_bytes", MAX_FRAME_BYTES)):
        for sym, v in store.need_dict(meta[what], what).items():
            need_str(sym, f"a symbol of {what}", max_len=4096)
            need_int(v, f"{what}[{sym[:60]}]", 0, hi)
    need_str(meta["log"], "log", max_len=MAX_HEADER_BYTES)
    need(type(meta["arch"]) is str and _ARCH.fullmatch(meta["arch"]) is not None,
         f"arch {str(meta['arch'])[:40]!r} is not sm_XY")
    need(type(meta["key"]) is str and _KEY.fullmatch(meta["key"]) is not None,
         "key is not a sha256")
    need(key is None or meta["key"] == key, "entry written for another key")
    need(names is None or tuple(got_names) == tuple(names), "entry for other kernel names")
    need(arch is None or meta["arch"] == arch, f"entry for {meta['arch']}, not {arch}")
    fields = {k: v for k, v in meta.items() if k != "key"}
    return CompiledKernel(cubin=b"", **{**fields, "names": tuple(got_names)})


def _decode(blob: bytes, key: str | None = None, names: Sequence[str] | None = None,
            arch: str | None = None) -> CompiledKernel | None:
    """The entry, or None when it is truncated, corrupt, of another format, out of shape
    or range in any field, or written for another key, names or arch than asked for."""
    n = len(_ENTRY_MAGIC)
    if len(blob) < n + 32 + 8 or blob[:n] != _ENTRY_MAGIC:
        return None
    digest, payload = blob[n:n + 32], blob[n + 32:]
    if hashlib.sha256(payload).digest() != digest:
        return None
    hlen = int.from_bytes(payload[:8], "little")
    if hlen > min(MAX_HEADER_BYTES, len(payload) - 8):
        return None
    cubin = payload[8 + hlen:]
    if cubin[:4] != b"\x7fELF":
        return None
    try:
        ck = _check_meta(json.loads(payload[8:8 + hlen]), key, names, arch)
    except store.SCHEMA_ERRORS:
        return None
    # an entry without ptxas' report of a kernel: its spills are unknown, so it is
    # rebuilt like a corrupt one
    if any(ck.lowered[n] not in ck.registers for n in ck.names):
        return None
    return dataclasses.replace(ck, cubin=whole_elf(cubin))


class CacheWriteError(CompilationError):
    """A kernel that compiled but whose entry could not be stored on disk (`KernelCache.fill`,
    `precompile`): the cache cannot be filled, whatever the kernel."""


@dataclasses.dataclass
class CacheStats:
    memory_hits: int = 0
    disk_hits: int = 0
    compiles: int = 0
    rebuilt_corrupt: int = 0   # entries read but not valid (decode, schema, key): rebuilt
    refused: int = 0           # paths not read: symlink, directory, FIFO, oversized, foreign
    bypassed: int = 0          # lookups that skipped the disk: directory not private


class KernelCache:
    """Two levels: a dict in memory, then one file per key on disk.

    HOSTIR_DISABLE=kernel_cache skips the disk (the memory level still dedups a process);
    so does a cache directory that is not private (`runtime.store.trusted_dir`).
    """

    STORE = "kernel cache"

    def __init__(self, directory: Path | None = None):
        self._directory = directory
        self._memory: dict[str, CompiledKernel] = {}
        self._lock = threading.Lock()
        self.stats = CacheStats()

    @property
    def directory(self) -> Path:
        return self._directory if self._directory is not None else options().cache_dir / "kernels"

    def path(self, key: str) -> Path:
        return self.directory / f"{key}.cubin"

    def _use_disk(self) -> bool:
        """Whether `get` reads and writes the disk level: one warning where it cannot
        (`disk_problem`), none where HOSTIR_DISABLE turned it off."""
        problem = self.disk_problem(probe=False)
        if problem is None:
            return True
        if not options().disable("kernel_cache"):
            store.warn_once(self.STORE, f"{problem}; not using the cache")
            self.stats.bypassed += 1
        return False

    def disk_problem(self, probe: bool = True) -> str | None:
        """Why entries cannot be stored on disk here, or None: the disk level is off, the
        directory cannot be created or is not private (`runtime.store.dir_refusal`), or
        (``probe``) no file can be created in it. Warns about nothing: for callers that
        must fill the cache (`precompile`, ``hostir.run warmup``) and say why not."""
        if options().disable("kernel_cache"):
            return "HOSTIR_DISABLE=kernel_cache turns it off"
        root = self._directory if self._directory is not None else options().cache_dir
        problem = store.dir_refusal(self.directory, root)
        if problem is None and probe:
            try:
                with tempfile.TemporaryFile(dir=self.directory):
                    pass
            except OSError as e:
                problem = f"cannot write in {self.directory} ({e.strerror or e})"
        return problem

    def get(self, source: str, names: Sequence[str], arch: str = DEFAULT_ARCH,
            options_: Sequence[str] = ()) -> CompiledKernel:
        """The compiled kernel, from memory, disk, or NVRTC (then stored on disk)."""
        key = cache_key(source, names, arch, options_)
        with self._lock:
            hit = self._memory.get(key)
        if hit is not None:
            self.stats.memory_hits += 1
            return hit
        use_disk = self._use_disk()
        ck = self._read(key, names, arch) if use_disk else None
        if ck is not None:
            self.stats.disk_hits += 1
            dump("cuda_kernel", f"// ---- hostir kernel {', '.join(names)}: disk cache {key}")
        else:
            ck = compile(source, names, arch, options_)
            self.stats.compiles += 1
            if use_disk:
                self._write(key, ck)
        with self._lock:
            self._memory[key] = ck
        return ck

    def _read(self, key: str, names: Sequence[str] | None = None,
              arch: str | None = None, warn: bool = True) -> CompiledKernel | None:
        p = self.path(key)
        try:
            blob = store.read_regular(p, store.MAX_ENTRY_BYTES)
        except store.Refused as e:
            self.stats.refused += 1
            if warn:
                store.warn_once(self.STORE, f"{e}; compiling instead")
            return None
        if blob is None:
            return None
        ck = _decode(blob, key, names, arch)
        if ck is None:
            self.stats.rebuilt_corrupt += 1
            if warn:
                store.warn_once(self.STORE, f"{p}: not a valid entry for its key; rebuilt")
        return ck

    def on_disk(self, source: str, names: Sequence[str], arch: str = DEFAULT_ARCH,
                options_: Sequence[str] = ()) -> bool:
        """Whether a valid entry for this kernel is on disk: read as `get` reads it (a
        symlink, FIFO, directory or corrupt file at its path is not one), without a warning."""
        return self._read(cache_key(source, names, arch, options_), names, arch,
                          warn=False) is not None

    def fill(self, source: str, names: Sequence[str], arch: str = DEFAULT_ARCH,
             options_: Sequence[str] = ()) -> None:
        """Make sure a valid entry for this kernel is on disk: one there is kept, anything
        else at its path is replaced (the rename replaces a link or FIFO itself; an empty
        directory is removed first). Raises CompilationError when the kernel does not
        compile, `CacheWriteError` when the disk cache is off or the entry not written."""
        problem = self.disk_problem(probe=False)
        if problem is not None:
            raise CacheWriteError(f"the kernel cache is off: {problem}")
        key = cache_key(source, names, arch, options_)
        if self._read(key, names, arch, warn=False) is not None:
            return
        ck = compile(source, names, arch, options_)
        self.stats.compiles += 1
        path = self.path(key)
        try:
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                os.rmdir(path)  # never follows a link; a directory with files stays (ENOTEMPTY)
            write_atomically(path, _encode(ck, key))
        except OSError as e:
            raise CacheWriteError(f"{path} not written ({e.strerror or e})") from None

    def _write(self, key: str, ck: CompiledKernel) -> None:
        try:
            write_atomically(self.path(key), _encode(ck, key))
        except OSError as e:  # e.g. a directory at the entry's path: the kernel still runs
            store.warn_once(self.STORE, f"{self.path(key)} not written ({e})")


_CACHE: KernelCache | None = None


def kernel_cache() -> KernelCache:
    """The process's kernel cache (directory from HOSTIR_CACHE_DIR at the time of use)."""
    global _CACHE
    if _CACHE is None:
        _CACHE = KernelCache()
    return _CACHE


# ---------------------------------------------------------------------------------------
# Loading and launching (GPU).

def device_arch(device_index: int | None = None) -> str:
    """"sm_XY" of a CUDA device (the current one by default)."""
    import torch
    major, minor = torch.cuda.get_device_capability(device_index)
    return f"sm_{major}{minor}"


class Kernel:
    """One loaded kernel function; launches on the current torch stream."""

    def __init__(self, function, name: str):
        self.function = function
        self.name = name
        self._smem_set = 0
        # CTAs of its compiled-in thread-block cluster (__cluster_dims__), where the
        # loader knows it: printed by the launch_params dump
        self.cluster = 1

    def ensure_smem(self, nbytes: int) -> None:
        # Without the attribute a kernel may use 48 KiB of shared memory, static and
        # dynamic together: 48 KiB of dynamic memory beside any static array fails to
        # launch (CUDA_ERROR_INVALID_VALUE; a layer norm at 12288 with two rows of x staged,
        # 48 KiB, did). So the attribute is set for any dynamic size not set before.
        if nbytes > self._smem_set:
            from cupy.cuda import driver
            driver.funcSetAttribute(self.function.ptr,
                                    driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                    nbytes)
            self._smem_set = nbytes

    def attribute(self, name: str) -> int:
        """A CUfunction attribute, e.g. "NUM_REGS", "LOCAL_SIZE_BYTES"."""
        from cupy.cuda import driver
        return driver.funcGetAttribute(getattr(driver, f"CU_FUNC_ATTRIBUTE_{name}"),
                                       self.function.ptr)

    def launch(self, grid: tuple[int, int, int], block: tuple[int, int, int],
               args: tuple, smem_bytes: int = 0, stream=None, dependent: bool = False) -> None:
        """Launch on `stream` (a torch.cuda.Stream; the current one by default).

        `args`: numpy scalars of the kernel's parameter types (numpy.uint64 for pointers,
        numpy.int32 for ints), so that every argument has the width the kernel expects.
        """
        import torch

        if stream is None:
            stream = torch.cuda.current_stream()
        self.launch_raw(grid, block, args, smem_bytes, stream.cuda_stream, dependent)

    def launch_raw(self, grid: tuple[int, int, int], block: tuple[int, int, int],
                   args: tuple, smem_bytes: int, stream_handle: int,
                   dependent: bool = False, by_driver: bool = False) -> None:
        """`launch` on a stream given by its raw handle (`current_stream_handle`): the
        per-call path of the generated matmul, which keeps the host's share small.
        ``dependent``: a programmatic dependent launch (`launch_ex`), for kernels that
        execute ``griddepcontrol.wait`` before they touch global memory. ``by_driver``:
        through `launch_ex` too (arguments CuPy does not pass: TMA descriptors)."""
        if smem_bytes > self._smem_set:
            self.ensure_smem(smem_bytes)
        if options().dump("launch_params"):
            cluster = f" cluster={self.cluster}" if self.cluster > 1 else ""
            dump("launch_params", f"launch {self.name} grid={grid} block={block}{cluster} "
                                  f"smem={smem_bytes} stream={stream_handle:#x}"
                                  + (" dependent" if dependent else ""))
        if dependent or by_driver:
            launch_ex(self.function.ptr, grid, block, args, smem_bytes, stream_handle,
                      programmatic=dependent)
        else:
            self.function(grid, block, args, shared_mem=smem_bytes,
                          stream=_external_stream(stream_handle))


# --------------------------------------------------------------------------- cuLaunchKernelEx
#
# CuPy launches through cuLaunchKernel, which takes no launch attributes. A programmatic
# dependent launch (PDL, sm_90+) needs CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
# so `launch_ex` calls the driver's cuLaunchKernelEx through ctypes (the driver library
# CuPy itself loaded). With the attribute, the launch may begin once every block of the
# kernel before it on the stream has executed ``griddepcontrol.launch_dependents`` (or
# exited): its blocks take SMs as the earlier kernel's blocks leave them and wait in
# ``griddepcontrol.wait`` until that kernel has completed and its writes are visible. The
# launch latency between the two then overlaps the earlier kernel's last rows. Stream
# capture records it as a programmatic edge of the graph.

CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6  # cuda.h, CUlaunchAttributeID


class _LaunchAttribute(ctypes.Structure):
    # CUlaunchAttribute: the id, padding to 8 bytes, a 64-byte union of values
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int * 16)]


class _LaunchConfig(ctypes.Structure):
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint),
                ("gridDimZ", ctypes.c_uint), ("blockDimX", ctypes.c_uint),
                ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_LaunchAttribute)), ("numAttrs", ctypes.c_uint)]


_CTYPES = {"uint64": ctypes.c_uint64, "int64": ctypes.c_int64, "int32": ctypes.c_int32,
           "uint32": ctypes.c_uint32, "float32": ctypes.c_float, "float64": ctypes.c_double}
_ARG_LAYOUTS: dict[tuple[type, ...], tuple] = {}
_DRIVER: list = []


def _arg_layout(args: tuple):
    """(struct type, field offsets, void* array type) for arguments of these dtypes: the
    arguments go into one ctypes struct a launch and the kernel's parameter array points
    into it (a few microseconds a launch; a ctypes object an argument took ~35)."""
    key = tuple(map(type, args))
    layout = _ARG_LAYOUTS.get(key)
    if layout is None:
        try:  # a ctypes array (a TMA descriptor, runtime.tma) goes by value, as it is
            fields = [(f"a{i}", type(a) if isinstance(a, ctypes.Array) else _CTYPES[str(a.dtype)])
                      for i, a in enumerate(args)]
        except (KeyError, AttributeError):
            raise TypeError(f"launch_ex: arguments {[type(a).__name__ for a in args]}: pass "
                            f"numpy scalars of {sorted(_CTYPES)} or ctypes arrays") from None
        struct = type("KernelArgs", (ctypes.Structure,), {"_fields_": fields})
        offsets = tuple(getattr(struct, name).offset for name, _ in fields)
        layout = _ARG_LAYOUTS[key] = (struct, offsets, ctypes.c_void_p * max(1, len(key)))
    return layout


def _driver():
    """(cuLaunchKernelEx, the programmatic-serialization attribute), loaded once."""
    if not _DRIVER:
        fn = ctypes.CDLL("libcuda.so.1").cuLaunchKernelEx
        fn.argtypes = [ctypes.POINTER(_LaunchConfig), ctypes.c_void_p,
                       ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
        fn.restype = ctypes.c_int
        attr = _LaunchAttribute()
        attr.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attr.value[0] = 1  # programmaticStreamSerializationAllowed
        _DRIVER.extend([fn, attr])
    return _DRIVER[0], _DRIVER[1]


def launch_ex_available() -> None:
    """Load cuLaunchKernelEx now; OSError or AttributeError where the driver has none
    (before CUDA 11.8): callers then launch plainly."""
    _driver()


def launch_ex(function_ptr: int, grid: tuple[int, int, int], block: tuple[int, int, int],
              args: tuple, smem_bytes: int, stream_handle: int, programmatic: bool) -> None:
    """cuLaunchKernelEx of a loaded CUfunction (``Kernel.function.ptr``) with numpy
    scalar ``args`` (their dtypes give the widths) or ctypes arrays (by value),
    optionally as a programmatic dependent launch. A driver error raises RuntimeError."""
    launch, attr = _driver()
    struct, offsets, array = _arg_layout(args)
    values = struct(*args)
    base = ctypes.addressof(values)
    params = array(*[base + o for o in offsets])
    config = _LaunchConfig(*grid, *block, smem_bytes, stream_handle,
                           ctypes.pointer(attr) if programmatic else None, int(programmatic))
    err = launch(ctypes.byref(config), function_ptr, params, None)
    if err:
        raise RuntimeError(f"cuLaunchKernelEx failed: CUresult {err}")


def on_device(device_index: int):
    """A context making ``device_index`` current for a launch (a loaded module belongs to
    its device's context); a no-op when it already is, the common case."""
    import torch

    if device_index == torch.cuda.current_device():
        return contextlib.nullcontext()
    return torch.cuda.device(device_index)


def current_stream_handle(device_index: int) -> int:
    """The raw handle (cudaStream_t) of torch's current stream on a device, without
    building a torch.cuda.Stream (torch's own raw accessor where this torch has it)."""
    import torch

    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw(device_index)
    return torch.cuda.current_stream(device_index).cuda_stream


_STREAMS: dict[int, object] = {}


class _RawStream:
    """A raw cudaStream_t offered through the CUDA stream protocol (``__cuda_stream__``:
    version 0 and the handle), which CuPy 14's `Stream.from_external` takes."""

    __slots__ = ("handle",)

    def __init__(self, handle: int):
        self.handle = handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle)


def _external_stream(ptr: int):
    """A CuPy stream object over the raw handle ``ptr`` (cached: one per handle).
    CuPy 14 deprecates `cupy.cuda.ExternalStream` for `Stream.from_external`; CuPy 13,
    which has no `from_external`, keeps the old class."""
    import cupy
    s = _STREAMS.get(ptr)
    if s is None:
        from_external = getattr(cupy.cuda.Stream, "from_external", None)
        s = _STREAMS[ptr] = (from_external(_RawStream(ptr)) if from_external is not None
                             else cupy.cuda.ExternalStream(ptr))
    return s


_MODULES: dict[tuple[str, int], object] = {}


def load(ck: CompiledKernel, device_index: int | None = None) -> dict[str, Kernel]:
    """Load a cubin on a device (once per process and device); name -> Kernel.

    cuModuleLoadData through `cupy.cuda.function.Module.load`: the cubin goes straight
    from memory to the driver (RawModule would want a source string or a file path).
    """
    import cupy
    from cupy.cuda import function
    import torch

    dev = torch.cuda.current_device() if device_index is None else device_index
    key = (hashlib.sha256(ck.cubin).hexdigest(), dev)
    entry = _MODULES.get(key)
    if entry is None:
        with cupy.cuda.Device(dev):
            mod = function.Module()
            mod.load(ck.cubin)
            entry = _MODULES[key] = {n: Kernel(mod.get_function(ck.lowered[n]), n)
                                     for n in ck.names}
            entry["__module__"] = mod  # keeps the module alive as long as its functions
    return {n: entry[n] for n in ck.names}


# ---------------------------------------------------------------------------------------
# Compiling ahead of time, in parallel.

def _precompile_one(unit, directory: Path, stop: threading.Event) -> str | None:
    """Worker of `precompile`, on a thread of its own: compiles one unit (source, kernel
    names, arch) into the disk cache ``directory``, unless ``stop`` is set. Returns an
    error text, or None; raises `CacheWriteError` (and sets ``stop``) when the entry could
    not be written (no unit would be)."""
    source, names, arch = unit
    if stop.is_set():
        return "not compiled: an earlier entry could not be written"
    try:
        KernelCache(directory).fill(source, names, arch)
    except CacheWriteError:
        stop.set()
        raise
    except Exception as e:  # noqa: BLE001 -- reported; the kernel compiles on first use
        return f"{type(e).__name__}: {e}"
    return None


def precompile(units: Sequence[tuple[str, Sequence[str], str]], workers: int | None = None,
               progress=None) -> list[str | None]:
    """Compile ``units`` (source, kernel names, arch) into the disk kernel cache on
    ``workers`` threads (default: one a core, at most 32); units with a valid entry on
    disk are skipped (an entry that does not verify is replaced). ``progress(done,
    total)`` is called as units finish. Returns one error text (or None) a unit. Raises
    CompilationError when there is no disk cache to fill, `CacheWriteError` when an entry
    could not be written (the units not yet started are then dropped).

    A model's kernels compile one after another in its first step otherwise (about
    0.1-0.6 s each through NVRTC); here they take the machine's cores at once. Threads,
    not processes: NVRTC may be called from several threads at once on distinct
    programs (the NVRTC guide's "Thread Safety"; NVRTC_DISABLE_CONCURRENT_NVVM would
    serialize its optimizer), and CuPy's binding lets go of the GIL while it compiles. On 2
    cores 12 normalization kernels took 0.66 s on two threads against 1.19 s on one,
    byte-identical; a pool of two spawned processes took 2.8 s, most of it importing
    torch in each worker. On an H200 machine's 16 cores ``hostir.run warmup
    train_transformer --hidden 4096`` compiled its 28 kernels in 0.6-0.7 s on threads,
    1.5-1.6 s on processes. The processes also ran the caller's ``__main__`` again in
    every worker, so a user's script without a main guard was run once a worker.
    """
    import concurrent.futures

    cache = kernel_cache()
    errors: list[str | None] = [None] * len(units)
    problem = cache.disk_problem()
    if problem is not None:
        raise CompilationError(f"the kernel cache is off: {problem}; nothing to fill")
    # an entry is there when it reads back valid, as `get` would read it
    missing = [k for k, (src, names, arch) in enumerate(units)
               if not cache.on_disk(src, names, arch)]
    done = len(units) - len(missing)
    if progress:
        progress(done, len(units))
    if not missing:
        return errors
    workers = max(1, min(workers or (os.cpu_count() or 2), len(missing), 32))
    with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="hostir-nvrtc") as ex:
        stop = threading.Event()
        futures = {ex.submit(_precompile_one, units[k], cache.directory, stop): k
                   for k in missing}
        try:
            for future in concurrent.futures.as_completed(futures):
                errors[futures[future]] = future.result()
                done += 1
                if progress:
                    progress(done, len(units))
        except BaseException:
            # a write that failed (the others would not be written either), or Ctrl-C:
            # the units not started return at once; the running ones finish (~1 s at most)
            stop.set()
            raise
    return errors


def cluster_cap(active: int, blocks: int, cluster: int) -> int:
    """Clusters of ``cluster`` CTAs a persistent grid takes: ``active``, what the driver
    said (`active_clusters`), else, where it could not say (0), about 3 in 4 of the even
    split of the ``blocks`` the device holds at once (a GPC's SMs hold whole clusters
    only), at least one."""
    return active if active > 0 else max(1, blocks // cluster * 3 // 4)


def active_clusters(kernel, cluster: int, threads: int, smem: int) -> int:
    """cuOccupancyMaxActiveClusters of a kernel with compiled-in cluster dims; 0 where
    the driver cannot say."""
    import ctypes

    try:
        fn = ctypes.CDLL("libcuda.so.1").cuOccupancyMaxActiveClusters
        fn.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_void_p,
                       ctypes.POINTER(_LaunchConfig)]
        fn.restype = ctypes.c_int
        config = _LaunchConfig(cluster, 1, 1, threads, 1, 1, smem, None, None, 0)
        n = ctypes.c_int(0)
        if fn(ctypes.byref(n), kernel.function.ptr, ctypes.byref(config)):
            return 0
        return n.value
    except (OSError, AttributeError):
        return 0
