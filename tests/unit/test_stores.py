"""Everything read back from disk is untrusted: each store (kernel cache, the tuners'
table, the schedule store) is fed malformed files, files of the wrong kind at an entry's
path, foreign entries in directories that are not private, and entries keyed for another
problem. No exception may escape, no read may hang (a FIFO!), and the caller still gets
the right answer (a fresh compile, the heuristic's pick). Then 8 processes write at once
and every key survives."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import multiprocessing as mp
import os
import signal
import stat

import pytest

from hostir.options import Options, options, set_options
from lowering.kernels import heuristics
from lowering.schedule import Schedule, choose_schedule
from runtime import autotune, jit, schedule_tuning, store
from runtime import matmul as rm
from runtime.matmul import Problem

SRC = 'extern "C" __global__ void scale(float* x, float a) { x[threadIdx.x] *= a; }\n'
# the same kernel name doing something else: what a planted cubin would be
OTHER_SRC = 'extern "C" __global__ void scale(float* x, float a) { x[threadIdx.x] += a; }\n'
ARCH = "sm_90"


class Hung(BaseException):
    """Raised by the alarm: no ``except OSError`` (TimeoutError is one) swallows it."""


@pytest.fixture(autouse=True)
def no_hang():
    """A read that blocks (a FIFO opened without O_NONBLOCK) fails the test instead."""
    def bail(*_):
        raise Hung("a store read hung")
    old = signal.signal(signal.SIGALRM, bail)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    saved = options()
    set_options(Options(cache_dir=d))
    monkeypatch.delenv(store.TRUST_ENV, raising=False)
    store.reset_warnings()
    yield d
    set_options(saved)
    store.reset_warnings()


# ------------------------------------------------------------------------ ways to break a path

def _sparse(path, size):
    with open(path, "wb") as f:
        f.truncate(size)


def _bad_kinds(cap: int, valid: bytes):
    """(name, make(path, tmp_path)): things at an entry's path that are not its file."""
    def directory(p, t):
        os.mkdir(p)

    def fifo(p, t):
        os.mkfifo(p)

    def link_dev_zero(p, t):
        os.symlink("/dev/zero", p)

    def link_to_file(p, t):
        elsewhere = t / "elsewhere.bin"
        elsewhere.write_bytes(valid)
        os.symlink(elsewhere, p)

    def oversized(p, t):
        _sparse(p, cap + 1)

    return [("directory", directory), ("fifo", fifo), ("symlink to /dev/zero", link_dev_zero),
            ("symlink to a valid file", link_to_file), ("oversized (sparse)", oversized)]


