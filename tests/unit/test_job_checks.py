"""The jobs' pre-run checks and results naming (hostir.jobs.preflight, hostir.jobs.results),
one process; the whole jobs under mpirun: tests/faults/test_bad_invocations.py."""

import argparse
import os

import pytest

from hostir.jobs import preflight as pf
from hostir.jobs.results import device_slug, results_name, results_path
from hostir.run import EXIT_MEMORY, EXIT_OUTPUT, EXIT_USAGE


def test_shapes_read_mxnxk():
    assert pf.shape_list("8192x4096x1024, 16X8X4") == [(8192, 4096, 1024), (16, 8, 4)]
    for bad in ("8x8", "8x8x0", "8xax8", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            pf.shape_list(bad)


def test_integer_and_float_ranges():
    assert pf.at_least(1)("3") == 3
    with pytest.raises(argparse.ArgumentTypeError, match=">= 1, got 0"):
        pf.at_least(1)("0")
    with pytest.raises(argparse.ArgumentTypeError, match="expected an integer"):
        pf.at_least(0)("1.5")
    assert pf.positive_float("1e-5") == 1e-5
    for bad in ("0", "-1", "inf", "nan", "x"):
        with pytest.raises(argparse.ArgumentTypeError):
            pf.positive_float(bad)
    assert pf.device_name("cuda:3") == "cuda:3"
    with pytest.raises(argparse.ArgumentTypeError):
        pf.device_name("gpu")


def test_the_parser_refuses_with_a_usage_error_not_an_exit():
    p = pf.JobParser()
    p.add_argument("--iters", type=pf.at_least(1))
    with pytest.raises(pf.UsageError, match="argument --iters") as e:
        p.parse_args(["--iters", "0"])
    assert e.value.code == EXIT_USAGE


def test_output_paths(tmp_path):
    target = tmp_path / "new" / "dir" / "run.json"
    assert pf.writable_output("--json", str(target)) == target
    assert target.parent.is_dir() and not target.exists()  # checked, nothing written
    (tmp_path / "file").write_text("x")
    with pytest.raises(pf.OutputPathError, match="is a file, not a directory") as e:
        pf.writable_output("--json", str(tmp_path / "file" / "run.json"))
    assert e.value.code == EXIT_OUTPUT
    with pytest.raises(pf.OutputPathError, match="is a directory"):
        pf.writable_output("--json", str(tmp_path))
    assert pf.writable_output("--json", str(tmp_path), directory_ok=True) == tmp_path
    with pytest.raises(pf.OutputPathError, match="GPU results only"):
        pf.refuse_results_on_cpu("--json", str(pf.RESULTS_DIR / "x.json"), "cpu")
    pf.refuse_results_on_cpu("--json", str(pf.RESULTS_DIR / "x.json"), "cuda")
    pf.refuse_results_on_cpu("--json", str(tmp_path / "x.json"), "cpu")


def test_memory_estimates_are_checked_against_what_is_free():
    free = pf.host_memory_available()
    assert free > 0
    pf.check_fits("small", 1 << 20, "cpu", pf.World())
    with pytest.raises(pf.MemoryEstimateError, match="GiB per rank") as e:
        pf.check_fits("huge", 4 * free, "cpu", pf.World())
    assert e.value.code == EXIT_MEMORY
    # ranks of one host share it
    with pytest.raises(pf.MemoryEstimateError, match="shared by 4 ranks"):
        pf.check_fits("half", 0.5 * free, "cpu", pf.World(local_size=4))


def test_train_transformer_refuses_a_model_that_cannot_fit():
    from hostir.jobs import train_transformer as job

    small = job.parse(["--device=cpu"])
    job.validate(small, 2)  # the default config fits anywhere
    assert 0 < job.estimated_bytes(small, 2) < job.estimated_bytes(small, 1) < 1 << 30
    # more layers, tokens or checks only ever need more
    for flags in (["--layers=4"], ["--tokens=256"], ["--check"]):
        assert job.estimated_bytes(job.parse(["--device=cpu"] + flags), 2) > \
            job.estimated_bytes(small, 2)
    huge = job.parse(["--device=cpu", "--hidden=65536", "--heads=64", "--kv-heads=8",
                      "--tokens=65536", "--layers=64"])
    with pytest.raises(pf.MemoryEstimateError, match="--layers 64 --hidden 65536") as e:
        job.validate(huge, 2)
    assert e.value.code == EXIT_MEMORY


def test_missing_packages_say_how_to_install_them():
    with pytest.raises(pf.MissingDependencyError, match="pip install no-such-pkg"):
        pf.need_module("no_such_module_hostir", "no-such-pkg", "--flag")
    pf.need_module("json", "json", "--flag")


def test_one_device_spelling_in_results_names(tmp_path):
    assert device_slug("NVIDIA H200") == "nvidia-h200"
    assert device_slug("NVIDIA H100 80GB HBM3") == "nvidia-h100"
    assert device_slug("NVIDIA H100 NVL") == "nvidia-h100-nvl"
    assert results_name("pipelined_matmul", "NVIDIA H200", 8) == "pipelined_matmul_nvidia-h200_x8.json"
    assert results_name("matmul", "NVIDIA H200") == "matmul_nvidia-h200.json"
    assert results_path(str(tmp_path), "tp_mlp", "cpu", 2) == tmp_path / "tp_mlp_cpu_x2.json"
    assert results_path(str(tmp_path / "d") + os.sep, "m", "cpu") == tmp_path / "d" / "m_cpu.json"
    assert results_path(str(tmp_path / "f.json"), "m", "cpu") == tmp_path / "f.json"


def test_one_process_is_a_world_of_one(monkeypatch):
    for var in pf._MPI_LAUNCHED + ("TORCHELASTIC_RUN_ID", "RANK", "MASTER_ADDR"):
        monkeypatch.delenv(var, raising=False)
    world = pf.launch_world()
    assert (world.rank, world.size, world.comm) == (0, 1, None)
    problem = pf.UsageError("x")
    assert pf.agree(problem, world) is problem and pf.agree(None, world) is None


def test_a_failed_bench_variant_is_one_line_naming_its_root_cause():
    from hostir.jobs.train_transformer import failure_text

    try:
        try:
            raise ValueError("fake tensor call failed\nat line 2")
        except ValueError as inner:
            raise RuntimeError("compile failed") from inner
    except RuntimeError as e:
        text = failure_text(e)
    assert text == "RuntimeError: compile failed; ValueError: fake tensor call failed"
    assert failure_text(KeyError("k")) == "KeyError: 'k'"
    assert failure_text(RuntimeError("")) == "RuntimeError: "
