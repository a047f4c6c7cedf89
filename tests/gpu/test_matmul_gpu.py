"""Generated matmuls on one GPU: correctness of every mode and layout, one launch per
serial split-K matmul with no memset, the zeroed arena stays zero, streams do not share."""

import pytest
import torch

from lowering.kernels.heuristics import TILE_CONFIGS, WGMMA_CONFIGS, spec_for

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

if torch.cuda.is_available():
    cupy = pytest.importorskip("cupy")
    from hostir.jobs.matmul import count_launches
    from runtime import workspace
    from runtime.matmul import matmul


def _ref(a, b, layout, bias=None):
    r = a.double() @ (b.double().t() if layout == "TN" else b.double())
    return r + bias.double() if bias is not None else r


def _rel(out, ref):
    return ((out.double() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("layout", ["TN", "NN"])
@pytest.mark.parametrize("mode,split", [("none", 1), ("serial", 3), ("parallel", 4)])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(256, 512, 1024), (200, 136, 1000)])
def test_matmul_matches_float64(layout, mode, split, out_dtype, shape):
    M, N, K = shape
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(*((N, K) if layout == "TN" else (K, N)), device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(N, device="cuda", dtype=out_dtype)
    out = torch.full((M, N), float("nan"), device="cuda", dtype=out_dtype)
    spec = spec_for(TILE_CONFIGS[2], out_dtype="fp32" if out_dtype == torch.float32 else "bf16",
                    layout=layout, split_k=split, split_mode=mode, bias=True)
    matmul(a, b, layout=layout, out=out, bias=bias, spec=spec)
    torch.cuda.synchronize()
    assert not out.isnan().any(), "some output elements were never written"
    assert _rel(out, _ref(a, b, layout, bias)) < 1e-2


@pytest.mark.parametrize("config", range(len(TILE_CONFIGS)))
def test_every_tile_config_is_correct(config):
    M, N, K = 300, 520, 2048
    a = torch.randn(M, K, device="cuda", dtype=torch.float16)
    b = torch.randn(N, K, device="cuda", dtype=torch.float16)
    for mode, split in (("none", 1), ("serial", 2)):
        out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.float16)
        spec = spec_for(TILE_CONFIGS[config], a_dtype="fp16", b_dtype="fp16",
                        out_dtype="fp16", split_k=split, split_mode=mode)
        matmul(a, b, out=out, spec=spec)
        assert _rel(out, _ref(a, b, "TN")) < 1e-2, (TILE_CONFIGS[config], mode)


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="wgmma needs an sm_90 part")
@pytest.mark.parametrize("config", range(len(WGMMA_CONFIGS)))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_every_wgmma_config_is_correct_in_every_mode(config, dtype):
    M, N, K = 300, 520, 2048 + 40  # ragged M and N, a K tail
    a = torch.randn(M, K, device="cuda", dtype=dtype)
    b = torch.randn(N, K, device="cuda", dtype=dtype)
    bias = torch.randn(N, device="cuda", dtype=torch.float32)
    name = "bf16" if dtype == torch.bfloat16 else "fp16"
    for mode, split in (("none", 1), ("serial", 3), ("parallel", 4)):
        out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.float32)
        spec = spec_for(WGMMA_CONFIGS[config], a_dtype=name, b_dtype=name, out_dtype="fp32",
                        split_k=split, split_mode=mode, bias=True)
        assert spec.instr == "wgmma"
        matmul(a, b, out=out, bias=bias, spec=spec)
        torch.cuda.synchronize()
        assert not out.isnan().any(), (WGMMA_CONFIGS[config], mode)
        assert _rel(out, _ref(a, b, "TN", bias)) < 1e-2, (WGMMA_CONFIGS[config], mode)
    workspace.check_all_zeroed()


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="wgmma needs an sm_90 part")
@pytest.mark.parametrize("config", [i for i, c in enumerate(WGMMA_CONFIGS) if c[6] == "ptma"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_persistent_feed_stores_16_bit_c_by_tma_within_the_matrix(config, dtype):
    """16-bit C of the persistent feed goes out through shared memory by TMA stores where
    its rows are 16-byte aligned (`MatmulSpec.c_staged`): ragged edges clipped (the guard
    columns past N and rows past M keep their NaN), bias added, several units a CTA;
    a C whose rows are not 16-byte aligned takes the register store, as does a serial
    split (the arena left zero)."""
    from runtime import tma

    name = "bf16" if dtype == torch.bfloat16 else "fp16"
    for M, N, K in ((300, 520, 2088), (2088, 4104, 520)):
        a = torch.randn(M, K, device="cuda", dtype=dtype)
        b = torch.randn(N, K, device="cuda", dtype=dtype)
        for bias, pad, mode, split in ((None, 8, "none", 1), (True, 8, "none", 1),
                                       (None, 1, "none", 1), (True, 8, "serial", 2)):
            bias = torch.randn(N, device="cuda", dtype=dtype) if bias else None
            big = torch.full((M + 3, N + pad), float("nan"), device="cuda", dtype=dtype)
            out = big[:M, :N]
            spec = spec_for(WGMMA_CONFIGS[config], a_dtype=name, b_dtype=name, out_dtype=name,
                            split_k=split, split_mode=mode, bias=bias is not None)
            assert spec.c_staged
            assert tma.c_map_ok(spec, out) == (pad == 8)
            matmul(a, b, out=out, bias=bias, spec=spec)
            torch.cuda.synchronize()
            what = (WGMMA_CONFIGS[config], (M, N, K), pad, mode, bias is not None)
            assert not out.isnan().any(), what
            assert big[:, N:].isnan().all() and big[M:].isnan().all(), what
            assert _rel(out, _ref(a, b, "TN", bias)) < 1e-2, what
    workspace.check_all_zeroed()


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="wgmma needs an sm_90 part")
@pytest.mark.parametrize("config", [i for i, c in enumerate(WGMMA_CONFIGS) if c[6] == "ptma"])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_tail_split_sums_the_last_rounds_tiles(config, out_dtype):
    """split_mode "tail": whole tiles for the full rounds of the persistent grid, the last
    round's tiles in 2 or 3 K-slices summed serially in their own workspace slots; every
    element right (bias too), the arena left zero, whatever the SM count; where the
    rounds are full (no tail), every tile whole."""
    from lowering.kernels.matmul import tail_tiles
    from runtime.matmul import sm_count

    name = {torch.bfloat16: "bf16", torch.float32: "fp32"}[out_dtype]
    sms = sm_count(torch.cuda.current_device())
    for M, N, K, split in ((2088, 4104, 2088, 3), (1000, 3000, 1032, 2)):
        a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
        bias = torch.randn(N, device="cuda", dtype=out_dtype)
        spec = spec_for(WGMMA_CONFIGS[config], a_dtype="bf16", b_dtype="bf16", out_dtype=name,
                        split_k=split, split_mode="tail", bias=True)
        assert tail_tiles(spec, M, N, sms) > 0, (M, N, sms)
        out = torch.full((M, N), float("nan"), device="cuda", dtype=out_dtype)
        for _ in range(2):  # the semaphores are left zero for the next call
            matmul(a, b, out=out, bias=bias, spec=spec)
        torch.cuda.synchronize()
        what = (WGMMA_CONFIGS[config], (M, N, K), split)
        assert not out.isnan().any(), what
        assert _rel(out, _ref(a, b, "TN", bias)) < 1e-2, what
    # full rounds (tiles a multiple of the SMs): no tail, every tile whole
    cfg = WGMMA_CONFIGS[config]
    M, N, K = cfg[0] * sms, cfg[1], 1032
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
    spec = spec_for(cfg, a_dtype="bf16", b_dtype="bf16", out_dtype=name, split_k=2,
                    split_mode="tail")
    assert tail_tiles(spec, M, N, sms) == 0
    out = torch.full((M, N), float("nan"), device="cuda", dtype=out_dtype)
    matmul(a, b, out=out, spec=spec)
    torch.cuda.synchronize()
    assert _rel(out, _ref(a, b, "TN")) < 1e-2
    workspace.check_all_zeroed()


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="wgmma needs an sm_90 part")
@pytest.mark.parametrize("feed", ["tma", "ptma"])
def test_tma_kernels_capture_in_a_cuda_graph_with_new_tensors(feed):
    """A TMA kernel captured with operands and output first seen inside the capture (the
    second GEMM of a layer: its input is made in the graph): its tensor maps are launch
    arguments, so nothing is copied to the device during capture; replays on new data
    are right."""
    cfg = next(c for c in WGMMA_CONFIGS if c[6] == feed)
    spec = spec_for(cfg, a_dtype="bf16", b_dtype="bf16", out_dtype="bf16")
    M, N, K = 1000, 2056, 1032
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(512, N, device="cuda", dtype=torch.bfloat16)
    matmul(a, b, spec=spec)  # compile and load outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        with torch.cuda.graph(graph, stream=side):
            h = matmul(a, b, spec=spec)        # a new output
            y = matmul(h, w, spec=spec)        # a new input
    for _ in range(2):
        a.copy_(torch.randn_like(a))
        graph.replay()
        torch.cuda.synchronize()
        ref_h = _ref(a, b, "TN")
        assert _rel(h, ref_h) < 1e-2
        assert _rel(y, _ref(h, w, "TN")) < 1e-2


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="thread-block clusters and wgmma need an sm_90 part")
@pytest.mark.parametrize("feed", ["sync", "ws", "tma"])
def test_cluster_split_k_is_correct_and_one_launch(feed):
    """Split-K summed in a thread-block cluster: ragged M and N, a K tail, bias, every
    output element written, one kernel, no memset, and the arena left alone."""
    from lowering.kernels.heuristics import spec_for

    M, N, K = 300, 520, 4096 + 40
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
    for tile in ((128, 256, 64, 8, 1, 4), (128, 128, 64, 8, 1, 6 if feed != "sync" else 5)):
        for out_dtype in (torch.bfloat16, torch.float32):
            bias = torch.randn(N, device="cuda", dtype=out_dtype)
            out = torch.full((M, N), float("nan"), device="cuda", dtype=out_dtype)
            spec = spec_for(tile + (feed,), split_k=2, split_mode="cluster", bias=True,
                            out_dtype="fp32" if out_dtype == torch.float32 else "bf16")
            matmul(a, b, out=out, bias=bias, spec=spec)
            torch.cuda.synchronize()
            assert not out.isnan().any(), (spec.kernel_name, "elements never written")
            assert _rel(out, _ref(a, b, "TN", bias)) < 1e-2, spec.kernel_name
            # deterministic: slices are summed in K order every time
            again = matmul(a, b, bias=bias, spec=spec, out_dtype=out_dtype)
            assert torch.equal(again, out), spec.kernel_name
    seen = count_launches(lambda: matmul(a, b, out=out, bias=bias, spec=spec), torch)
    assert seen["kernels"] == 1 and seen["memsets"] == 0, seen


