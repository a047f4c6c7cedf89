"""Matmul code generation without a GPU: spec checks, heuristics, deterministic source,
and every variant the heuristics and the autotuner can emit compiles for sm_90 and sm_80
(wgmma variants for sm_90a only, with no spills)."""

import dataclasses
import itertools
import os
from concurrent.futures import ThreadPoolExecutor

import pytest

from lowering.kernels import heuristics
from lowering.kernels.matmul import MatmulSpec, render, tiles
from lowering.kernels.render import Renderer

ISSUE_SHAPES = [(1024, 2048, 50304), (8192, 8192, 8192), (4096, 4096, 8192),
                (16384, 8192, 4096), (256, 4096, 16384)]


@pytest.mark.parametrize("fields,message", [
    ({"a_dtype": "fp32"}, "a_dtype"),
    ({"a_dtype": "fp16"}, "must match"),
    ({"out_dtype": "int8"}, "out_dtype"),
    ({"layout": "TT"}, "layout"),
    ({"tile_k": 16}, "tile_k"),
    ({"tile_m": 80}, "tile_m"),
    ({"warps_m": 4, "warps_n": 4}, "warps"),
    ({"stages": 1}, "stages"),
    ({"split_k": 4}, "split_k == 1 exactly"),
    ({"split_mode": "serial"}, "split_k == 1 exactly"),
    ({"split_mode": "tree", "split_k": 2}, "split_mode"),
    ({"tile_m": 256, "tile_n": 256, "warps_m": 2, "warps_n": 2}, "accumulators"),
    ({"instr": "tcgen05"}, "instr"),
    ({"instr": "wgmma", "tile_k": 64, "warps_m": 8, "warps_n": 1, "layout": "NN"}, "TN"),
    ({"instr": "wgmma", "warps_m": 8, "warps_n": 1}, "tile_k 64"),
    ({"instr": "wgmma", "tile_k": 64}, "warpgroups"),
    ({"instr": "wgmma", "tile_k": 64, "warps_m": 8, "warps_n": 1, "tile_n": 96}, "tile_n"),
    ({"instr": "wgmma", "tile_k": 64, "warps_m": 8, "warps_n": 1, "stages": 2}, "stages"),
    ({"warp_specialized": True}, "warp_specialized"),
    ({"instr": "wgmma", "tile_k": 64, "warps_m": 8, "warps_n": 1, "tma": True}, "tma needs"),
    ({"split_mode": "cluster", "split_k": 2}, "non-persistent wgmma"),
    ({"instr": "wgmma", "tile_k": 64, "warps_m": 8, "warps_n": 1, "split_mode": "cluster",
      "split_k": 3}, "split_k in"),
    ({"instr": "wgmma", "tile_k": 64, "warps_m": 8, "warps_n": 1, "warp_specialized": True,
      "tma": True, "persistent": True, "split_mode": "cluster", "split_k": 2},
     "non-persistent"),
])
def test_spec_refuses_bad_fields_with_a_clear_error(fields, message):
    with pytest.raises(ValueError, match=message):
        MatmulSpec(**fields)


def test_shape_checks_name_the_axis():
    spec = MatmulSpec()
    with pytest.raises(ValueError, match="K must be a multiple of 8"):
        spec.check_shape(64, 64, 100)
    with pytest.raises(ValueError, match="N must be a multiple of 8"):
        MatmulSpec(layout="NN").check_shape(64, 100, 64)
    spec.check_shape(1, 3, 8)  # M and N are predicated: any size


def test_renderer_is_deterministic_and_table_driven():
    spec = MatmulSpec(split_k=4, split_mode="serial")
    assert render(spec).source == render(MatmulSpec(split_k=4, split_mode="serial")).source
    # split mode, split factor and bias are arguments: one source for all of them
    assert render(spec).source == render(MatmulSpec(bias=True)).source
    assert render(spec).source != render(MatmulSpec(layout="NN")).source
    src = render(spec).source
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in src
    assert "ldmatrix.sync.aligned.m8n8.x4" in src and "cp.async.cg.shared.global" in src
    assert "#include" not in src
    with pytest.raises(KeyError, match="unknown snippet"):
        Renderer().snippet("nope")


