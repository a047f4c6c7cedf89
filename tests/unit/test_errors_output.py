"""Errors a user can cause around seeds, output files and checks: one line
``[rank R] hostir <job>: error: ...`` and the exit code of its class, no traceback, no
hang, and no output file left half written or replaced (CPU only, about 45 s)."""

from __future__ import annotations

import errno
import os
import resource
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from hostir.jobs import pipelined_matmul, preflight as pf, train_mlp, train_transformer
from hostir.jobs.results import write_json
from hostir.run import EXIT_CHECK_FAILED, EXIT_OUTPUT, EXIT_USAGE

ROOT = Path(__file__).resolve().parents[2]
JOBS = {"pipelined_matmul": pipelined_matmul, "train_mlp": train_mlp,
        "train_transformer": train_transformer}
# A small pipelined_matmul run (--json tests).
SMALL_PM = ["--device", "cpu", "--iters", "1", "--warmup", "0", "--m", "64", "--n", "64",
            "--k", "64"]


def _env() -> dict:
    env = dict(os.environ)
    env.pop("HOSTIR_DEBUG", None)
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}"
    env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                "PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe"})
    return env


def _file_limit(nbytes: int):
    """A preexec_fn: the child may not write a file past ``nbytes`` (EFBIG; Python ignores
    SIGXFSZ). Its stdout and stderr are pipes, which the limit does not cover."""
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, nbytes))


def run(job: str, *flags: str, cwd=ROOT, preexec_fn=None) -> tuple[int, str, str]:
    proc = subprocess.run([sys.executable, "-m", "hostir.run", job, *flags], cwd=cwd,
                          env=_env(), capture_output=True, text=True, timeout=120,
                          preexec_fn=preexec_fn)
    return proc.returncode, proc.stdout, proc.stderr


def assert_one_error_line(job: str, err: str, says: str, rank: int = 0) -> None:
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if f"hostir {job}: error: " in line]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"[rank {rank}] hostir {job}: error: "), err
    assert says in lines[0], err


def parse(job: str, *flags: str):
    p = pf.JobParser()
    JOBS[job].add_arguments(p)
    return p.parse_args(list(flags))


def _mknod_null(path: Path) -> None:
    """A character device node like /dev/null, inside the test's own directory."""
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("mknod needs root")


# ----------------------------------------------------------------------- 1. --seed


@pytest.mark.parametrize("job", sorted(JOBS))
def test_a_seed_out_of_range_is_a_usage_error_at_parse_time(job):
    # torch takes [-2**63, 2**64 - 1]; the jobs add offsets (seed + 1000 + step)
    assert parse(job, "--seed", str(2 ** 63 - 1)).seed == 2 ** 63 - 1
    assert parse(job, "--seed", str(-2 ** 63)).seed == -2 ** 63
    for bad in ("99999999999999999999999", str(2 ** 63), str(-2 ** 63 - 1), "1.5"):
        with pytest.raises(pf.UsageError, match="argument --seed: expected an integer"):
            parse(job, "--seed", bad)


def test_a_huge_seed_ends_the_job_with_one_line():
    rc, _, err = run("pipelined_matmul", "--device", "cpu", "--seed", "99999999999999999999999")
    assert rc == EXIT_USAGE, err
    assert_one_error_line("pipelined_matmul", err, "argument --seed: expected an integer "
                          "from -2**63 to 2**63 - 1")


# ----------------------------------------------------------------------- 2. appending --json


@pytest.mark.parametrize("name", ["somedir/", "somedir/.", "somedir/.."])
def test_an_output_file_path_naming_a_directory_is_refused(tmp_path, name):
    path = str(tmp_path / "x") + os.sep + name
    with pytest.raises(pf.OutputPathError, match="names a directory, expected a file") as e:
        pf.writable_output("--json", path)
    assert e.value.code == EXIT_OUTPUT
    # where a directory is welcome (a results directory), the slash still says so
    assert pf.writable_output("--json", str(tmp_path / "d") + os.sep, directory_ok=True)


def test_an_append_that_fails_midway_leaves_the_file_as_it_was(tmp_path, monkeypatch):
    path = tmp_path / "runs.jsonl"
    path.write_text('{"run": 1}\n')
    real_write = os.write

    def full_disk(fd, data):  # the first write stops short, the next finds the disk full
        if len(data) > 20:
            return real_write(fd, data[:20])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", full_disk)
    with pytest.raises(pf.OutputPathError) as failed:
        pipelined_matmul._append_json(str(path), {"run": 2, "pad": "x" * 100})
    monkeypatch.undo()
    assert "No space left on device" in str(failed.value)
    assert "nothing written" in str(failed.value)
    assert path.read_text() == '{"run": 1}\n'


