"""runtime.fused's launch records, without a GPU: the launch a call takes from a warm
record cache is the one a cold cache builds for it (spec, kernel, grid, block, shared
memory, dependent flag, arguments), each as its spec and plan say; a new alignment or
width gets a record of its own; a steady call builds no spec and loads no kernel."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from lowering.kernels import rotary as R
from lowering.kernels import seams as S
from runtime import fused, rotary

SMS = 4
BF, HALF = torch.bfloat16, torch.float16


@dataclasses.dataclass
class _Kernel:
    """A loaded kernel stand-in: the spec and renderer it was loaded from."""

    spec: object
    render: object

    def ensure_smem(self, nbytes):
        pass


def _resident(kernel, threads, smem=0):
    """Driver occupancy stand-in that depends on the block and its shared memory."""
    return max(1, min(8, 2048 // threads) - smem // 65536)


class _Launches(list):
    """(record, grid, args) of each launch; ``loads``: the specs of kernel loads."""

    def __init__(self):
        super().__init__()
        self.loads = []


@pytest.fixture
def launches(monkeypatch):
    """What runtime.fused launches, its records built for a device of `SMS` SMs (sm_90
    hardware, dependent launches on)."""
    got = _Launches()

    def kernel(spec, index, render=None):
        got.loads.append(spec)
        return _Kernel(spec, render)

    monkeypatch.setattr(fused, "_RECORDS", {})
    monkeypatch.setattr(fused, "_launch", lambda *each: got.extend(each))
    monkeypatch.setattr(fused, "_kernel", kernel)
    monkeypatch.setattr(fused, "_resident_blocks", _resident)
    monkeypatch.setattr(fused, "_active_clusters", lambda kernel, cluster, threads, smem: 0)
    monkeypatch.setattr(fused, "_sm_count", lambda index: SMS)
    monkeypatch.setattr(fused, "device_hardware", lambda index: S.SM90)
    monkeypatch.setattr(fused, "_dependent_launch", lambda index: True)
    return got


def _t(shape, dtype=BF, offset=0):
    """A CPU tensor of ``shape`` whose base address is ``offset`` elements past a 64-byte
    aligned allocation."""
    n = int(np.prod(shape))
    return torch.randn(n + offset).to(dtype)[offset:].view(shape)


def _p(t):
    return 0 if t is None else t.data_ptr()


def _stats(rows):
    return torch.empty(rows, dtype=torch.float32)


def _forward(rows, hidden, kind="rms_norm", residual=True, bias=False, dtype=BF, offset=0,
             threads=fused.FORWARD_THREADS_PER_SM):
    x = _t((rows, hidden), dtype, offset)
    r = _t((rows, hidden), dtype) if residual else None
    b = _t((hidden,), dtype) if bias else None
    return lambda: fused.add_norm_forward_fused(x, r, _t((hidden,), dtype), b, 1e-6, kind,
                                                threads_per_sm=threads)


def _backward(rows, hidden, kind="rms_norm", dh=True, dtype=BF, offset=0,
              threads=fused.BACKWARD_THREADS_PER_SM):
    dy, h = _t((rows, hidden), dtype, offset), _t((rows, hidden), dtype)
    g = _t((rows, hidden), dtype) if dh else None
    mean = _stats(rows) if kind == "layer_norm" else None
    return lambda: fused.add_norm_backward_fused(dy, h, _t((hidden,), dtype), mean,
                                                 _stats(rows), kind, g,
                                                 threads_per_sm=threads)


def _elementwise(op, n, dtype=BF, offset=0):
    nin, nout = S.ELEMENTWISE_OPS[op]
    ins = tuple(_t((n,), dtype, offset if i == 0 else 0) for i in range(nin))
    return lambda: fused._elementwise(op, ins, tuple(_t((n,), dtype) for _ in range(nout)))


def _rows(op, rows, width, pitch, dtype=BF):
    nin, nout = S.ELEMENTWISE_OPS[op]
    ins = tuple(_t((rows, pitch), dtype)[:, :width] for _ in range(nin))
    return lambda: fused._elementwise_rows(op, ins,
                                           tuple(_t((rows, width), dtype) for _ in range(nout)))


def _rotary(backward, t, hq, hkv, d, pad=0, dtype=BF):
    width = (hq + 2 * hkv) * d
    fused_t = _t((t, width + pad), dtype)[:, :width]
    split = tuple(_t((t, h, d), dtype) for h in (hq, hkv, hkv))
    return lambda: rotary._launch(backward, fused_t, split, _t((t, d), dtype),
                                  _t((t, d), dtype), hq, hkv)


CALLS = {
    "forward": _forward(64, 4096),
    "forward, fewer rows": _forward(3, 4096),
    "forward, misaligned x": _forward(64, 4096, offset=1),
    "forward, 4-byte aligned x": _forward(64, 4096, offset=2),
    "forward, layer norm + bias": _forward(64, 4096, "layer_norm", bias=True),
    "forward, no residual": _forward(64, 4096, residual=False),
    "forward, fp16": _forward(64, 4096, dtype=HALF),
    "forward, streamed row": _forward(9, 20000),
    "forward, swept threads": _forward(64, 4096, threads=256),
    "backward": _backward(64, 4096),
    "backward, no dh": _backward(64, 4096, dh=False),
    "backward, misaligned dy": _backward(64, 4096, offset=1),
    "backward, layer norm": _backward(64, 4096, "layer_norm"),
    "backward, clusters": _backward(16, 65536),
    "backward, swept threads": _backward(64, 4096, threads=2048),
    "swiglu": _elementwise("swiglu_forward", 4096),
    "swiglu, misaligned": _elementwise("swiglu_forward", 4096, offset=3),
    "swiglu, few values": _elementwise("swiglu_forward", 5),
    "gelu backward": _elementwise("gelu_backward", 1 << 20),
    "swiglu rows": _rows("swiglu_forward", 7, 1000, 2000),
    "swiglu rows, odd pitch": _rows("swiglu_backward", 7, 1000, 1001),
    "rotary": _rotary(False, 33, 4, 2, 128),
    "rotary, padded pitch": _rotary(False, 33, 4, 2, 128, pad=2),
    "rotary backward": _rotary(True, 33, 4, 2, 64),
}


def _view(launch):
    """A launch as comparable values: the record's fields (its kernel by what it was
    loaded from), the grid, and the arguments' dtypes and values (a pointer by whether
    it is null and its 16-byte alignment: outputs are new tensors each call)."""
    record, grid, args = launch
    fields = dataclasses.asdict(record) | {"kernel": None}
    values = [(a.dtype, (a.item() > 0, a.item() % 16) if "*" in t else a.item())
              for a, (t, _) in zip(args, record.spec.params(), strict=True)]
    return fields, (record.kernel.spec, record.kernel.render), grid, values


def test_warm_records_launch_as_cold_ones(launches):
    for call in CALLS.values():  # every key in the cache at once
        call()
    warm = {}
    for name, call in CALLS.items():
        launches.clear()
        call()
        warm[name] = [_view(x) for x in launches]
    for name, call in CALLS.items():
        fused._RECORDS.clear()
        launches.clear()
        call()
        assert [_view(x) for x in launches] == warm[name], name
    assert len(fused._RECORDS) < len(CALLS)  # calls that differ only in rows share one


def _grid(units, per_cta, cap, cluster=1):
    return (cluster * max(1, min(-(-units // per_cta), cap)), 1, 1)


@pytest.mark.parametrize("rows, hidden, kind, residual, offset, threads", [
    (70, 4096, "rms_norm", True, 0, 2048), (3, 4096, "rms_norm", True, 0, 2048),
    (70, 4096, "layer_norm", False, 0, 256), (70, 4096, "rms_norm", True, 1, 2048),
    (9, 20000, "layer_norm", True, 2, 512), (1000, 768, "rms_norm", True, 0, 1024),
])
def test_forward_records_are_what_the_spec_and_plan_say(launches, rows, hidden, kind,
                                                        residual, offset, threads):
    x, w = _t((rows, hidden), offset=offset), _t((hidden,))
    r = _t((rows, hidden)) if residual else None
    b = _t((hidden,)) if kind == "layer_norm" else None
    y, h, mean, rstd = fused.add_norm_forward_fused(x, r, w, b, 1e-6, kind,
                                                    threads_per_sm=threads)
    (record, grid, args), = launches
    alignment = 2 ** min(4, (x.data_ptr() & -x.data_ptr()).bit_length() - 1)
    spec = S.AddNormForwardSpec(kind, "bf16", hidden, residual, b is not None, alignment)
    plan = spec.plan
    per_sm = min(max(1, threads // plan.block_threads), _resident(None, plan.block_threads))
    assert record.spec == spec and record.kernel.spec == spec and record.kernel.render is None
    assert (record.block, record.smem, record.dependent) == (plan.block, 0, True)
    assert grid == _grid(rows, plan.rows_per_block, SMS * per_sm)
    assert [a.item() for a in args[:8]] == [_p(t) for t in (
        x, r, w, b, h if residual else None, y, mean, rstd)]
    assert (args[8].dtype, args[9].dtype, args[9].item()) == (np.float32, np.int32, rows)


@pytest.mark.parametrize("rows, hidden, kind, dh, offset, threads", [
    (64, 4096, "rms_norm", True, 0, 512), (64, 4096, "layer_norm", False, 1, 512),
    (3, 4096, "rms_norm", False, 0, 2048), (16, 65536, "rms_norm", False, 0, 512),
    (40, 131072, "layer_norm", True, 0, 512),
])
def test_backward_records_are_what_the_spec_and_plan_say(launches, rows, hidden, kind, dh,
                                                         offset, threads):
    dy, h, w = _t((rows, hidden), offset=offset), _t((rows, hidden)), _t((hidden,))
    g = _t((rows, hidden)) if dh else None
    mean = _stats(rows) if kind == "layer_norm" else None
    rstd = _stats(rows)
    dx, dw, db = fused.add_norm_backward_fused(dy, h, w, mean, rstd, kind, g,
                                               threads_per_sm=threads)
    (record, grid, args), (reduce, reduce_grid, sums) = launches
    alignment = 2 ** min(4, (dy.data_ptr() & -dy.data_ptr()).bit_length() - 1)
    spec = S.AddNormBackwardSpec(kind, "bf16", hidden, dh, alignment, S.SM90)
    plan = spec.plan
    assert (plan.cluster > 1) == (hidden > 4096)  # the params cover both
    assert record.spec == spec and record.kernel.spec == spec
    assert (record.block, record.smem) == (plan.block, plan.smem_bytes)
    assert record.dependent == (plan.cluster == 1)  # a cluster kernel launches plainly
    per_sm = min(max(1, threads // plan.block_threads),
                 _resident(None, plan.block_threads, plan.smem_bytes))
    cap = SMS * per_sm
    if plan.cluster > 1:  # no driver answer: 3 in 4 of the even split
        cap = max(1, cap // plan.cluster * 3 // 4)
    assert grid == _grid(rows, plan.rows_per_block, cap, plan.cluster)
    assert [a.item() for a in args[:7]] == [_p(t) for t in (
        dy, h, w, mean, rstd, g, dx)] and args[8].item() == rows
    sets = 2 if kind == "layer_norm" else 1
    assert reduce.spec == S.ColumnReduceSpec("bf16", sets) and reduce.dependent
    assert reduce.block == S.REDUCE_BLOCK and reduce_grid == (-(-hidden // 32), 1, 1)
    teams = grid[0] // plan.cluster
    assert sums[0] == args[7] and [a.item() for a in sums[1:]] == [
        dw.data_ptr(), _p(db), teams, hidden]


@pytest.mark.parametrize("hidden, offsets, phased", [
    (6002, (3, 3, 3), True),   # dy, h, dh at one phase; rows in 4 classes, one team each
    (5140, (1, 1, 1), True),   # 2 classes of rows
    (6001, (0, 0, 0), False),  # 8 classes: more than the device's 4 teams
    (6002, (1, 0, 1), False),  # dy and h at different phases
    (4096, (1, 1, 1), False),  # a width of 16-byte rows: no phase to take, dx aligned
])
def test_backward_takes_the_rows_phase_where_its_streams_share_it(launches, hidden, offsets,
                                                                 phased):
    dy, h, g = (_t((64, hidden), offset=o) for o in offsets)
    w = _t((hidden,), offset=1)
    dx, _, _ = fused.add_norm_backward_fused(dy, h, w, _stats(64), _stats(64), "layer_norm", g)
    (record, grid, args), _ = launches
    assert args[6].item() == dx.data_ptr()
    plan = record.spec.plan
    assert plan.phased == phased and (plan.vector == 8) == phased
    # dx at dy's 16-byte phase where the plan takes it, else on 16 bytes
    assert (dx.data_ptr() - (dy.data_ptr() if phased else 0)) % 16 == 0
    if phased:  # as many teams in each class of rows
        assert grid[0] // plan.cluster % S.phase_period(hidden) == 0


def test_elementwise_and_rotary_records_are_what_their_specs_say(launches):
    fused._elementwise_rows("swiglu_forward", (_t((7, 2000))[:, :1000],) * 2, (_t((7, 1000)),))
    fused._elementwise("gelu_forward", (_t((1 << 20,), offset=2),), (_t((1 << 20,)),))
    (rows, rows_grid, rows_args), (flat, flat_grid, _) = launches
    # a pitch of 2000 values keeps 16 bytes; a width of 1000 values (2000 bytes) 16 too
    assert rows.spec == S.ElementwiseSpec("swiglu_forward", "bf16", 16, rows=True)
    assert rows_grid == _grid(7 * (1000 // 8), S.ELEMENTWISE_THREADS, SMS * 8)
    assert [a.item() for a in rows_args[-5:]] == [7, 1000, 2000, 2000, 1000]
    assert flat.spec == S.ElementwiseSpec("gelu_forward", "bf16", 4)  # the input 4 off
    assert flat_grid == _grid((1 << 20) // 2, S.ELEMENTWISE_THREADS, SMS * 8)
    launches.clear()
    _rotary(False, 33, 4, 2, 128, pad=2)()
    (record, grid, args), = launches
    # the pitch, (8 heads x 128 + 2) values, is 4 bytes aligned: pairs of values
    assert record.spec == R.RotarySpec("bf16", 128, 2, False)
    assert record.kernel.render is R.render and not record.dependent
    assert grid == _grid(33 * 8 * (64 // 2), R.THREADS, SMS * (2048 // R.THREADS))
    assert [a.item() for a in args[-4:]] == [33, 4, 2, 8 * 128 + 2]


def test_a_new_alignment_or_width_gets_its_own_record(launches):
    aligned, same = _forward(64, 4096), _forward(8, 4096)
    aligned()
    first = launches[-1][0]
    same()
    assert launches[-1][0] is first and launches[-1][1] != launches[-2][1]  # rows: its grid
    _forward(64, 4096, offset=1)()
    misaligned = launches[-1][0]
    assert misaligned is not first and misaligned.spec.alignment == 2
    assert misaligned.spec.plan.vector == 1 and first.spec.plan.vector == 8
    _forward(64, 4104)()
    assert launches[-1][0] not in (first, misaligned) and launches[-1][0].spec.hidden == 4104
    assert len(fused._RECORDS) == 3 and len(launches.loads) == 3


def test_a_steady_call_builds_no_spec_and_loads_no_kernel(launches, monkeypatch):
    for call in CALLS.values():
        call()
    built = []
    for cls in (S.AddNormForwardSpec, S.AddNormBackwardSpec, S.ColumnReduceSpec,
                S.ElementwiseSpec, R.RotarySpec):
        monkeypatch.setattr(cls, "__post_init__",
                            lambda self, check=cls.__post_init__: built.append(check(self)))
    loads = len(launches.loads)
    for call in CALLS.values():
        call()
    assert built == [] and len(launches.loads) == loads
    S.ElementwiseSpec("gelu_forward", "bf16")  # the counter counts
    assert len(built) == 1
