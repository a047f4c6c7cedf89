"""docs/PERFORMANCE.md is generated from benchmarks/results/ by `python -m benchmarks.report`:
the committed page must be what the script makes of the committed results (so figures in
the docs cannot drift from the evidence), every results file must be named
``<bench>_<device>[_x<N>].json``, and the script must cope with files it has no renderer
for, with files of a known bench whose format moved on, and with no results at all."""

from __future__ import annotations

import json

import pytest

from benchmarks import report


def test_committed_page_is_what_the_results_generate():
    assert report.PAGE.read_text() == report.generate(report.RESULTS), (
        "docs/PERFORMANCE.md is stale: run python -m benchmarks.report")


def test_every_results_file_is_named_bench_device_gpus():
    assert report.misnamed(report.RESULTS) == []
    assert list(report.RESULTS.glob("*.json")), "no official results files"


@pytest.mark.parametrize("name, expected", [
    ("tp_mlp_nvidia-h200_x2.json", ("tp_mlp", "nvidia-h200", 2)),
    ("matmul_shapes_nvidia-h100.json", ("matmul_shapes", "nvidia-h100", 1)),
    ("tp_mlp_gelu_tanh_nvidia-h200_x8.json", ("tp_mlp_gelu_tanh", "nvidia-h200", 8)),
])
def test_names_split_into_bench_device_and_gpus(name, expected):
    parsed = report.parse_name(name)
    assert (parsed["bench"], parsed["device"], parsed["gpus"]) == expected


@pytest.mark.parametrize("name", [
    "matmul_NVIDIA_H200.json", "layer_norm_nvidia-h200_run2_eaea0d6.json",
    "faults_h200.json", "layer_norm_nvidia-h200_x0.json", "notes.txt"])
def test_superseded_spellings_are_refused(name):
    assert report.parse_name(name) is None


def test_unknown_bench_gets_generic_tables(tmp_path, capsys):
    rows = [{"shape": "4096x4096x4096", "ours_tflops": 612.25, "cublas_tflops": 640.5,
             "ratio": 0.9559}, {"shape": "8192x1024x8192", "ours_tflops": 580.0,
                                "cublas_tflops": 601.0, "ratio": 0.965}]
    (tmp_path / "matmul_shapes_nvidia-h100.json").write_text(json.dumps(
        {"device": "NVIDIA H100 80GB HBM3", "date": "2026-12-01", "commit": "abc1234",
         "dtype": "bfloat16", "results": rows,
         "summary": {"shapes": 2, "at_least_0.90": 2, "fp16": {"shapes": 1, "ratio_min": 0.5}}}))
    (tmp_path / "transformer_layer_nvidia-h200_x2.json").write_text(json.dumps(
        [{"config": "h4096", "ours_ms": 3.5, "eager_ms": 4.25, "compile_ms": 3.75}]))
    (tmp_path / "layer_norm_nvidia-h200.json").write_text(json.dumps(
        {"date": "2026-12-02", "results": "not rows"}))  # a known bench, format moved on
    (tmp_path / "broken_nvidia-h200.json").write_text("{not json")
    text = report.generate(tmp_path)
    assert "## matmul_shapes (nvidia-h100)" in text
    assert "Source `benchmarks/results/matmul_shapes_nvidia-h100.json` · device NVIDIA H100 " \
           "80GB HBM3 · date 2026-12-01 · commit abc1234." in text
    assert "| shape | ours_tflops | cublas_tflops | ratio |" in text
    assert "| 4096x4096x4096 | 612.2 | 640.5 | 0.956 |" in text
    assert "Setup: dtype bfloat16." in text
    # a summary with a part per dtype: the part's fields named part.field
    assert "| at_least_0.90 | 2 |" in text and "| fp16.shapes | 1 |" in text
    assert "| fp16.ratio_min | 0.500 |" in text
    assert "## transformer_layer (nvidia-h200 × 2)" in text
    assert "| h4096 | 3.500 | 4.250 | 3.750 |" in text
    assert "## layer_norm (nvidia-h200)" in text and "commit unknown" in text
    assert "Could not read `broken_nvidia-h200.json`" in text
    # the known benches come first, in their order; the rest by name
    assert text.index("## layer_norm") < text.index("## broken") < text.index("## matmul_shapes")

    out = tmp_path / "docs" / "PERFORMANCE.md"
    assert report.main(["--results", str(tmp_path), "--out", str(out)]) == 0
    assert out.read_text() == text
    assert report.main(["--results", str(tmp_path), "--out", str(out), "--check"]) == 0
    out.write_text(text + "edited by hand\n")
    assert report.main(["--results", str(tmp_path), "--out", str(out), "--check"]) == 1
    assert "is stale" in capsys.readouterr().err


def test_misnamed_file_fails_the_check(tmp_path, capsys):
    (tmp_path / "matmul_NVIDIA_H200.json").write_text(json.dumps({"results": []}))
    out = tmp_path / "PERFORMANCE.md"
    out.write_text(report.generate(tmp_path))
    assert report.main(["--results", str(tmp_path), "--out", str(out), "--check"]) == 1
    assert "matmul_NVIDIA_H200.json is not named" in capsys.readouterr().err


def test_no_results_directory(tmp_path):
    text = report.generate(tmp_path / "missing")
    assert text.startswith("# Performance") and "No results files yet." in text


def test_long_generic_tables_say_what_was_left_out(tmp_path):
    rows = [{"hidden": 256 * (i + 1), "kind": "layer_norm", "over_copy": 0.9} for i in range(45)]
    (tmp_path / "norm_widths_nvidia-h200.json").write_text(json.dumps({"results": rows}))
    text = report.generate(tmp_path)
    assert f"| {256 * report.MAX_ROWS} | layer_norm | 0.900 |" in text
    assert f"| {256 * (report.MAX_ROWS + 1)} |" not in text
    assert f"({45 - report.MAX_ROWS} more rows in the file.)" in text


def test_dumps_page_lists_every_switch_the_code_knows():
    """docs/DUMPS.md names every value of HOSTIR_DUMP, HOSTIR_ENABLE and HOSTIR_DISABLE
    that hostir.options accepts, and none it refuses."""
    import re

    from hostir import options

    page = (report.ROOT / "docs" / "DUMPS.md").read_text()
    documented = {
        "HOSTIR_DUMP": set(re.findall(r"^\| `(\w+)` \|", page.split("## Switches")[0], re.M)),
        "HOSTIR_ENABLE": set(re.findall(r"`HOSTIR_ENABLE=(\w+)`", page)),
        "HOSTIR_DISABLE": set(re.findall(r"`HOSTIR_DISABLE=(\w+)`", page)),
    }
    assert documented["HOSTIR_DUMP"] == set(options.DUMP_OPTIONS)
    assert documented["HOSTIR_ENABLE"] == set(options.ENABLE_OPTIONS)
    assert documented["HOSTIR_DISABLE"] == set(options.DISABLE_OPTIONS)
