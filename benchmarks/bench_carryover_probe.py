"""Does a slow column slow its neighbours? The layer_norm bench times its columns side by
side, the eager torch fusion (16x the others' time, ~140 ms a replay at 20480) among
them. At 20480 two columns running the same kernel read 175 and 179 us
(layer_norm_nvidia-h200_untuned_20480_16384_7c2f670.json), where without the torch
columns four such columns read 173.5-173.9 (norm_twin_columns_probe_nvidia-h200.json).

This times, per size, the heuristic's kernel in two columns (``a``, ``b``) and copy_,
side by side: alone; with the eager torch fusion as a fourth column; and with
``torch_layer_norm``; in carryover-balanced rounds (`runtime.autotune.balanced_rounds`).

    python benchmarks/bench_carryover_probe.py --hidden 20480,5140 --out probe.json
"""

from __future__ import annotations

import functools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    import torch
    import torch.nn.functional as F

    from probe_common import parser, write_results
    from hostir.jobs.layer_norm import ROTATE_BYTES, make_inputs, torch_fused
    from lowering.kernels.normalization import NormalizationSpec
    from runtime import normalization as rn
    from runtime.autotune import graph_side_by_side

    a = parser("20480,5140", __doc__, reps=16).parse_args()
    res = []
    for hidden in (int(h) for h in a.hidden.split(",")):
        spec = NormalizationSpec.reference_fusion(a.rows, hidden, 1e-5)
        sets = max(2, -(-ROTATE_BYTES // spec.bytes_moved()))
        ins = [make_inputs(a.rows, hidden) for _ in range(sets)]
        outs = [torch.empty_like(i[0]) for i in ins]
        named = lambda i: {"x": i[0], "b0": i[1], "b1": i[2], "weight": i[3], "bias": i[4]}  # noqa: E731
        ours = [functools.partial(rn.normalize, spec, named(i), o) for i, o in zip(ins, outs)]
        base = {"a": ours, "b": list(ours), "copy": [lambda i=i, o=o: o.copy_(i[0])
                                                     for i, o in zip(ins, outs)]}
        extra = {"torch_fused": [lambda i=i: torch_fused(*i, 1e-5) for i in ins],
                 "torch_layer_norm": [lambda i=i: F.layer_norm(i[0], (hidden,), i[3], i[4], 1e-5)
                                      for i in ins]}
        row = {"hidden": hidden}
        for name, cands in (("alone", base), ("with_torch_fused", {**base, "torch_fused": extra["torch_fused"]}),
                            ("with_torch_layer_norm", {**base, "torch_layer_norm": extra["torch_layer_norm"]}),
                            ("alone_again", base)):
            us = graph_side_by_side(cands, a.reps)
            over = {k: round(spec.bytes_moved() / (us[k] * 1e-6) / (4 * a.rows * hidden / (us["copy"] * 1e-6)), 3)
                    for k in ("a", "b")}
            row[name] = {"us": {k: round(v, 2) for k, v in us.items()}, "over_copy": over}
            print(hidden, name, row[name], flush=True)
        res.append(row)
        del ins, outs, ours, base, extra
        torch.cuda.empty_cache()
    write_results(a.out, a.rows, a.reps, res)


if __name__ == "__main__":
    main()
