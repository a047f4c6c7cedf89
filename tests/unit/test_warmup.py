"""`python -m hostir.run warmup`: kernels compiled ahead of time land in the disk cache,
where a later process finds every one of them without compiling (no GPU needed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("cupy")

ROOT = Path(__file__).resolve().parents[2]


def _run(tmp_path, *argv):
    env = {"PYTHONPATH": str(ROOT), "HOSTIR_CACHE_DIR": str(tmp_path / "cache"),
           "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-m", "hostir.run", "warmup", *argv], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)


def test_warmup_fills_the_cache_a_later_process_reads(tmp_path, monkeypatch):
    from lowering.kernels import rotary
    from lowering.kernels.seams import every_variant, render
    from runtime import jit

    rotaries = rotary.every_variant(128, "bf16")  # the default --head-dim
    n = len({render(s) for s in every_variant(768, "bf16")}) + len(rotaries)
    done = _run(tmp_path, "train_transformer", "--hidden", "768", "--workers", "2")
    assert done.returncode == 0, done.stderr
    assert f"{n} of {n} kernels" in done.stdout
    assert f"{n}/{n} kernels" in done.stderr  # the progress bar's last line

    monkeypatch.setattr(jit, "compile", lambda *a, **k: pytest.fail("compiled again"))
    cache = jit.KernelCache(tmp_path / "cache" / "kernels")  # where the warmup process wrote
    for spec in every_variant(768, "bf16"):
        cache.get(render(spec), [spec.kernel_name], "sm_90")
    for spec in rotaries:
        cache.get(rotary.render(spec), [spec.kernel_name], "sm_90")
    assert cache.stats.compiles == 0 and cache.stats.disk_hits == n

    again = _run(tmp_path, "train_transformer", "--hidden", "768")
    assert again.returncode == 0 and f"{n} of {n} kernels" in again.stdout


def test_precompile_reports_a_kernel_that_does_not_compile(tmp_path, monkeypatch):
    from runtime import jit

    monkeypatch.setattr(jit, "_CACHE", jit.KernelCache(tmp_path / "kernels"))
    good = 'extern "C" __global__ void k(float* x) { x[threadIdx.x] = 1.f; }'
    bad = 'extern "C" __global__ void k(float* x) { x[threadIdx.x] = undefined_name; }'
    seen = []
    errors = jit.precompile([(good, ["k"], "sm_90"), (bad, ["k"], "sm_90")], workers=2,
                            progress=lambda d, t: seen.append((d, t)))
    assert errors[0] is None and "undefined_name" in errors[1]
    assert seen[-1] == (2, 2)


@pytest.mark.parametrize("argv,message", [
    (["matmul"], "needs --shapes"),
    (["rms_norm", "--hidden", "12,x"], "comma-separated integers"),
    (["layer_norm", "--arch", "hopper"], "expected sm_XY"),
    (["nothing"], "invalid choice"),
])
def test_warmup_refusals_are_one_line(tmp_path, argv, message):
    done = _run(tmp_path, *argv)
    assert done.returncode == 2
    lines = [l for l in done.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and "hostir warmup: error:" in lines[0] and message in lines[0]


def test_norm_warmup_compiles_the_kernels_the_calls_run():
    """The warmup's normalization kernels are those `runtime.normalization`'s calls
    build (this machine's model: SM90's without a GPU); a GPU model that picks the same
    plan names the same kernel (one source, one cache entry), another plan another."""
    import dataclasses

    from hostir.jobs.warmup import norm_units
    from lowering.kernels.normalization import SM90, NormalizationSpec, render_normalization
    from runtime import normalization as rn

    units = norm_units("layer_norm", [4096, 5140], "bfloat16", "sm_90")
    for (source, names, arch), hidden in zip(units, (4096, 5140)):
        call = rn.call_spec("layer_norm", 300, hidden, 1e-5, "bfloat16", 16, -1)
        assert source == render_normalization(call) and names == [call.kernel_name]
    h100 = dataclasses.replace(SM90, bandwidth=3.352e12)  # its clocks' figure, not SM90's
    a = NormalizationSpec.rms_norm(8192, 4096, dtype="bfloat16", hardware=h100)
    b = NormalizationSpec.rms_norm(64, 4096, dtype="bfloat16")
    assert a.plan == b.plan and a.kernel_name == b.kernel_name
    assert render_normalization(a) == render_normalization(b)
    other = dataclasses.replace(b, threads_per_row=256)
    assert other.plan != b.plan and other.kernel_name != b.kernel_name


def test_the_seam_kernels_are_planned_for_this_machines_gpu(monkeypatch):
    """The norm backward's stages follow the GPU's bandwidth, so `train_transformer`
    plans its seam kernels with this machine's model (an H200's here): a cache warmed
    with the H100's would miss them."""
    from hostir.jobs import warmup
    from lowering.kernels import seams as S

    h200 = S.Hardware(dram_bytes_per_s=4.8e12)
    monkeypatch.setattr(warmup, "seam_hardware", lambda: h200)
    names = {n for _, ns, _ in warmup.transformer_units([2560], 0, 1, "bfloat16", "sm_90")
             for n in ns}
    for kind in S.NORM_KINDS:
        for dh in (False, True):
            assert S.AddNormBackwardSpec(kind, "bf16", 2560, dh, 16, h200).kernel_name in names
    h100 = S.AddNormBackwardSpec("rms_norm", "bf16", 2560, False, 16, S.SM90).kernel_name
    assert h100 not in names
    monkeypatch.undo()
    import torch

    if not torch.cuda.is_available():  # without a GPU: the H100's model
        assert warmup.seam_hardware() == S.SM90
