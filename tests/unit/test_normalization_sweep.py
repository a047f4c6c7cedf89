"""The normalization planner's pick is always among the plans the layer_norm bench sweeps.

`python -m hostir.run layer_norm --bench` times, at each of its sizes, the heuristic's plan
side by side with every candidate plan of the sweep (`hostir.jobs.layer_norm.sweep_specs`):
that is how the planner's rules are judged against measured bandwidth. If the planner picked
a plan outside that set, the bench could no longer say whether a rival is faster. So, at
every benchmark size, the pick is one of the swept plans (the same geometry, field by field)
and appears once, and no two swept plans describe alike.
"""

from __future__ import annotations

import pytest

from hostir.jobs.layer_norm import HIDDEN, sweep_specs
from lowering.kernels.normalization import NormalizationSpec

ROWS = 8192
GEOMETRY = ("threads_per_row", "batch", "rows_per_block", "vector_width", "param_cache",
            "prefetch", "x_staged", "stages", "one_pass")


@pytest.mark.parametrize("hidden", HIDDEN)
def test_planner_pick_is_among_the_swept_plans(hidden):
    spec = NormalizationSpec.reference_fusion(ROWS, hidden)
    swept = [s.plan for s in sweep_specs(spec)]
    assert len(swept) > 1, "the sweep must time rivals beside the pick"
    matches = [p for p in swept if p.describe() == spec.plan.describe()]
    assert len(matches) == 1, (hidden, spec.plan.describe(), len(matches))
    for field in GEOMETRY:
        assert getattr(matches[0], field) == getattr(spec.plan, field), (hidden, field)


@pytest.mark.parametrize("hidden", HIDDEN)
def test_swept_plans_are_distinct(hidden):
    """Each swept plan is timed once: two plans that describe alike would be one column
    measured twice and another not at all."""
    spec = NormalizationSpec.reference_fusion(ROWS, hidden)
    described = [s.plan.describe() for s in sweep_specs(spec)]
    assert len(described) == len(set(described)), hidden
