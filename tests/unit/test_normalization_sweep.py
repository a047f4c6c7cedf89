"""The normalization planner against the measured H200 sweep (no GPU needed).

benchmarks/results/layer_norm_nvidia-h200_sweep_0344c81.json (commit 0344c81, 8192 rows,
fp16, the reference fusion: 999 plans, with the cp.async ring, the 1-D tensors through L2
or partly staged, the L2 hints, the packed row slice, bulk rows, and the 16-bit pair adds
of the prologue in every kernel) holds, per hidden size, the time of every candidate plan.
For each size the plan `plan_launch` picks must be one of them and within TOLERANCE of the
fastest: the rules in lowering/kernels/normalization.py cite these numbers, and a
change to them that loses measured bandwidth fails here.
"""

from __future__ import annotations

import collections
import json
import pathlib

import pytest

from lowering.kernels.normalization import NormalizationSpec

RESULTS = pathlib.Path(__file__).resolve().parents[2] / "benchmarks/results/layer_norm_nvidia-h200_sweep_0344c81.json"
# Time over the best measured time at the size. In this sweep the planner's choices sit at
# 1.000-1.050x, and `benchmarks/sweep_rules.py --fit` finds no setting of the rules with a
# better worst size (the current one is the fit: worst 1.050x at 4096, where the packed
# one-stage twin of the chosen plan ran 1.05x faster; 1600 1.045x, 12288 1.041x, a bulk
# plan with the tensors in shared memory). The same plan timed in two sweeps differs by a
# few percent (the chosen 4096 plan: 0.867 of copy in ffa45e6's sweep, same kernel, 0.876
# here), so the
# tolerance is 5.5%: what it catches is a rule that picks the wrong family of plan (the
# rules before 75f9994's re-derivation: 1.07-1.20x at 2560, 5140, 12288, 20480).
TOLERANCE = 1.055
# Sizes whose pick this sweep did not time, with the reason (and the test that holds the
# pick to its own measurement instead).
EXCEPTIONS: dict[int, str] = {
    20480: "the pick (tensors in shared memory, x prefetched into registers) joined the "
           "candidates after this sweep, when the register estimate of that family was "
           "refitted: test_20480_pick_is_the_fastest_side_by_side",
}
PROBE = RESULTS.parent / "norm_shared_prefetch_probe_nvidia-h200.json"


def _sweep():
    data = json.loads(RESULTS.read_text())
    by_size = collections.defaultdict(dict)
    for entry in data["sweep"]:
        if "us" in entry and not entry.get("error"):
            by_size[entry["hidden"]][entry["describe"]] = entry
    return data, dict(by_size)


DATA, SWEEP = _sweep()


def test_sweep_covers_every_benchmark_size():
    assert sorted(SWEEP) == sorted(r["hidden"] for r in DATA["results"])
    assert DATA["dtype"] == "float16" and DATA["rows"] == 8192


@pytest.mark.parametrize("hidden", sorted(SWEEP))
def test_planner_choice_was_measured_and_is_near_the_best(hidden):
    if hidden in EXCEPTIONS:
        pytest.skip(EXCEPTIONS[hidden])
    plan = NormalizationSpec.reference_fusion(DATA["rows"], hidden, dtype=DATA["dtype"]).plan
    entries = SWEEP[hidden]
    assert plan.describe() in entries, (hidden, plan.describe(), sorted(entries))
    entry = entries[plan.describe()]
    # the describe string pins the geometry: check the fields too
    for field in ("threads_per_row", "batch", "rows_per_block", "vector_width",
                  "param_cache", "prefetch", "x_staged", "stages", "one_pass"):
        assert getattr(plan, field) == entry[field], (hidden, field)
    assert entry["spill_bytes"] == 0
    best = min(entries.values(), key=lambda e: e["us"])
    ratio = entry["us"] / best["us"]
    assert ratio <= TOLERANCE, (
        f"hidden={hidden}: {plan.describe()} {entry['us']} us is {ratio:.3f}x the best, "
        f"{best['describe']} {best['us']} us")


def test_20480_pick_is_the_fastest_side_by_side():
    """At 20480 the pick is the shared-tensor plan with x prefetched into registers,
    timed side by side with the previous pick (``global+s4``, this sweep's best) and
    copy_ in benchmarks/results/norm_shared_prefetch_probe_nvidia-h200.json: the
    fastest there, and by more than the few percent two timings of a plan differ."""
    probe = json.loads(PROBE.read_text())
    row = next(r for r in probe["results"] if r["hidden"] == 20480)
    plan = NormalizationSpec.reference_fusion(8192, 20480).plan
    timed = row["plans"][plan.describe()]
    assert timed["spill_bytes"] == 0
    assert timed["us"] == min(p["us"] for p in row["plans"].values() if "us" in p)
    assert row["plans"]["heuristic"]["us"] / timed["us"] > 1.03  # global+s4 then
    best_before = min(SWEEP[20480].values(), key=lambda e: e["us"])
    assert best_before["describe"] == "persistent/global+s4 t640 b4 v8 r1 prefetch/smem"
