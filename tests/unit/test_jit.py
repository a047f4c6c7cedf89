"""NVRTC compile and the kernel cache, without a GPU."""

import multiprocessing as mp

import pytest

cupy = pytest.importorskip("cupy")

from hostir.errors import CompilationError  # noqa: E402
from runtime import jit  # noqa: E402

SRC = 'extern "C" __global__ void scale(float* x, float a) { x[threadIdx.x] *= a; }\n'


def test_compile_reports_registers_and_names():
    ck = jit.compile(SRC, ["scale"], "sm_90")
    assert ck.lowered == {"scale": "scale"}
    assert ck.registers["scale"] > 0
    assert ck.spill_bytes.get("scale", 0) == 0
    assert ck.cubin[:4] == b"\x7fELF"


def test_compile_error_carries_the_log():
    with pytest.raises(CompilationError, match="undefined_thing"):
        jit.compile('extern "C" __global__ void k() { undefined_thing(); }', ["k"])


def test_template_names_are_lowered():
    src = "template <int N> __global__ void fill(float* x) { x[threadIdx.x] = N; }\n"
    ck = jit.compile(src, ["fill<3>"], "sm_80")
    assert ck.lowered["fill<3>"].startswith("_Z")


def test_parse_ptxas():
    log = ("ptxas info    : Compiling entry function 'k' for 'sm_90'\n"
           "ptxas info    : Function properties for k\n"
           "    16 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads\n"
           "ptxas info    : Used 42 registers, used 0 barriers\n")
    regs, spills, stack = jit.parse_ptxas(log)
    assert regs == {"k": 42} and spills == {"k": 20} and stack == {"k": 16}


def test_parse_ptxas_keeps_a_called_functions_frame_apart():
    """A non-inlined device function's frame follows its caller's: it is not the entry's
    (it once hid an entry's 32-byte stack frame behind the callee's 0)."""
    log = ("ptxas info    : Compiling entry function 'k' for 'sm_90'\n"
           "ptxas info    : Function properties for k\n"
           "ptxas         .     32 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
           "ptxas info    : Used 54 registers, used 1 barriers, 56 bytes smem\n"
           "ptxas info    : Function properties for _Z14partial_output5uint4\n"
           "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n")
    regs, spills, stack = jit.parse_ptxas(log)
    callee = "_Z14partial_output5uint4"
    assert regs == {"k": 54} and stack == {"k": 32, callee: 0} and spills == {"k": 0, callee: 0}


def test_cache_key_changes_with_source_options_arch():
    base = jit.cache_key(SRC, ["scale"], "sm_90")
    assert base == jit.cache_key(SRC, ["scale"], "sm_90")
    assert base != jit.cache_key(SRC + " ", ["scale"], "sm_90")
    assert base != jit.cache_key(SRC, ["scale"], "sm_80")
    assert base != jit.cache_key(SRC, ["scale"], "sm_90", ("-lineinfo",))


def test_disk_cache_hit_and_corrupt_entry_rebuilt(tmp_path):
    c1 = jit.KernelCache(tmp_path)
    ck = c1.get(SRC, ["scale"], "sm_90")
    assert c1.stats.compiles == 1
    c2 = jit.KernelCache(tmp_path)  # a "fresh process"
    assert c2.get(SRC, ["scale"], "sm_90").cubin == ck.cubin
    assert c2.stats.compiles == 0 and c2.stats.disk_hits == 1
    (entry,) = tmp_path.glob("*.cubin")
    entry.write_bytes(entry.read_bytes()[:-7])  # truncated
    c3 = jit.KernelCache(tmp_path)
    assert c3.get(SRC, ["scale"], "sm_90").cubin == ck.cubin
    assert c3.stats.rebuilt_corrupt == 1 and c3.stats.compiles == 1
    flipped = bytearray(entry.read_bytes())
    flipped[100] ^= 0xFF
    entry.write_bytes(bytes(flipped))
    c4 = jit.KernelCache(tmp_path)
    c4.get(SRC, ["scale"], "sm_90")
    assert c4.stats.rebuilt_corrupt == 1
    assert jit._decode(entry.read_bytes()) is not None


def _compile_in_child(directory):
    cache = jit.KernelCache(directory)
    return len(cache.get(SRC, ["scale"], "sm_90").cubin)


def test_concurrent_processes_compile_safely(tmp_path):
    ctx = mp.get_context("spawn")
    with ctx.Pool(4) as pool:
        sizes = pool.map(_compile_in_child, [tmp_path] * 8)
    assert len(set(sizes)) == 1
    entries = list(tmp_path.iterdir())
    assert len(entries) == 1, entries  # one entry, no temp files left behind
    assert jit._decode(entries[0].read_bytes()) is not None