@pytest.mark.parametrize("arch", [None, "sm_90"])
@pytest.mark.parametrize("sms", [132, 108, 78])
@pytest.mark.parametrize("shape", ISSUE_SHAPES + [(512, 512, 65536), (128, 256, 32768)])
def test_heuristics_fill_at_least_one_wave(shape, sms, arch):
    M, N, K = shape
    spec = heuristics.choose(M, N, K, sm_count=sms, arch=arch)

    def ctas(s):  # CTAs that hold rows (a cluster pair's second tile past M stores nothing)
        return -(-M // s.tile_m) * -(-N // s.tile_n) * s.split_k

    # The rule holds where some candidate can meet it: always with the mma.sync tiles;
    # wgmma's smallest tile (128x128) and the largest split (32) give 128x256 64 CTAs.
    cands = heuristics.candidates(M, N, K, sm_count=sms, arch=arch, prefer_wgmma=True)
    # (or the grid streams its operands at the device's rate: `streams_the_device`)
    if arch is None or any(heuristics.fills_a_wave(ctas(c), sms) for c in cands):
        assert (ctas(spec) >= heuristics.WAVE_FILL * sms
                or heuristics.streams_the_device(spec, M, N, K, sms)), (spec, ctas(spec))
    else:
        assert (M, N) == (128, 256)
    assert heuristics.fills_a_wave(128, 132) and not heuristics.fills_a_wave(64, 132)
    # every slice has work
    ktiles = -(-K // spec.tile_k)
    assert -(-ktiles // spec.split_k) * (spec.split_k - 1) < ktiles


def test_heuristics_split_small_mn_large_k_and_not_large_mn():
    small = heuristics.choose(512, 1024, 50304)
    assert small.split_k > 1 and small.split_mode == "serial"
    big = heuristics.choose(8192, 8192, 8192)
    assert big.split_k == 1 and big.split_mode == "none"


def test_forced_modes_are_honoured():
    for mode in ("none", "serial", "parallel"):
        assert heuristics.choose(1024, 2048, 50304, mode=mode).split_mode == mode
    with pytest.raises(ValueError):
        heuristics.choose(64, 64, 64, mode="fast")


def test_wgmma_on_sm90_only_and_tn_only():
    for M, N, K in ISSUE_SHAPES:
        hopper = heuristics.choose(M, N, K, arch="sm_90")
        assert hopper.instr == "wgmma" and hopper.arch(9, 0) == "sm_90a"
        for arch in (None, "sm_80", "sm_86", "sm_100"):
            assert heuristics.choose(M, N, K, arch=arch).instr == "mma"
            assert all(s.instr == "mma" for s in heuristics.candidates(M, N, K, arch=arch))
        assert heuristics.choose(M, N, K, arch="sm_90", layout="NN").instr == "mma"
        # the autotuner on Hopper times both kinds
        kinds = {s.instr for s in heuristics.candidates(M, N, K, arch="sm_90")}
        assert kinds == {"mma", "wgmma"}
    for mode in ("none", "serial", "parallel"):
        spec = heuristics.choose(1024, 2048, 50304, mode=mode, arch="sm_90")
        assert spec.instr == "wgmma" and spec.split_mode == mode


def test_cluster_split_k_source_and_choice():
    """split_mode "cluster": the split factor is compiled in as the cluster's size, the
    epilogue sums peers' partials through distributed shared memory, and no semaphore or
    workspace is touched; the heuristics offer it on Hopper only."""
    base = heuristics.spec_for((128, 256, 64, 8, 1, 4, "tma"))
    two = dataclasses.replace(base, split_k=2, split_mode="cluster")
    assert (two.cluster_k, two.cluster_size, base.cluster_k) == (2, 2, 1)
    assert base.source_key != two.source_key
    assert two.kernel_name.endswith("_tma_ck2")
    # the serial and parallel modes still share the unsplit source
    assert dataclasses.replace(base, split_k=4, split_mode="serial").source_key == base.source_key
    src = render(two)
    main = src.source.split(f"{two.kernel_name}(")[1].split("__global__")[0]
    assert "__cluster_dims__(2, 1, 1)" in src.source
    assert "ld.shared::cluster.v4.f32" in src.source and "mapa.shared::cluster" in src.source
    # two cluster barriers: the partials are in, and the peers are done reading them
    assert sum(line.strip() == "cluster_sync();" for line in main.splitlines()) == 2
    assert "sem_wait" not in main and "store_partial4" not in main
    assert "__cluster_dims__" not in render(base).source
    # a launch is one CTA per (tile, slice), in clusters of the split's CTAs
    assert src.launch(1024, 2048, 50304).grid == (tiles(two, 1024, 2048) * 2, 1, 1)
    # offered on Hopper (TN) only, and refused by name elsewhere
    assert any(s.split_mode == "cluster"
               for s in heuristics.candidates(1024, 2048, 50304, arch="sm_90"))
    assert not any(s.split_mode == "cluster"
                   for s in heuristics.candidates(1024, 2048, 50304, arch="sm_80"))
    assert heuristics.choose(1024, 2048, 50304, mode="cluster", arch="sm_90").split_mode == "cluster"
    with pytest.raises(ValueError, match="cluster.*sm_90"):
        heuristics.choose(1024, 2048, 50304, mode="cluster", arch="sm_80")
    # the model prefers summing in the cluster to chaining slices through L2
    spec = heuristics.choose(1024, 2048, 50304, arch="sm_90")
    serial = heuristics.choose(1024, 2048, 50304, arch="sm_90", mode="serial")
    assert spec.split_mode == "cluster"
    assert (heuristics.estimate_us(spec, 1024, 2048, 50304, 132)
            < heuristics.estimate_us(serial, 1024, 2048, 50304, 132))


def test_wgmma_source_is_table_driven():
    spec = heuristics.spec_for(heuristics.WGMMA_CONFIGS[0])
    src = render(spec).source
    assert spec.instr == "wgmma" and "#include" not in src
    assert f"wgmma.mma_async.sync.aligned.m64n{spec.tile_n}k16.f32.bf16.bf16" in src
    assert "@" not in src  # every placeholder of the instruction snippet filled in
    assert "fence.proxy.async.shared::cta" in src and "wgmma.wait_group.sync.aligned" in src
    fp16 = render(heuristics.spec_for(heuristics.WGMMA_CONFIGS[0], a_dtype="fp16",
                                      b_dtype="fp16")).source
    assert "k16.f32.f16.f16" in fp16
    assert spec.source_key != heuristics.spec_for(heuristics.TILE_CONFIGS[0]).source_key
    assert spec.smem_bytes % 1024 == 0
    ws = heuristics.spec_for(heuristics.WGMMA_CONFIGS[0][:6] + ("ws",))
    assert ws.warp_specialized and ws.threads == spec.threads + 32 * 2 and ws.feed == "ws"
    ws_src = render(ws).source
    assert ws.source_key != spec.source_key and ws.kernel_name.endswith("_ws")
    assert "cp.async.mbarrier.arrive.noinc" in ws_src and "mbarrier.try_wait.parity" in ws_src
    assert "mbarrier" not in src
    tma = heuristics.spec_for(heuristics.WGMMA_CONFIGS[0][:6] + ("tma",))
    assert tma.tma and tma.threads == spec.threads + 32 and tma.kernel_name.endswith("_tma")
    tma_src = render(tma).source
    assert "cp.async.bulk.tensor.2d" in tma_src and "expect_tx" in tma_src
    assert "load_stage" not in tma_src  # no cp.async ring: the producer copies by TMA
    # the maps by value, no C map outside the persistent feed
    assert "const __grid_constant__ TensorMap map_b)" in tma_src and "TensorMap map" not in ws_src
    ptma = heuristics.spec_for(heuristics.WGMMA_CONFIGS[0][:6] + ("ptma",))
    assert ptma.c_staged and "TensorMap map_c, int c_tma)" in render(ptma).source
    assert len({spec.source_key, ws.source_key, tma.source_key}) == 3


def _emittable_specs(arch):
    """Every distinct source the heuristics or the autotuner can ask for on `arch`."""
    seen = {}
    wgmma_ok = arch.startswith("sm_90")
    for spec in heuristics.all_source_specs():
        if spec.instr == "mma" or wgmma_ok:
            seen.setdefault(spec.source_key, spec)
    for M, N, K in ISSUE_SHAPES:
        for spec in (heuristics.candidates(M, N, K, arch=arch) +
                     [heuristics.choose(M, N, K, arch=arch)]):
            seen.setdefault(spec.source_key, spec)
    return list(seen.values())


def test_candidates_stay_within_compiled_sources():
    known = {s.source_key for s in heuristics.all_source_specs()}
    for M, N, K in ISSUE_SHAPES:
        for arch in (None, "sm_90"):
            for layout in ("TN", "NN"):
                for spec in heuristics.candidates(M, N, K, a_dtype="fp16", out_dtype="fp32",
                                                  layout=layout, bias=True, arch=arch):
                    assert spec.source_key in known


@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
def test_every_emittable_variant_compiles(arch):
    pytest.importorskip("cupy")
    from runtime import jit

    specs = _emittable_specs(arch)
    assert any(s.instr == "wgmma" for s in specs) == (arch == "sm_90")

    def build(spec):
        src = render(spec)
        target = spec.arch(int(arch[3]), int(arch[4]))  # wgmma: sm_90a
        return spec, src, jit.compile(src.source, src.names, target)

    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        built = list(pool.map(build, specs))  # any CompilationError fails the test
    report = []
    for spec, src, ck in built:
        sym = ck.lowered[src.kernel_name]
        assert ck.registers[sym] <= 255
        report.append(f"{ck.arch} {src.kernel_name}: {ck.registers[sym]} regs, "
                      f"{ck.spill_bytes.get(sym, 0)} B spills")
        assert len(ck.cubin) > 1000
        if spec.instr == "wgmma":
            assert ck.arch == "sm_90a"
            assert ck.spill_bytes.get(sym, 0) == 0, report[-1]
            assert ck.local_bytes.get(sym, 0) == 0, report[-1]
            # ptxas serializes wgmma (a wait after each) when it cannot keep them async
            assert "serialized" not in ck.log, ck.log
    print("\n".join(report))


def test_gpu_wgmma_check_plan_and_crash_bookkeeping(tmp_path):
    """The one-shot GPU script, without a GPU: its plan holds valid specs of every feed,
    and a crashing or hanging variant (fake worker) costs only its kernel's split mode."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from benchmarks import gpu_wgmma_check as check

    groups = check.plan(((512, 512, 4096), (4096, 4096, 1024)))
    names = [g["name"] for g in groups]
    assert names == ["wgmma_sync", "wgmma_ws", "wgmma_tma", "wgmma_ptma", "wgmma_pptma",
                     "wgmma_ctma", "heuristics"]
    for g in groups:
        for v in g["variants"]:
            MatmulSpec(**v["spec"])  # valid
    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "fake.json"
    env = dict(os.environ, HOSTIR_WGMMA_CHECK_FAKE="1", HOSTIR_WGMMA_VARIANT_TIMEOUT="1",
               PYTHONPATH=str(root))
    subprocess.run([sys.executable, str(root / "benchmarks" / "gpu_wgmma_check.py"),
                    "--json", str(out), "--budget-s", "60", "--shapes", "512x512x4096"],
                   cwd=root, env=env, check=True, capture_output=True, timeout=120)
    doc = json.loads(out.read_text())
    status = {v["label"]: v["status"] for v in doc["variants"]}
    crashed = [k for k, s in status.items() if s.startswith("crashed")]
    hung = [k for k, s in status.items() if s.startswith("hung")]
    assert len(crashed) == 3 and all(" tma edge serial" in k for k in crashed)
    assert len(hung) == 3 and all("ws edge parallel" in k for k in hung)
    # the same kernels' other modes still ran
    assert status["128x256x64 tma none s1"] == "ok" and status["128x256x64 ws serial s2"] == "ok"
    assert status["128x256x64 tma serial s2"].startswith("skipped")
    assert doc["shapes"]["512x512x4096"]["best_ratio"] == 0.9


def test_cluster_feed_compiles_without_spills():
    """The 2-CTA cluster feed (B multicast): sm_90a, no spills, cluster dims and the
    multicast in the source, remote slot releases at CTA scope (not .release.cluster)."""
    from lowering.kernels.heuristics import CLUSTER_CONFIGS, spec_for
    from runtime import jit

    for config in CLUSTER_CONFIGS:
        spec = spec_for(config)
        assert spec.feed == "ctma" and spec.cluster_m == 2
        src = render(spec)
        assert "__cluster_dims__(2, 1, 1)" in src.source and "multicast::cluster" in src.source
        assert "mbarrier.arrive.shared::cluster.b64" in src.source
        assert "arrive.release.cluster" not in src.source
        ck = jit.compile(src.source, src.names, "sm_90a")
        assert ck.spill_bytes.get(src.kernel_name, 0) == 0


def test_staged_c_store_needs_16_bit_c_and_an_even_number_of_boxes_a_unit():
    """The persistent feed's two C buffers a warpgroup take a unit's boxes in turn: with
    an odd count the next unit's first box would reuse the buffer still being stored."""
    ptma = heuristics.spec_for((128, 256, 64, 8, 1, 4, "ptma"))
    assert ptma.c_staged and "C_STAGED = true" in render(ptma).source
    assert not heuristics.spec_for((128, 192, 64, 8, 1, 4, "ptma")).c_staged  # 3 boxes
    assert not dataclasses.replace(ptma, out_dtype="fp32").c_staged
    assert not heuristics.spec_for((128, 128, 64, 8, 1, 6, "pptma")).c_staged
    assert ptma.smem_bytes - dataclasses.replace(ptma, out_dtype="fp32").smem_bytes == 4 * 8192


def test_tile_raster_covers_the_grid_and_merges_a_short_last_group(tmp_path):
    """`group_tile` (the kernels' own text, compiled for the host): every tile of every grid
    once; groups of GROUP_M rows walked down the rows column by column; a last group of
    fewer than GROUP_M / 2 rows joined to the one before it (nine rows of 128x256 tiles
    at 1152x10560x7040 ran 0.86 of cuBLAS on the H100 as 8 + 1, 1.00 as one group of 9);
    the cost model's first group (`heuristics.first_group_rows`) the same."""
    import ctypes
    import shutil
    import subprocess

    from lowering.kernels.matmul import GROUP_M
    from lowering.kernels.matmul.renderer import RENDERER

    compiler = shutil.which("g++")
    if compiler is None:
        pytest.skip("no host C++ compiler")
    text = RENDERER.snippet("raster").replace("__device__ __forceinline__", "static")
    src = (f"constexpr int GROUP_M = {GROUP_M};\n"
           "static int imin(int a, int b) { return a < b ? a : b; }\n" + text +
           'extern "C" void raster(int rows, int tiles_n, int* tm, int* tn) {\n'
           "  for (int t = 0; t < rows * tiles_n; ++t)\n"
           "    group_tile(t, rows, tiles_n, tm[t], tn[t]);\n"
           "}\n")
    (tmp_path / "r.cpp").write_text(src)
    subprocess.run([compiler, "-std=c++17", "-shared", "-fPIC", str(tmp_path / "r.cpp"),
                    "-o", str(tmp_path / "r.so")], check=True)
    raster = ctypes.CDLL(str(tmp_path / "r.so")).raster
    for rows in range(1, 4 * GROUP_M + 4):
        for tiles_n in (1, 2, 5, 42):
            n = rows * tiles_n
            tm, tn = (ctypes.c_int * n)(), (ctypes.c_int * n)()
            raster(rows, tiles_n, tm, tn)
            cells = list(zip(tm, tn))
            assert sorted(cells) == [(m, c) for m in range(rows) for c in range(tiles_n)]
            rem = rows % GROUP_M
            merged = rows > GROUP_M and 0 < rem < GROUP_M / 2
            sizes = [GROUP_M] * (rows // GROUP_M - merged) + (
                [GROUP_M + rem] if merged else [rem] if rem else [])
            assert heuristics.first_group_rows(rows) == sizes[0]  # the model's DRAM term
            t = 0
            for first, size in zip(itertools.accumulate([0] + sizes), sizes):
                for c in range(tiles_n):
                    assert cells[t:t + size] == [(first + r, c) for r in range(size)]
                    t += size
            assert t == n
