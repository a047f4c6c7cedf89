"""The shape and width benches' fp16 rows and their summaries (no GPU: the row lists and
the summaries of made-up rows)."""

from benchmarks.matmul_shapes import BENCH_SHAPES, fp16_shapes, shapes
from benchmarks.matmul_shapes import summarize as shapes_summary
from benchmarks.norm_widths import FP16_WIDTHS
from benchmarks.norm_widths import summarize as widths_summary


def test_the_shapes_bench_times_a_third_of_its_drawn_shapes_and_the_bench_s_in_fp16_too():
    drawn = shapes()[:-len(BENCH_SHAPES)]
    assert fp16_shapes() == drawn[::3] + BENCH_SHAPES and len(fp16_shapes()) == 20
    rows = [{"shape": "1x1x1", "dtype": "bf16", "ratio": 0.95},
            {"shape": "1x1x1", "dtype": "fp16", "ratio": 0.85, "fallback": "cublas"},
            {"shape": "2x2x2", "dtype": "fp16", "error": "ValueError: no"}]
    summary = shapes_summary(rows)
    assert (summary["shapes"], summary["measured"], summary["at_least_0.90"]) == (1, 1, 1)
    assert summary["fp16"] == {"shapes": 2, "measured": 1, "ratio_min": 0.85,
                               "ratio_median": 0.85, "at_least_0.90": 0,
                               "cublas_fallbacks": 1}
    assert "fp16" not in shapes_summary(rows[:1])


def test_the_widths_bench_counts_each_dtype_apart_and_odd_widths_against_0_85():
    assert 512 in FP16_WIDTHS and 65535 in FP16_WIDTHS
    assert sum(w % 8 != 0 for w in FP16_WIDTHS) == 5
    rows = [{"hidden": 4096, "kind": "rms_norm forward", "dtype": "bf16", "over_copy": 0.91},
            {"hidden": 4097, "kind": "rms_norm forward", "dtype": "bf16", "over_copy": 0.86},
            {"hidden": 100, "kind": "rms_norm forward", "dtype": "bf16", "over_copy": 0.5},
            {"hidden": 4096, "kind": "layer_norm forward", "dtype": "fp16", "over_copy": 0.89},
            {"hidden": 4097, "kind": "layer_norm backward", "dtype": "fp16",
             "error": "AssertionError: relative error"}]
    summary = widths_summary(rows)
    assert (summary["measured"], summary["aligned_at_least_0.90"],
            summary["odd_at_least_0.85"], summary["odd_measured"]) == (3, 1, 1, 1)
    assert summary["fp16"] == {"rows": 2, "measured": 1, "failed": 1,
                               "aligned_at_least_0.90": 0, "aligned_measured": 1,
                               "odd_at_least_0.85": 0, "odd_measured": 0}