def test_serial_split_k_is_one_launch_without_memset():
    M, N, K = 512, 1024, 8192
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    spec = spec_for(TILE_CONFIGS[2], split_k=4, split_mode="serial")
    matmul(a, b, out=out, spec=spec)  # warm: compile, grow the arena
    torch.cuda.synchronize()
    seen = count_launches(lambda: matmul(a, b, out=out, spec=spec), torch)
    assert seen["kernels"] == 1 and seen["memsets"] == 0, seen
    pspec = spec_for(TILE_CONFIGS[2], split_k=4, split_mode="parallel")
    matmul(a, b, out=out, spec=pspec)
    seen = count_launches(lambda: matmul(a, b, out=out, spec=pspec), torch)
    assert seen["kernels"] == 2 and seen["memsets"] == 0, seen


def test_arena_is_zero_after_many_serial_launches_and_never_regrown():
    M, N, K = 384, 640, 4096
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
    ref = _ref(a, b, "TN")
    spec = spec_for(TILE_CONFIGS[2], split_k=6, split_mode="serial")
    out = matmul(a, b, spec=spec)
    arena = workspace.arena_for()
    grows = arena.grows
    for _ in range(20):
        out = matmul(a, b, spec=spec)
    torch.cuda.synchronize()
    arena.check_zeroed()
    assert arena.grows == grows
    assert int(arena.semaphore_buffer.abs().sum()) == 0
    assert _rel(out, ref) < 1e-2


