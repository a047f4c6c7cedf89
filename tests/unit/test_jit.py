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