def test_cache_dir_follows_options(tmp_path, monkeypatch):
    from hostir import options as opts
    monkeypatch.setenv("HOSTIR_CACHE_DIR", str(tmp_path))
    opts.set_options(None)
    try:
        assert jit.KernelCache().directory == tmp_path / "kernels"
    finally:
        opts.set_options(None)


def _compile_after_barrier(directory, barrier, results):
    barrier.wait()  # all eight start compiling the same kernel at the same moment
    cache = jit.KernelCache(directory)
    ck = cache.get(SRC, ["scale"], "sm_90")
    results.put((len(ck.cubin), cache.stats.compiles + cache.stats.disk_hits))


def test_eight_processes_at_once_all_succeed_and_leave_one_entry(tmp_path):
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(8), ctx.Queue()
    procs = [ctx.Process(target=_compile_after_barrier, args=(tmp_path, barrier, results))
             for _ in range(8)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
    assert [p.exitcode for p in procs] == [0] * 8
    got = [results.get(timeout=5) for _ in procs]
    assert len({size for size, _ in got}) == 1 and all(n == 1 for _, n in got)
    entries = list(tmp_path.iterdir())
    assert len(entries) == 1, entries  # one valid entry, no temp files
    assert jit._decode(entries[0].read_bytes()) is not None


# --------------------------------------------------------------------------- launch_ex


def test_launch_ex_structs_have_cuda_h_layout():
    # cuda.h (64-bit): CUlaunchAttribute = id, pad to 8, a 64-byte union; CUlaunchConfig =
    # seven unsigned ints, then hStream at 32, attrs, numAttrs: 56 bytes
    import ctypes

    assert ctypes.sizeof(jit._LaunchAttribute) == 72
    assert jit._LaunchAttribute.value.offset == 8
    assert ctypes.sizeof(jit._LaunchConfig) == 56
    assert jit._LaunchConfig.hStream.offset == 32
    assert jit._LaunchConfig.attrs.offset == 40
    assert jit._LaunchConfig.numAttrs.offset == 48


def test_launch_ex_marshals_arguments_and_the_attribute(monkeypatch):
    import ctypes

    import numpy as np

    seen = {}

    def fake_launch(config_ref, function, params, extra):
        config = ctypes.cast(config_ref, ctypes.POINTER(jit._LaunchConfig)).contents
        seen["config"] = (config.gridDimX, config.gridDimY, config.gridDimZ, config.blockDimX,
                          config.blockDimY, config.blockDimZ, config.sharedMemBytes,
                          config.hStream, config.numAttrs)
        if config.numAttrs:
            attr = config.attrs[0]
            seen["attr"] = (attr.id, attr.value[0])
        seen["function"] = function
        seen["args"] = (ctypes.c_uint64.from_address(params[0]).value,
                        ctypes.c_int32.from_address(params[1]).value,
                        ctypes.c_uint64.from_address(params[2]).value,
                        ctypes.c_float.from_address(params[3]).value)
        return seen.get("result", 0)

    attr = jit._LaunchAttribute()
    attr.id = jit.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    attr.value[0] = 1
    monkeypatch.setattr(jit, "_DRIVER", [fake_launch, attr])
    args = (np.uint64(0xDEAD0000BEEF), np.int32(-7), np.uint64(2**63 + 5), np.float32(0.5))
    jit.launch_ex(0x1234, (528, 2, 1), (128, 1, 1), args, 49152, 0xABC, programmatic=True)
    assert seen["config"] == (528, 2, 1, 128, 1, 1, 49152, 0xABC, 1)
    assert seen["attr"] == (6, 1)
    assert seen["function"] == 0x1234
    assert seen["args"] == (0xDEAD0000BEEF, -7, 2**63 + 5, 0.5)

    seen.clear()
    jit.launch_ex(0x1234, (1, 1, 1), (32, 1, 1), args, 0, 0xABC, programmatic=False)
    assert seen["config"][-1] == 0 and "attr" not in seen

    seen["result"] = 1  # CUDA_ERROR_INVALID_VALUE
    with pytest.raises(RuntimeError, match="CUresult 1"):
        jit.launch_ex(0x1234, (1, 1, 1), (32, 1, 1), args, 0, 0xABC, programmatic=True)
    with pytest.raises(TypeError, match="numpy scalars"):
        jit.launch_ex(0x1234, (1, 1, 1), (32, 1, 1), (5,), 0, 0xABC, programmatic=True)


SRC_K = 'extern "C" __global__ void k(float* x) { x[0] = 1.f; }'


def test_nvrtc_runs_uncached_so_ptxas_always_reports(monkeypatch):
    # NVRTC >= 12.9 serves repeated compiles from a cache of its own without running
    # ptxas: no registers or spills in the log. compile() asks it not to.
    from cupy.cuda import nvrtc

    seen = []
    real = nvrtc.compileProgram
    monkeypatch.setattr(nvrtc, "compileProgram", lambda prog, opts: (seen.append(list(opts)),
                                                                     real(prog, opts))[1])
    for _ in range(2):  # the second compile of the same source still reports
        ck = jit.compile(SRC_K, ["k"])
        assert ck.registers["k"] > 0 and "Used" in ck.log
    assert all(("--no-cache" in o) == (jit.nvrtc_version() >= jit.NVRTC_NO_CACHE) for o in seen)


def test_a_compile_without_ptxas_report_is_retried_then_refused(monkeypatch):
    real = jit._compile_once
    calls = []

    def silent_first(*a):
        ck = real(*a)
        calls.append(1)
        if len(calls) == 1:
            return jit.CompiledKernel(ck.cubin, ck.names, ck.lowered, {}, {}, {}, "", ck.arch)
        return ck

    monkeypatch.setattr(jit, "_compile_once", silent_first)
    assert jit.compile(SRC_K, ["k"]).registers["k"] > 0 and len(calls) == 2

    def always_silent(*a):
        ck = real(*a)
        return jit.CompiledKernel(ck.cubin, ck.names, ck.lowered, {}, {}, {}, "", ck.arch)

    monkeypatch.setattr(jit, "_compile_once", always_silent)
    with pytest.raises(CompilationError, match="no ptxas report"):
        jit.compile(SRC_K, ["k"])


def test_a_cached_entry_without_ptxas_report_is_rebuilt(tmp_path):
    cache = jit.KernelCache(tmp_path)
    ck = jit.compile(SRC_K, ["k"])
    key = jit.cache_key(SRC_K, ["k"], ck.arch)
    silent = jit.CompiledKernel(ck.cubin, ck.names, ck.lowered, {}, {}, {}, "", ck.arch)
    jit.write_atomically(cache.path(key), jit._encode(silent, key))
    got = cache.get(SRC_K, ["k"], ck.arch)
    assert got.registers["k"] > 0
    assert cache.stats.rebuilt_corrupt == 1 and cache.stats.compiles == 1
    assert jit._decode(cache.path(key).read_bytes()).registers["k"] > 0


def test_dependent_launches_fall_back_where_the_driver_has_no_launch_ex(monkeypatch):
    torch = pytest.importorskip("torch")
    from runtime import normalization as rn

    def missing():
        raise AttributeError("libcuda.so.1: undefined symbol: cuLaunchKernelEx")

    monkeypatch.setattr(jit, "_driver", missing)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (9, 0))
    rn.clear_caches()
    try:
        assert rn.dependent_launch(0) is False
    finally:
        rn.clear_caches()


