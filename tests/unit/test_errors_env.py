"""Malformed HOSTIR_* settings and Ctrl-C end in one line and a non-zero exit code on
every rank: no traceback, no hang (CPU only)."""

import os
import shutil
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from hostir.errors import OptionsError
from hostir.options import Options, set_options

ROOT = Path(__file__).resolve().parents[2]
MPIRUN = shutil.which("mpirun") or shutil.which("mpirun", path=os.path.dirname(sys.executable))


def _env(tmp_path, **extra) -> dict:
    """This environment without HOSTIR_* settings, a cache in ``tmp_path``, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOSTIR_")}
    env.update({"HOSTIR_CACHE_DIR": str(tmp_path / "cache"),
                "PYTHONPATH": f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}"}, **extra)
    return env


def _job(*args: str) -> list[str]:
    return [sys.executable, "-m", "hostir.run", *args]


# ----------------------------------------------------------------- 1: under mpirun


class _PeerWithError:
    """A two-rank MPI world whose peer also reports an error: every request completes."""

    class _Request:
        def Test(self):
            return True

    def Get_rank(self):
        return 0

    def Get_size(self):
        return 2

    def Irecv(self, *args, **kwargs):
        return self._Request()

    Isend = Irecv


def test_ending_after_a_malformed_setting_does_not_raise_it_again(monkeypatch):
    # every_rank_failed read HOSTIR_COMM_TIMEOUT through options(), which raised the very
    # OptionsError being reported: a second traceback, from the excepthook too
    from runtime import watchdog

    monkeypatch.setenv("HOSTIR_DUMP", "bogus")
    monkeypatch.setattr(watchdog, "mpi_world", lambda: _PeerWithError())
    monkeypatch.setattr(watchdog, "world_size", lambda: 2)
    set_options(None)
    try:
        assert watchdog.every_rank_failed(2)
        assert watchdog.end_after_error(OptionsError("HOSTIR_DUMP: unknown"), 2) == 2
    finally:
        set_options(None)


@pytest.mark.skipif(MPIRUN is None, reason="needs mpirun")
def test_a_malformed_setting_under_mpirun_is_one_line_on_every_rank(tmp_path):
    env = _env(tmp_path, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               PRTE_MCA_rmaps_default_mapping_policy=":oversubscribe",
               OMPI_MCA_rmaps_base_oversubscribe="1")
    cmd = [MPIRUN, "-np", "2", "-x", "HOSTIR_DUMP=bogus",
           *_job("pipelined_matmul", "--device", "cpu", "--iters", "1")]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, timeout=120)
    out = proc.stdout.decode(errors="replace")
    assert proc.returncode == 2, out
    for r in range(2):
        assert (f"[rank {r}] hostir pipelined_matmul: error: OptionsError: HOSTIR_DUMP: "
                "unknown option(s) ['bogus']") in out, out
    assert "Traceback" not in out and "sys.excepthook" not in out, out
    assert "MPI_ABORT" not in out, out


# ----------------------------------------------------------------- 2, 3: the values


@pytest.mark.parametrize("raw", ["inf", "Infinity", "1e300", "604801", "nan", "-1", "abc"])
def test_comm_timeout_must_be_finite_and_at_most_a_week(raw):
    with pytest.raises(OptionsError, match=r"HOSTIR_COMM_TIMEOUT: expected seconds from 0 "
                                           r"to 604800 \(a week; 0 waits forever\)"):
        Options.from_environ({"HOSTIR_COMM_TIMEOUT": raw})


def test_comm_timeout_up_to_a_week_is_accepted_and_no_more():
    for raw, want in [("0", 0.0), ("2.5", 2.5), ("604800", 604800.0)]:
        assert Options.from_environ({"HOSTIR_COMM_TIMEOUT": raw}).comm_timeout_s == want
    with pytest.raises(OptionsError, match="HOSTIR_COMM_TIMEOUT"):
        Options.from_environ({"HOSTIR_COMM_TIMEOUT": "604800.5"})


@pytest.mark.parametrize("raw", ["²", "١٢", "１２"])  # digits to str.isdigit(), not ASCII
def test_flight_entries_must_be_ascii_digits(raw):
    from runtime import flight

    with pytest.raises(OptionsError, match=r"HOSTIR_FLIGHT_ENTRIES=.*expected a whole number"):
        flight.capacity_from_environ({"HOSTIR_FLIGHT_ENTRIES": raw})


@pytest.mark.parametrize("var, raw, args", [
    ("HOSTIR_COMM_TIMEOUT", "inf", ("--comm", "torch")),  # was an OverflowError (timedelta)
    ("HOSTIR_FLIGHT_ENTRIES", "²", ()),  # was a ValueError from int()
])
def test_a_malformed_value_is_one_line_and_the_usage_code(tmp_path, var, raw, args):
    proc = subprocess.run(_job("pipelined_matmul", "--device", "cpu", "--iters", "1",
                               "--warmup", "0", *args),
                          cwd=ROOT, env=_env(tmp_path, **{var: raw}), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, timeout=120)
    err = proc.stderr.decode(errors="replace")
    assert proc.returncode == 2, err
    assert err.startswith(f"[rank 0] hostir pipelined_matmul: error: OptionsError: {var}")
    assert err.count("\n") == 1, err


# ----------------------------------------------------------------- 4: Ctrl-C


def _interrupted_job(monkeypatch):
    """A job named ``interrupted`` whose main is interrupted (Ctrl-C)."""
    from hostir import run

    def main(args):
        raise KeyboardInterrupt

    module = types.ModuleType("_hostir_test_interrupted_job")
    module.add_arguments = lambda parser: None
    module.main = main
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(run.JOBS, "interrupted", module.__name__)
    monkeypatch.delenv("HOSTIR_DEBUG", raising=False)
    return run


def test_an_interrupt_ends_the_job_with_its_peers_and_code_130(monkeypatch, capsys):
    # with peers (faked), an interrupted rank takes the error path's ending: it aborts
    # the job, since its peers may wait in a collective it will never post
    from runtime import watchdog

    run = _interrupted_job(monkeypatch)
    ended = []
    monkeypatch.setattr(watchdog, "install_excepthook", lambda: None)
    monkeypatch.setattr(watchdog, "world_size", lambda: 2)
    monkeypatch.setattr(watchdog, "end_job", ended.append)
    try:
        code = run.main(["interrupted"])
    except KeyboardInterrupt:
        pytest.fail("the interrupt escaped hostir.run.main")
    assert code == run.EXIT_INTERRUPTED == 130
    assert ended == [130]
    assert capsys.readouterr().err == "[rank 0] hostir interrupted: error: interrupted\n"


def test_ctrl_c_is_one_line_and_exit_code_130(tmp_path):
    proc = subprocess.Popen(_job("pipelined_matmul", "--device", "cpu", "--iters", "1000000"),
                            cwd=ROOT, env=_env(tmp_path), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        time.sleep(2.0)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = err.decode(errors="replace")
    assert proc.returncode == 130, err
    assert err == "[rank 0] hostir pipelined_matmul: error: interrupted\n", err
