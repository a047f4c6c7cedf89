"""`python -m hostir.run warmup`'s errors (docs/JOBS.md): a bad --arch, a kernel cache
that cannot be used or written end in one line ``hostir warmup: error: ...`` and their
exit code, never a traceback nor "N of N kernels" that are not on disk; an entry already
in the cache that does not verify is rebuilt, never trusted, followed or waited on. CPU
only (NVRTC compiles without a GPU); each case compiles at most a few tiny kernels."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("cupy")

from hostir.jobs.exit_codes import EXIT_OUTPUT, EXIT_USAGE  # noqa: E402
from hostir.options import set_options  # noqa: E402
from runtime import jit, store  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TINY = ["layer_norm", "--hidden", "64", "--workers", "1"]  # one small kernel


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """A private HOSTIR_CACHE_DIR for this test, and a fresh process-wide kernel cache."""
    directory = tmp_path / "cache"
    monkeypatch.setenv("HOSTIR_CACHE_DIR", str(directory))
    monkeypatch.delenv("HOSTIR_DISABLE", raising=False)
    monkeypatch.delenv("HOSTIR_TRUST_CACHE_DIR", raising=False)
    monkeypatch.setattr(jit, "_CACHE", None)
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)  # hostir.run installs its own
    set_options(None)
    store.reset_warnings()
    yield directory
    set_options(None)
    store.reset_warnings()


def _warmup(capsys, *argv):
    """``hostir.run warmup ARGV`` in this process: (exit code, stdout, stderr lines)."""
    from hostir import run

    code = run.main(["warmup", *argv])
    out, err = capsys.readouterr()
    return code, out, [line for line in err.splitlines() if line.strip()]


def _one_error(code, lines, want_code, *words):
    assert code == want_code, lines
    assert len(lines) == 1, lines
    assert "hostir warmup: error: " in lines[0] and "Traceback" not in lines[0]
    for w in words:
        assert w in lines[0], lines[0]


def _run(cache, *argv, timeout=120):
    env = {"PYTHONPATH": str(ROOT), "HOSTIR_CACHE_DIR": str(cache), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-m", "hostir.run", "warmup", *argv], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=timeout)


# ------------------------------------------------------------------------ 1. --arch


def test_a_short_arch_is_one_usage_line_not_a_traceback(tmp_path):
    done = _run(tmp_path / "cache", *TINY, "--arch", "sm_9")
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    _one_error(done.returncode, lines, EXIT_USAGE, "--arch sm_9", "expected sm_XY")


@pytest.mark.parametrize("arch,words", [
    ("sm_50", "need sm_80 or newer"),           # NVRTC may take it; the kernels do not
    ("sm_75", "need sm_80 or newer"),
    ("sm_9999", "expected sm_XY"),
    ("sm_\u0669\u0660", "expected sm_XY"),      # Arabic-Indic digits: isdigit() says yes
    ("sm_090", "expected sm_XY"),
    ("sm_90a", "give sm_90"),
    ("sm_85", "does not compile for it"),       # no such part: NVRTC's list says so
    ("sm_999", "does not compile for it"),
])
def test_an_arch_nvrtc_or_the_kernels_cannot_take_is_refused_up_front(
        cache_dir, capsys, arch, words):
    code, out, lines = _warmup(capsys, *TINY, "--arch", arch)
    _one_error(code, lines, EXIT_USAGE, f"--arch {arch}", words)
    assert not out and not (cache_dir / "kernels").exists()  # refused before any compile


# ------------------------------------------------------------------------ 4. cache directory


def _file(p: Path) -> Path:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text("x")
    return p


def _shared(p: Path) -> Path:
    p.mkdir()
    os.chmod(p, 0o777)
    return p


def _kernels_a_file(p: Path) -> Path:
    p.mkdir(mode=0o700)
    _file(p / "kernels")
    return p


@pytest.mark.parametrize("make,words", [
    (lambda t: _file(t / "f"), "is not a directory"),
    (lambda t: _file(t / "f") / "sub", "f is not a directory"),
    (_shared, "writable by group or others (mode 0777)"),
    (_kernels_a_file, "kernels is not a directory"),
], ids=["a file", "under a file", "world-writable", "kernels a file"])
def test_an_unusable_cache_dir_is_one_output_line_with_its_reason(
        tmp_path, cache_dir, capsys, monkeypatch, make, words):
    bad = make(tmp_path / "bad")
    monkeypatch.setenv("HOSTIR_CACHE_DIR", str(bad))
    set_options(None)
    code, out, lines = _warmup(capsys, *TINY)
    _one_error(code, lines, EXIT_OUTPUT, "kernel cache", words)
    assert "HOSTIR_DISABLE" not in lines[0] and not out


def test_a_read_only_cache_dir_is_refused_before_any_compile(cache_dir, capsys, monkeypatch):
    kernels = cache_dir / "kernels"
    kernels.mkdir(parents=True, mode=0o700)
    os.chmod(cache_dir, 0o700)
    if os.geteuid() != 0:
        os.chmod(kernels, 0o500)
    else:  # root writes anyway: the write itself fails as it would for a user
        def refuse(*a, **k):
            raise PermissionError(13, "Permission denied")

        monkeypatch.setattr(tempfile, "TemporaryFile", refuse)
    monkeypatch.setattr(jit, "compile", lambda *a, **k: pytest.fail("compiled"))
    try:
        code, out, lines = _warmup(capsys, *TINY)
    finally:
        os.chmod(kernels, 0o700)
    _one_error(code, lines, EXIT_OUTPUT, f"cannot write in {kernels}", "Permission denied")


def test_a_disabled_kernel_cache_is_a_usage_line(cache_dir, capsys, monkeypatch):
    monkeypatch.setenv("HOSTIR_DISABLE", "kernel_cache")
    set_options(None)
    code, _, lines = _warmup(capsys, *TINY)
    _one_error(code, lines, EXIT_USAGE, "HOSTIR_DISABLE=kernel_cache")


# ------------------------------------------------------------------------ 2. a failed write


def test_an_entry_warmup_cannot_write_is_an_error_not_success(cache_dir, capsys, monkeypatch):
    def full(path, data):
        raise PermissionError(13, "Permission denied", str(path) + ".tmp")

    monkeypatch.setattr(jit, "write_atomically", full)
    code, out, lines = _warmup(capsys, *TINY)
    _one_error(code, lines, EXIT_OUTPUT, "kernel cache", "not written", "Permission denied")
    assert "kernels in" not in out and not list((cache_dir / "kernels").iterdir())

    # a job's own compile keeps running: the failed write is one warning
    src = 'extern "C" __global__ void k(float* x) { x[threadIdx.x] = 2.f; }'
    cache = jit.KernelCache(cache_dir / "kernels")
    assert cache.get(src, ["k"], "sm_90").cubin
    err = capsys.readouterr().err
    assert err.count("hostir: warning: kernel cache:") == 1 and "not written" in err


def test_a_failed_write_drops_the_units_not_started(cache_dir, monkeypatch):
    """The first entry that cannot be written ends `precompile`: the units queued behind
    it are not compiled (they could not be written either)."""
    compiled = []
    real = jit.compile

    def counting(source, names, *args, **kwargs):
        compiled.append(names[0])
        return real(source, names, *args, **kwargs)

    def full(path, data):
        raise PermissionError(13, "Permission denied", str(path) + ".tmp")

    monkeypatch.setattr(jit, "compile", counting)
    monkeypatch.setattr(jit, "write_atomically", full)
    with pytest.raises(jit.CacheWriteError, match="not written"):
        jit.precompile(_units(6), workers=1)
    assert compiled == ["k0"], compiled


def test_precompile_does_not_run_the_callers_script_again(cache_dir, tmp_path):
    """A user's script without a main guard that fills the cache runs once: the compiles
    are threads of its process, not spawned interpreters that import its ``__main__``."""
    script = tmp_path / "fill.py"
    script.write_text(
        f"import sys\nsys.path.insert(0, {str(ROOT)!r})\n"
        "print('script ran', flush=True)\n"
        "from runtime import jit\n"
        f"print('errors', jit.precompile({_units(3)!r}, workers=3))\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "HOSTIR_CACHE_DIR": str(cache_dir)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("script ran") == 1, done.stdout
    assert "errors [None, None, None]" in done.stdout, done.stdout
    assert len(list((cache_dir / "kernels").glob("*.cubin"))) == 3


# ------------------------------------------------------------------------ 3. invalid entries


def _units(n):
    return [(f'extern "C" __global__ void k{i}(float* x) {{ x[threadIdx.x] = {i}.f; }}',
             [f"k{i}"], "sm_90") for i in range(n)]


def _fifo(p, _):
    os.mkfifo(p)


def _unreadable(p, _):
    p.write_bytes(b"\0" * 100)
    os.chmod(p, 0)


DAMAGE = {
    "truncated": lambda p, good: p.write_bytes(good[:len(good) // 2]),
    "empty": lambda p, good: p.write_bytes(b""),
    "random bytes": lambda p, good: p.write_bytes(os.urandom(len(good))),
    "a directory": lambda p, good: p.mkdir(),
    "a symlink to /dev/zero": lambda p, good: p.symlink_to("/dev/zero"),
    "a fifo": _fifo,
    "unreadable": _unreadable,
    "a symlink out of the cache": lambda p, good: p.symlink_to(p.parent.parent / "outside"),
}


def _valid(path, source, names, arch) -> bool:
    blob = store.read_regular(path, store.MAX_ENTRY_BYTES)  # as KernelCache.get reads
    return jit._decode(blob, jit.cache_key(source, names, arch), names, arch) is not None


def test_entries_that_do_not_verify_are_rebuilt(cache_dir):
    units = _units(len(DAMAGE))
    assert jit.precompile(units, workers=2) == [None] * len(units)
    cache = jit.KernelCache(cache_dir / "kernels")
    paths = [cache.path(jit.cache_key(*u)) for u in units]
    outside = cache_dir / "outside"
    outside.write_bytes(b"not ours")
    for (name, damage), path in zip(DAMAGE.items(), paths):
        good = path.read_bytes()
        path.unlink()
        damage(path, good)
    fresh = jit._CACHE = jit.KernelCache()  # precompile's, as in a new process
    assert jit.precompile(units, workers=2) == [None] * len(units)  # no hang, no error
    bad = [name for name, path, u in zip(DAMAGE, paths, units)
           if not stat.S_ISREG(os.lstat(path).st_mode) or not _valid(path, *u)]
    assert not bad, f"not rebuilt: {bad}"
    assert outside.read_bytes() == b"not ours"  # the link was replaced, not followed
    assert fresh.stats.rebuilt_corrupt + fresh.stats.refused == len(DAMAGE)


def test_warmup_replaces_a_fifo_in_the_cache_and_says_so(tmp_path):
    cache_root = tmp_path / "cache"
    assert _run(cache_root, *TINY).returncode == 0
    (entry,) = (cache_root / "kernels").glob("*.cubin")
    entry.unlink()
    os.mkfifo(entry)
    done = _run(cache_root, *TINY, timeout=120)  # a read of the fifo would block here
    assert done.returncode == 0, done.stderr
    assert "1 of 1 kernels" in done.stdout and "did not verify" in done.stdout
    assert stat.S_ISREG(os.lstat(entry).st_mode)
    assert jit._decode(entry.read_bytes()) is not None