def test_two_streams_use_distinct_arenas_and_stay_correct():
    M, N, K = 512, 512, 8192
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    b1 = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
    b2 = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
    spec = spec_for(TILE_CONFIGS[2], split_k=8, split_mode="serial")
    torch.cuda.synchronize()
    outs = {}
    for s, b in ((s1, b1), (s2, b2)):
        with torch.cuda.stream(s):
            for _ in range(5):
                outs[id(s)] = matmul(a, b, spec=spec)
    torch.cuda.synchronize()
    ar1, ar2 = workspace.arena_for(s1), workspace.arena_for(s2)
    assert ar1 is not ar2
    assert ar1.semaphore_buffer.data_ptr() != ar2.semaphore_buffer.data_ptr()
    assert ar1.partials(1).data_ptr() != ar2.partials(1).data_ptr()
    ar1.check_zeroed()
    ar2.check_zeroed()
    assert _rel(outs[id(s1)], _ref(a, b1, "TN")) < 1e-2
    assert _rel(outs[id(s2)], _ref(a, b2, "TN")) < 1e-2


def test_heuristic_auto_mode_and_odd_shapes():
    for M, N, K in ((1, 8, 8), (33, 70, 72), (1000, 24, 4096)):
        a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
        out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
        matmul(a, b, out=out)
        assert _rel(out, _ref(a, b, "TN")) < 1e-2, (M, N, K)