def test_every_rank_ends_with_the_output_error_when_rank_0_cannot_append(tmp_path):
    """A JSON line past the file size limit (EFBIG after a short write): rank 0 cuts the
    file back, and both ranks end with the output error."""
    mpirun = shutil.which("mpirun", path=f"{Path(sys.executable).parent}{os.pathsep}"
                                          f"{os.environ.get('PATH', '')}")
    if mpirun is None:
        pytest.skip("needs mpirun")
    path = tmp_path / "runs.jsonl"
    path.write_text("x" * 1000 + "\n")
    # the limit on the ranks only (mpirun's own daemon would die of SIGXFSZ)
    job = " ".join([sys.executable, "-m", "hostir.run", "pipelined_matmul", *SMALL_PM,
                    "--json", str(path)])
    proc = subprocess.run([mpirun, "-np", "2", "bash", "-c", f"ulimit -f 1; exec {job}"],
                          cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == EXIT_OUTPUT, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    for rank, says in ((0, "--json"), (1, "rank 0 failed: --json")):
        mine = [line.strip() for line in proc.stderr.splitlines()
                if f"[rank {rank}] hostir pipelined_matmul: error: " in line]
        assert len(mine) == 1, proc.stderr
        assert f"error: {says} {path}: cannot append: File too large" in mine[0], proc.stderr
    assert path.read_text() == "x" * 1000 + "\n"


# ----------------------------------------------------------------------- 3. write_json


def test_a_results_file_that_cannot_be_written_is_one_output_error(tmp_path):
    path = tmp_path / "results.json"
    path.write_text('{"old": true}\n')
    script = ("import sys\nfrom pathlib import Path\n"
              "from hostir.jobs.preflight import OutputPathError\n"
              "from hostir.jobs.results import write_json\n"
              "try:\n"
              f"    write_json(Path({str(path)!r}), {{'pad': 'x' * 5000}})\n"
              "except OutputPathError as e:\n"
              "    print(e.code, e)\n")
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=60,
                          preexec_fn=_file_limit(1024))
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stdout.startswith(f"{EXIT_OUTPUT} --json {path}: cannot write: File too large"), \
        proc.stdout
    assert path.read_text() == '{"old": true}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]  # no temp left


def test_train_mlp_bench_past_the_file_size_limit_is_one_output_error(tmp_path):
    path = tmp_path / "tp_mlp.json"
    rc, out, err = run("train_mlp", "--device", "cpu", "--bench", "--iters", "1", "--warmup",
                       "0", "--hidden", "64", "--tokens", "64", "--json", str(path),
                       preexec_fn=_file_limit(1024))
    assert rc == EXIT_OUTPUT, err
    assert "Traceback" not in err, err
    assert err.strip().splitlines()[-1].startswith(
        f"[rank 0] hostir train_mlp: error: --json {path}: cannot write: File too large"), err
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------- 4. not a regular file


def test_an_existing_output_that_is_not_a_regular_file_is_refused(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(pf.OutputPathError, match="not a regular file") as e:
        pf.writable_output("--json", str(fifo))
    assert e.value.code == EXIT_OUTPUT
    with pytest.raises(pf.OutputPathError, match="not a regular file"):
        pf.writable_output("--json", str(fifo), directory_ok=True)
    with pytest.raises(pf.OutputPathError, match="not a regular file"):
        write_json(fifo, {"a": 1})
    assert stat.S_ISFIFO(fifo.lstat().st_mode)  # not replaced


def test_a_device_node_is_neither_replaced_nor_appended_to(tmp_path):
    node = tmp_path / "mynull"
    _mknod_null(node)
    with pytest.raises(pf.OutputPathError, match="not a regular file"):
        pf.writable_output("--json", str(node))
    with pytest.raises(pf.OutputPathError, match="not a regular file"):
        write_json(node, {"a": 1})
    with pytest.raises(pf.OutputPathError, match="not a regular file"):
        pipelined_matmul._append_json(str(node), {"a": 1})
    assert stat.S_ISCHR(node.lstat().st_mode)


def test_train_mlp_bench_refuses_a_fifo_before_it_runs(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    rc, out, err = run("train_mlp", "--device", "cpu", "--bench", "--iters", "1", "--warmup",
                       "0", "--hidden", "64", "--tokens", "64", "--json", str(fifo))
    assert rc == EXIT_OUTPUT, err
    assert_one_error_line("train_mlp", err, "exists and is not a regular file")
    assert out == ""  # refused before the run
    assert stat.S_ISFIFO(fifo.lstat().st_mode)


# ----------------------------------------------------------------------- 5. --json ""


def test_an_empty_output_path_is_refused():
    with pytest.raises(pf.OutputPathError, match="an empty path"):
        pf.writable_output("--json", "")
    world = pf.World()
    with pytest.raises(pf.OutputPathError, match="--json: an empty path"):
        pipelined_matmul.validate(parse("pipelined_matmul", "--device", "cpu", "--json", ""),
                                  world)
    with pytest.raises(pf.OutputPathError, match="--json: an empty path"):
        train_mlp.validate(parse("train_mlp", "--device", "cpu", "--bench", "--json", ""), world)
    with pytest.raises(pf.UsageError, match="only --bench writes results"):
        train_transformer.validate(parse("train_transformer", "--device", "cpu", "--json", ""),
                                   world)


# ----------------------------------------------------------------------- 6. NaN in a check


def test_train_mlp_check_fails_on_nan_losses():
    rc, out, err = run("train_mlp", "--device", "cpu", "--lr", "1e30", "--steps", "3",
                       "--hidden", "32", "--tokens", "32", "--check")
    assert "loss nan" in out, out + err
    assert rc == EXIT_CHECK_FAILED, out + err
    assert "check FAIL" in out and "PASS" not in out, out


def test_train_transformer_check_fails_on_nan_losses():
    rc, out, err = run("train_transformer", "--device", "cpu", "--lr", "1e30", "--steps", "2",
                       "--layers", "1", "--hidden", "64", "--heads", "4", "--kv-heads", "2",
                       "--tokens", "32", "--check")
    assert "loss nan" in out, out + err
    assert rc == EXIT_CHECK_FAILED, out + err
    assert "FAIL" in out and "PASS" not in out, out