def _bytes_cases(valid: bytes):
    return [("empty file", b""), ("binary garbage", bytes(range(256)) * 7),
            ("truncated", valid[:len(valid) // 2]), ("one byte short", valid[:-1]),
            ("NUL bytes", b"\0" * 100)]


# ------------------------------------------------------------------------------ kernel cache

cupy = pytest.importorskip("cupy")


@pytest.fixture(scope="module")
def reference():
    """The right answer and a different cubin under the same kernel name."""
    return jit.compile(SRC, ["scale"], ARCH), jit.compile(OTHER_SRC, ["scale"], ARCH)


def _entry(meta_edit=None, header=None, cubin=None, key=None, names=("scale",), ref=None):
    """A kernel cache entry with a valid digest whose header is edited or replaced."""
    ck = ref
    meta = dataclasses.asdict(ck)
    meta.pop("cubin")
    meta["key"] = key
    if meta_edit:
        meta_edit(meta)
    raw = json.dumps(meta if header is None else header).encode()
    body = ck.cubin if cubin is None else cubin
    payload = len(raw).to_bytes(8, "little") + raw + body
    return jit._ENTRY_MAGIC + hashlib.sha256(payload).digest() + payload


def _set(field, value):
    return lambda m: m.__setitem__(field, value)


def _kernel_entries(key, ref, other):
    """(name, bytes) entries with valid digests that must all be misses under ``key``."""
    other_key = "0" * 64
    return [
        ("header []", _entry(header=[], key=key, ref=ref)),
        ("header \"x\"", _entry(header="x", key=key, ref=ref)),
        ("lowered a list", _entry(_set("lowered", []), key=key, ref=ref)),
        ("names a string", _entry(_set("names", "scale"), key=key, ref=ref)),
        ("names empty", _entry(_set("names", []), key=key, ref=ref)),
        ("registers negative", _entry(_set("registers", {"scale": -4}), key=key, ref=ref)),
        ("registers huge", _entry(_set("registers", {"scale": 10 ** 12}), key=key, ref=ref)),
        ("registers a string", _entry(_set("registers", {"scale": "32"}), key=key, ref=ref)),
        ("spills negative", _entry(_set("spill_bytes", {"scale": -1}), key=key, ref=ref)),
        ("arch garbage", _entry(_set("arch", "../../x"), key=key, ref=ref)),
        ("arch another", _entry(_set("arch", "sm_80"), key=key, ref=ref)),
        ("extra field", _entry(_set("run_me", True), key=key, ref=ref)),
        ("no ptxas report", _entry(_set("registers", {}), key=key, ref=ref)),
        ("another key", _entry(key=other_key, ref=ref)),
        ("another source, valid digest, wrong key", _entry(key=other_key, ref=other)),
        ("cubin not ELF", _entry(key=key, ref=ref, cubin=b"#!/bin/sh\nrm -rf ~\n")),
        ("old format", b"HOSTIRK1" + _entry(key=key, ref=ref)[8:]),
    ]


def _nested_entry():
    raw = b"[" * 100_000 + b"]" * 100_000
    payload = len(raw).to_bytes(8, "little") + raw + b"\x7fELF" + b"\0" * 60
    return jit._ENTRY_MAGIC + hashlib.sha256(payload).digest() + payload


def _huge_header_length():
    payload = (1 << 40).to_bytes(8, "little") + b"{}" + b"\x7fELF"
    return jit._ENTRY_MAGIC + hashlib.sha256(payload).digest() + payload


def _kernel_cases(key, ref, other, valid):
    cases = _kernel_entries(key, ref, other)
    cases += [("deeply nested header", _nested_entry()),
              ("header length past the end", _huge_header_length())]
    out = [(name, (lambda blob: lambda p, t: p.write_bytes(blob))(blob))
           for name, blob in _bytes_cases(valid) + cases]
    return out + _bad_kinds(store.MAX_ENTRY_BYTES, valid)


def _names_only():
    names = [n for n, _ in _bytes_cases(b"x" * 10)]
    names += ["header []", "header \"x\"", "lowered a list", "names a string", "names empty",
              "registers negative", "registers huge", "registers a string", "spills negative",
              "arch garbage", "arch another", "extra field", "no ptxas report", "another key",
              "another source, valid digest, wrong key", "cubin not ELF", "old format",
              "deeply nested header", "header length past the end"]
    names += ["directory", "fifo", "symlink to /dev/zero", "symlink to a valid file",
              "oversized (sparse)"]
    return names


KERNEL_CASES = _names_only()


@pytest.mark.parametrize("case", KERNEL_CASES)
def test_kernel_cache_malformed_entry_is_a_miss_and_rebuilt(case, tmp_path, cache_dir, reference):
    ref, other = reference
    directory = cache_dir / "kernels"
    warm = jit.KernelCache(directory)
    warm.get(SRC, ["scale"], ARCH)            # a valid entry, for the cases that use one
    key = jit.cache_key(SRC, ["scale"], ARCH)
    path = warm.path(key)
    valid = path.read_bytes()
    path.unlink()
    makers = dict(_kernel_cases(key, ref, other, valid))
    assert set(makers) == set(KERNEL_CASES)
    makers[case](path, tmp_path)
    cache = jit.KernelCache(directory)
    got = cache.get(SRC, ["scale"], ARCH)     # must not raise, must not hang
    assert got.cubin == ref.cubin and got.registers == ref.registers
    assert cache.stats.disk_hits == 0 and cache.stats.compiles == 1
    assert cache.stats.refused + cache.stats.rebuilt_corrupt == 1
    if case != "directory":                   # rewritten as a regular, valid entry
        assert stat.S_ISREG(os.lstat(path).st_mode)
        assert jit._decode(path.read_bytes(), key, ["scale"], ARCH) is not None


def _plant_foreign(directory, reference):
    """A valid entry (correct digest, key, names, arch) holding another kernel's cubin."""
    ref, other = reference
    key = jit.cache_key(SRC, ["scale"], ARCH)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{key}.cubin").write_bytes(jit._encode(other, key))
    return key


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o722])
def test_kernel_cache_bypasses_a_directory_others_can_write(mode, cache_dir, reference,
                                                            monkeypatch, capsys):
    directory = cache_dir / "kernels"
    _plant_foreign(directory, reference)
    os.chmod(directory, mode)
    cache = jit.KernelCache()                 # the default: <cache_dir>/kernels
    got = cache.get(SRC, ["scale"], ARCH)
    assert got.cubin == reference[0].cubin    # compiled, the planted cubin never loaded
    assert cache.stats.bypassed == 1 and cache.stats.disk_hits == 0
    jit.KernelCache().get(SRC, ["scale"], ARCH)
    err = capsys.readouterr().err
    assert err.count("hostir: warning: kernel cache:") == 1 and "writable by group" in err
    # opted in: the user vouches for the directory, and the entry is read as it is
    monkeypatch.setenv(store.TRUST_ENV, "1")
    opted = jit.KernelCache()
    assert opted.get(SRC, ["scale"], ARCH).cubin == reference[1].cubin
    assert opted.stats.disk_hits == 1