def test_autotune_times_finalists_again_and_persists_the_winner(tmp_path, capsys):
    import dataclasses

    from hostir.options import options, set_options
    from runtime import autotune
    from runtime.matmul import Problem

    saved = options()
    set_options(dataclasses.replace(saved, cache_dir=tmp_path, dumps=frozenset({"autotune"})))
    try:
        p = Problem(256, 512, 2048, "bf16", "bf16", "TN", False)
        base = spec_for(TILE_CONFIGS[2])
        cands = [dataclasses.replace(base, split_k=s, split_mode=m)
                 for s, m in ((1, "none"), (2, "serial"), (4, "parallel"))]
        best = autotune.tune(p, candidates=cands, reps=3, finalists=2, final_reps=3)
        assert best in cands
        assert autotune.stored_winner(p) == best
        table = capsys.readouterr().out
        assert "2 finalists timed again side by side" in table
        assert table.count("final round") == 2
    finally:
        set_options(saved)


def test_autotune_times_the_heuristic_pick_in_the_final_round(tmp_path, capsys, monkeypatch):
    """The heuristics' pick joins the side-by-side final round even when the noisy first
    round ranks it last, so a tuned winner never loses to the default it replaces."""
    import dataclasses

    from hostir.options import options, set_options
    from runtime import autotune
    from runtime.matmul import Problem

    base = spec_for(TILE_CONFIGS[2])
    slow = dataclasses.replace(spec_for(TILE_CONFIGS[5]), split_k=8, split_mode="serial")
    fast = [dataclasses.replace(base, split_k=s, split_mode=m)
            for s, m in ((1, "none"), (2, "serial"))]
    monkeypatch.setattr(autotune.heuristics, "choose", lambda *a, **k: slow)
    saved = options()
    set_options(dataclasses.replace(saved, cache_dir=tmp_path, dumps=frozenset({"autotune"})))
    try:
        p = Problem(512, 1024, 4096, "bf16", "bf16", "TN", False)
        best = autotune.tune(p, candidates=fast + [slow], reps=3, finalists=1, final_reps=3)
        table = capsys.readouterr().out
        assert "2 finalists timed again side by side" in table, table
        slow_line = next(line for line in table.splitlines()
                         if f" {slow.tile:>11} " in line and f"split {slow.split_k:>2}" in line)
        assert "final round" in slow_line, table
        assert best in fast + [slow]
    finally:
        set_options(saved)