def _nvrtc_library():
    """The libnvrtc CuPy loaded (after a compile), from this process's mappings."""
    import ctypes

    jit.compile(SRC, ["scale"], "sm_90")
    try:
        with open("/proc/self/maps") as fh:
            paths = {line.split()[-1] for line in fh if "libnvrtc.so" in line}
    except OSError:
        paths = set()
    if not paths:
        pytest.skip("no libnvrtc mapped in this process")
    return ctypes.CDLL(sorted(paths)[0])


def test_cubin_is_nvrtcs_whole_image():
    # CuPy's getCUBIN drops the image's last byte; jit.compile gives back NVRTC's bytes
    import ctypes

    lib = _nvrtc_library()
    opts = ["-arch=sm_90", *jit.BASE_OPTIONS]
    if jit.nvrtc_version() >= jit.NVRTC_NO_CACHE:
        opts.append("--no-cache")
    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), SRC.encode(), b"scale.cu", 0, None, None) == 0
    try:
        argv = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
        assert lib.nvrtcCompileProgram(prog, len(opts), argv) == 0
        size = ctypes.c_size_t()
        assert lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)) == 0
        buf = ctypes.create_string_buffer(size.value)
        assert lib.nvrtcGetCUBIN(prog, buf) == 0
        direct = buf.raw
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
    ck = jit._compile_once(SRC, ["scale"], "sm_90", ())
    assert len(ck.cubin) == len(direct)
    assert ck.cubin == direct


def test_whole_elf_pads_only_a_short_image():
    ck = jit.compile(SRC, ["scale"], "sm_90")
    assert jit.whole_elf(ck.cubin) == ck.cubin
    assert jit.whole_elf(ck.cubin[:-1]) == ck.cubin  # the last byte is a 0
    assert jit.whole_elf(b"not an elf") == b"not an elf"
    assert jit.whole_elf(ck.cubin[:-100]) == ck.cubin[:-100]  # too short to be a dropped NUL