def test_kernel_cache_refuses_a_cache_root_others_can_write(cache_dir, reference):
    _plant_foreign(cache_dir / "kernels", reference)
    os.chmod(cache_dir, 0o777)                # the root, not the kernels folder
    cache = jit.KernelCache()
    assert cache.get(SRC, ["scale"], ARCH).cubin == reference[0].cubin
    assert cache.stats.bypassed == 1


def _chown_or_fake(path, monkeypatch):
    """Make ``path`` another user's: chown as root, else pretend to be someone else."""
    if os.geteuid() == 0:
        os.chown(path, 4242, 4242)
    else:
        real = os.geteuid()
        monkeypatch.setattr(store.os, "geteuid", lambda: real + 1)


def test_kernel_cache_refuses_a_directory_owned_by_another_user(cache_dir, reference,
                                                               monkeypatch):
    directory = cache_dir / "kernels"
    _plant_foreign(directory, reference)
    _chown_or_fake(directory, monkeypatch)
    cache = jit.KernelCache()
    assert cache.get(SRC, ["scale"], ARCH).cubin == reference[0].cubin
    assert cache.stats.bypassed == 1 and cache.stats.disk_hits == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown a file")
def test_kernel_cache_refuses_an_entry_owned_by_another_user(cache_dir, reference):
    key = _plant_foreign(cache_dir / "kernels", reference)
    os.chown(cache_dir / "kernels" / f"{key}.cubin", 4242, 4242)
    cache = jit.KernelCache()
    assert cache.get(SRC, ["scale"], ARCH).cubin == reference[0].cubin
    assert cache.stats.refused == 1


def test_default_cache_directory_is_created_private(tmp_path):
    saved = options()
    set_options(Options(cache_dir=tmp_path / "new" / "hostir"))
    try:
        cache = jit.KernelCache()
        cache.get(SRC, ["scale"], ARCH)
        for d in (tmp_path / "new", tmp_path / "new" / "hostir", cache.directory):
            assert stat.S_IMODE(os.stat(d).st_mode) == 0o700, d
        assert cache.stats.compiles == 1 and cache.stats.bypassed == 0
        (entry,) = cache.directory.glob("*.cubin")
        assert stat.S_IMODE(os.stat(entry).st_mode) == 0o600
    finally:
        set_options(saved)


