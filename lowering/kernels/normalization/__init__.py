"""Row-wise normalization (layer norm, RMS norm) with fused pointwise ops -> CUDA C++.

A `NormalizationSpec` describes one fusion over ``x[rows, hidden]``:

    prologue ops (adds of 1-D tensors broadcast over rows, casts that round)
    -> layer_norm (weight, bias, eps) or rms_norm (weight, eps), in fp32
    -> epilogue ops (same kinds) -> cast to the output dtype

and `render_normalization(spec)` turns it into one **persistent** kernel: each thread
keeps its slice of a row in registers (the "persistent batch"), so the input is read
once and the output written once, whatever the prologue. The mean and the variance
are computed in two passes over those registers (exact enough for rows with a large
mean, unlike E[x^2] - E[x]^2), each reduced by warp shuffles and, when a row spans
several warps, one shared-memory exchange.

The kernel is persistent in the launch sense too: its grid is the blocks resident on
the device at once (SMs x blocks per SM), each block loops over groups of rows, and
each thread loads its slice of the 1-D tensors once, before that loop, into packed
registers (or its block stages them in shared memory: where they do not fit, and where
the registers they free are worth more, see `choose_persistent`), so the
row loop reads only x and writes only y; the next row's x is prefetched while the
current one is reduced. `LaunchPlan` says which variant; ``param_cache="none"`` is
the row-wise kernel (a block per group of rows, tensors re-read every row), which the
heuristic gives rows one warp covers (768 and 1024 at fp16: measured as fast) and plain
norms' aligned 16-bit rows while an SM holds two blocks of 1024+ threads of it
(`planner._plain_rowwise`: their weight and bias cost L1/L2 little).

Example (the fusion of the nvFuser report):
    >>> spec = NormalizationSpec.reference_fusion(rows=8192, hidden=5140)
    >>> plan = spec.plan
    >>> (plan.vector_width, plan.threads_per_row % 32)
    (4, 0)
    >>> source = render_normalization(spec)
    >>> "#pragma unroll 1" in source
    True

Plain 16-bit norms whose rows are not 16-byte aligned, aligned layer norms from 2K
values (and shorter ones the row-wise plan pads), and aligned RMS norms past 8K that the
row-wise rule declines, run the *envelope* kernel (``LaunchPlan.envelope``): the row-wise
kernel over the row's aligned 16-byte granules held as raw 16-bit values
(`planner._envelope_rowwise`). Rows the registers cannot hold (wider than 1024 threads x
32 values, up to 131072 and beyond) and other rows that are not 16-byte aligned run the
*shared-row* kernel
(``LaunchPlan.shared_row``): one row a block at a time, the row of x in shared memory as
16-byte chunks (registers past 227 KiB), refilled with the block's next row as each chunk
is read; the planner's model (`plan.Hardware`, `planner.choose_shared_row`,
`planner.prefers_shared_row`) also gives it aligned rows whose register plans starve the
SM. See docs/KERNELS.md.

The package, by concern: `spec` (the ops, the spec and its text form), `plan` (the
launch plan record and the hardware limits), `candidates` (the plans a row allows and
their cost: a model of the hardware), `planner` (the heuristic: `plan_launch` and
`choose_persistent`, each rule saying why in a comment), `tuning` (the autotuner's
candidates), `templates` (the CUDA snippet tables) and `renderer`. The names importers
use are re-exported here.
"""

from lowering.kernels.normalization.candidates import (
    CANDIDATE_STAGES, MAX_SHARED_ROW_SLOTS, PERSISTENT_OVERHEAD, SHARED_ROW_REGISTERS, bulk_ok,
    bytes_in_flight, candidate_plans, padding, persistent_candidates,
    persistent_register_estimate, register_estimate, row_chunks, shared_row_blocks,
    shared_row_candidates, shared_row_register_estimate, vector_width_for,
)
from lowering.kernels.normalization.plan import (
    DEFAULT_SM_COUNT, L2_HINTS, MAX_BLOCKS_PER_SM, MAX_REGISTERS_PER_THREAD, MAX_STAGES,
    MAX_THREADS_PER_BLOCK, MAX_THREADS_PER_SM, MAX_VALUES_PER_THREAD, MIN_THREADS_PER_BLOCK,
    PARAM_CACHES, REGISTERS_PER_SM, SHARED_PER_BLOCK, SHARED_PER_SM, SM90, WARP, Hardware,
    LaunchPlan,
)
from lowering.kernels.normalization.planner import (
    CACHE_ORDER, FLIGHT_STEP, IN_FLIGHT_TARGET, MAX_ENVELOPE_CHUNKS, MAX_EXTRA_PADDING,
    RULE_GRID, RULES, SHARED_ROW_MIN_HIDDEN, SHARED_ROW_THREADS_PER_SM, STAGED_MIN_VALUES,
    PlannerRules, choose_persistent, choose_shared_row, envelope_candidates, hint_variants,
    plan_launch, prefers_shared_row, rank_envelope,
)
from lowering.kernels.normalization.renderer import (
    SWITCH_FIELDS, EnvelopeRenderer, NormalizationRenderer, PersistentRenderer,
    SharedRowRenderer, nvrtc_options, render_normalization,
)
from lowering.kernels.normalization.spec import (
    DTYPE_BYTES, HALF_DTYPES, PLAN_FIELDS, AddBroadcast, Cast, LayerNorm, NormalizationSpec,
    PointwiseOp, RmsNorm, spec_from_params, spec_params, spec_with_plan,
)
from lowering.kernels.normalization.templates import (
    CUDA_TYPES, FROM_FLOAT, SHARED_ROW_SNIPPETS, SNIPPETS, TO_FLOAT,
)
from lowering.kernels.normalization.tuning import PROMISE_STEPS, tune_plans