def test_external_stream_uses_the_stream_protocol_without_deprecation():
    import warnings

    handle = 0x7f00_1234
    jit._STREAMS.pop(handle, None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")        # CuPy 14 warns on ExternalStream
        s = jit._external_stream(handle)
    assert s.ptr == handle and jit._external_stream(handle) is s


# ------------------------------------------------------------------------- the tuners' table

PROBLEM = Problem(1024, 2048, 4096, "bf16", "bf16", "TN", False)
GPU = "Fake GPU 80GB"
TUNER_KEY = f"{GPU}|1024x2048x4096|bf16->bf16|TN|bias=0"


@pytest.fixture
def tuners(cache_dir, monkeypatch):
    """A fake device (name, arch, SMs) so winners are looked up without CUDA."""
    arch = {"value": "sm_90"}
    monkeypatch.setattr(autotune, "_device_name", lambda device=None: GPU)
    monkeypatch.setattr(autotune, "tuning_arch", lambda device=None: arch["value"])
    monkeypatch.setattr(rm, "tuning_arch", lambda device=None: arch["value"])
    monkeypatch.setattr(rm, "sm_count", lambda device=None: 132)
    rm._SPECS.clear()
    yield arch
    rm._SPECS.clear()


def _heuristic(arch="sm_90"):
    p = PROBLEM
    return heuristics.choose(p.M, p.N, p.K, a_dtype=p.a_dtype, out_dtype=p.out_dtype,
                             layout=p.layout, bias=p.bias, sm_count=132, arch=arch)


def _winner():
    """A valid winner that differs from the heuristic's pick (so a hit is visible)."""
    base = heuristics.spec_for(heuristics.TILE_CONFIGS[2])
    spec = dataclasses.replace(base, split_k=2, split_mode="serial")
    assert spec != _heuristic()
    return spec


def _winner_entry(**spec_edits):
    spec = dataclasses.asdict(_winner())
    spec.update(spec_edits)
    return {"spec": spec, "us": 12.5, "arch": "sm_90", "key": TUNER_KEY}


def _table_with(entry):
    return json.dumps({TUNER_KEY: entry}).encode()


def _edit(**top):
    e = _winner_entry()
    e.update(top)
    return e


TUNER_ENTRIES = {
    "table []": b"[]",
    "table \"x\"": b'"x"',
    "table null": b"null",
    "entry a list": _table_with([]),
    "spec a list": _table_with(_edit(spec=[])),
    "stages 0": _table_with(_winner_entry(stages=0)),
    "stages negative": _table_with(_winner_entry(stages=-3)),
    "stages huge": _table_with(_winner_entry(stages=10 ** 15)),
    "stages a string": _table_with(_winner_entry(stages="4")),
    "split_k unknown": _table_with(_winner_entry(split_k=7)),
    "tile unknown": _table_with(_winner_entry(tile_m=96, tile_n=96)),
    "split_mode unknown": _table_with(_winner_entry(split_mode="bogus")),
    "instr unknown": _table_with(_winner_entry(instr="tcgen05")),
    "bool field a string": _table_with(_winner_entry(tma="yes")),
    "extra spec field": _table_with(_winner_entry(run="x")),
    "missing spec field": _table_with({**_winner_entry(), "spec": {"tile_m": 128}}),
    "us negative": _table_with(_edit(us=-1.0)),
    "us NaN": _table_with(_edit(us=float("nan"))),
    "winner for fp16": _table_with(_winner_entry(a_dtype="fp16", b_dtype="fp16")),
    "winner for another out dtype": _table_with(_winner_entry(out_dtype="fp32")),
    "winner for layout NN": _table_with(_winner_entry(layout="NN")),
    "winner with bias": _table_with(_winner_entry(bias=True)),
    "winner tuned for sm_80": _table_with(_edit(arch="sm_80")),
    "entry copied from another key": _table_with(_edit(key=f"{GPU}|1x1x8|bf16->bf16|TN|bias=0")),
    "entry without its key": _table_with({k: v for k, v in _winner_entry().items() if k != "key"}),
}


def _tuner_makers():
    valid = _table_with(_winner_entry())
    makers = {name: (lambda blob: lambda p, t: p.write_bytes(blob))(blob)
              for name, blob in {**TUNER_ENTRIES, **dict(_bytes_cases(valid))}.items()}
    makers.update(_bad_kinds(store.MAX_TABLE_BYTES, valid))
    return makers


TUNER_CASES = sorted(_tuner_makers())


def test_tuners_table_holds_a_valid_winner(tuners):
    """The control: the valid entry the cases break is found, and wins over the heuristic."""
    assert autotune._key(PROBLEM) == TUNER_KEY
    autotune._store(PROBLEM, _winner(), 12.5)
    assert autotune.stored_winner(PROBLEM) == _winner()
    assert rm.choose_spec(PROBLEM) == _winner()
    data = json.loads((options().cache_dir / autotune.FILE_NAME).read_text())
    assert data == json.loads(_table_with(_winner_entry()))


@pytest.mark.parametrize("case", TUNER_CASES)
def test_tuners_table_malformed_is_a_miss(case, tuners, tmp_path, capsys):
    path = options().cache_dir / autotune.FILE_NAME
    assert store.trusted_dir(options().cache_dir)
    _tuner_makers()[case](path, tmp_path)
    assert autotune.stored_winner(PROBLEM) is None        # no exception, no hang
    assert rm.choose_spec(PROBLEM) == _heuristic()        # the caller's fallback
    assert autotune.stored_entry("normalization|x") is None
    if case != "symlink to a valid file":
        assert capsys.readouterr().err.count("hostir: warning: autotune store:") == 1


def test_a_wgmma_winner_is_a_miss_where_wgmma_is_off(tuners):
    wgmma = heuristics.spec_for(heuristics.WGMMA_CONFIGS[0])
    autotune._store(PROBLEM, wgmma, 10.0)
    assert autotune.stored_winner(PROBLEM) == wgmma
    tuners["value"] = None                    # HOSTIR_DISABLE=wgmma: mma.sync tiles only
    assert autotune.stored_winner(PROBLEM) is None


@pytest.mark.parametrize("plan", [[], "x", {"threads_per_row": "33"}, {"threads_per_row": -1},
                                  {"threads_per_row": 10 ** 9}, {"param_cache": "bogus"},
                                  {"l2_hint": 3}, {"unknown_field": 1}])
def test_a_malformed_normalization_plan_is_a_miss(plan, cache_dir):
    autotune.store_entry("normalization|gpu|x", {"plan": plan})
    assert autotune.stored_entry("normalization|gpu|x") is None
    autotune.store_entry("normalization|gpu|x", {"plan": {"threads_per_row": 64,
                                                          "param_cache": "registers"}})
    assert autotune.stored_entry("normalization|gpu|x")["plan"]["threads_per_row"] == 64


@pytest.mark.parametrize("how", ["world-writable", "group-writable", "another owner"])
def test_tuners_table_in_a_directory_not_private_is_ignored(how, tuners, monkeypatch):
    autotune._store(PROBLEM, _winner(), 12.5)
    if how == "another owner":
        _chown_or_fake(options().cache_dir, monkeypatch)
    else:
        os.chmod(options().cache_dir, 0o777 if how == "world-writable" else 0o770)
    assert autotune.stored_winner(PROBLEM) is None
    assert rm.choose_spec(PROBLEM) == _heuristic()
    before = (options().cache_dir / autotune.FILE_NAME).read_bytes()
    autotune._store(PROBLEM, _heuristic(), 1.0)           # nor written
    assert (options().cache_dir / autotune.FILE_NAME).read_bytes() == before
    monkeypatch.setenv(store.TRUST_ENV, "1")
    assert autotune.stored_winner(PROBLEM) == _winner()


# ------------------------------------------------------------------------- the schedule store

SHAPE = (64, 8, 8, 2, "cpu", "float32")        # m, k, n, world, device, dtype
SCHED_KEY = schedule_tuning._key(64, 8, 8, 2, "cpu", "float32")


def _sched(**edits):
    e = {"schedule": "ring", "stages": 4, "streams": 3, "transport": "mpi", "us": 12.5,
         "key": SCHED_KEY}
    e.update(edits)
    return json.dumps({SCHED_KEY: e}).encode()


SCHEDULE_ENTRIES = {
    "table []": b"[]",
    "table \"x\"": b'"x"',
    "entry a list": json.dumps({SCHED_KEY: []}).encode(),
    "entry a number": json.dumps({SCHED_KEY: 3}).encode(),
    "stages 0": _sched(stages=0),
    "stages negative": _sched(stages=-2),
    "stages huge": _sched(stages=2 ** 40),
    "stages a string": _sched(stages="4"),
    "stages a float": _sched(stages=4.0),
    "stages true": _sched(stages=True),
    "stages not dividing m": _sched(stages=3),
    "streams 0": _sched(streams=0),
    "streams huge": _sched(streams=10 ** 6),
    "schedule unknown": _sched(schedule="teleport"),
    "transport unknown": _sched(transport="carrier pigeon"),
    "transport nccl on cpu": _sched(transport="nccl"),
    "us NaN": _sched(us=float("nan")),
    "entry copied from another key": _sched(key="cpu|world2|64x8x16|float32"),
    "entry without its key": json.dumps({SCHED_KEY: {"schedule": "ring", "stages": 4,
                                                     "streams": 3, "transport": "mpi",
                                                     "us": 1.0}}).encode(),
}


def _schedule_makers():
    valid = _sched()
    makers = {name: (lambda blob: lambda p, t: p.write_bytes(blob))(blob)
              for name, blob in {**SCHEDULE_ENTRIES, **dict(_bytes_cases(valid))}.items()}
    makers.update(_bad_kinds(store.MAX_TABLE_BYTES, valid))
    return makers


SCHEDULE_CASES = sorted(_schedule_makers())


def test_schedule_store_holds_a_valid_choice(cache_dir):
    schedule_tuning.store(*SHAPE, Schedule("ring", 4, 3, "mpi"), 12.5)
    assert schedule_tuning.choose(*SHAPE) == Schedule("ring", 4, 3, "mpi")
    assert json.loads((cache_dir / schedule_tuning.FILE).read_bytes()) == json.loads(_sched())


@pytest.mark.parametrize("case", SCHEDULE_CASES)
def test_schedule_store_malformed_is_a_miss(case, cache_dir, tmp_path, capsys):
    assert store.trusted_dir(cache_dir)
    _schedule_makers()[case](cache_dir / schedule_tuning.FILE, tmp_path)
    got = schedule_tuning.choose(*SHAPE)                 # no exception, no hang
    assert got == choose_schedule(64, 8, 8, 2, "cpu")    # the heuristic
    assert got.stages >= 1
    if case != "symlink to a valid file":
        assert capsys.readouterr().err.count("hostir: warning: schedule store:") == 1


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o707])
def test_schedule_store_in_a_directory_others_can_write_is_ignored(mode, cache_dir):
    schedule_tuning.store(*SHAPE, Schedule("ring", 4, 3, "mpi"), 12.5)
    os.chmod(cache_dir, mode)
    assert schedule_tuning.choose(*SHAPE) == choose_schedule(64, 8, 8, 2, "cpu")


def test_a_write_over_a_bad_path_warns_and_goes_on(cache_dir):
    (cache_dir).mkdir(parents=True, exist_ok=True)
    os.mkdir(cache_dir / schedule_tuning.FILE)           # a directory where the table goes
    schedule_tuning.store(*SHAPE, Schedule("ring", 4, 3, "mpi"), 12.5)   # no exception
    assert schedule_tuning.choose(*SHAPE) == choose_schedule(64, 8, 8, 2, "cpu")


# ------------------------------------------------------------------------- 8 writers at once

WRITERS, ROUNDS = 8, 6


def _writer(directory, index, barrier):
    set_options(Options(cache_dir=directory))
    barrier.wait()
    for r in range(ROUNDS):
        autotune.store_entry(f"normalization|own|{index}|{r}", {"plan": {"batch": index}})
        autotune.store_entry("normalization|shared", {"plan": {"batch": r}})
        schedule_tuning.store(64 * (index + 1), 8, r + 1, 2, "cpu", "float32",
                              Schedule("pipelined", 2, 2, "mpi"), float(index))
        schedule_tuning.store(64, 8, 8, 2, "cpu", "float32", Schedule("ring", 4, 3, "mpi"),
                              float(r))


def test_eight_processes_writing_at_once_lose_no_entry(cache_dir):
    store.trusted_dir(cache_dir)
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(WRITERS)
    procs = [ctx.Process(target=_writer, args=(cache_dir, i, barrier)) for i in range(WRITERS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * WRITERS
    tuned = json.loads((cache_dir / autotune.FILE_NAME).read_bytes())
    want = {f"normalization|own|{i}|{r}" for i in range(WRITERS) for r in range(ROUNDS)}
    assert set(tuned) == want | {"normalization|shared"}
    for key in tuned:
        assert autotune.stored_entry(key) is not None, key
    schedules = json.loads((cache_dir / schedule_tuning.FILE).read_bytes())
    assert len(schedules) == WRITERS * ROUNDS + 1
    for i in range(WRITERS):
        for r in range(ROUNDS):
            assert schedule_tuning.choose(64 * (i + 1), 8, r + 1, 2, "cpu", "float32") == \
                Schedule("pipelined", 2, 2, "mpi")
    assert schedule_tuning.choose(*SHAPE) == Schedule("ring", 4, 3, "mpi")
    assert not list(cache_dir.glob("*.tmp"))             # no temp file left behind


# ------------------------------------------------------------------------- private output files

def test_default_trace_path_is_private_and_fresh(cache_dir):
    from runtime import trace

    a = trace.default_trace_base()
    d = os.path.dirname(a)
    assert d.startswith(str(cache_dir)) and stat.S_IMODE(os.stat(d).st_mode) == 0o700
    assert "hostir_trace.json" not in a


def test_private_dir_avoids_a_shared_cache_dir(cache_dir, monkeypatch, tmp_path):
    cache_dir.mkdir(parents=True)
    os.chmod(cache_dir, 0o777)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    d = store.private_dir("traces")
    assert not str(d).startswith(str(cache_dir))
    st = os.stat(d)
    assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.geteuid()


def test_trace_write_replaces_a_planted_symlink_instead_of_following_it(tmp_path, capsys):
    import torch

    from runtime import trace

    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    path = tmp_path / "shared" / "run.json"
    path.parent.mkdir()
    os.symlink(victim, path)
    trace.record(lambda: torch.ones(4).sum(), 1, str(path), warmup=1)
    assert victim.read_text() == "precious"
    assert not os.path.islink(path) and json.loads(path.read_text())
    assert f"trace written to {path}" in capsys.readouterr().err


def test_read_regular_never_blocks_on_a_fifo(tmp_path):
    fifo = tmp_path / "entry"
    os.mkfifo(fifo)
    with pytest.raises(store.Refused, match="not a regular file"):
        store.read_regular(fifo, 100)
    assert store.read_regular(tmp_path / "missing", 100) is None
