#!/usr/bin/env bash
# The one-GPU benchmarks and tests/gpu, from the repo root:
#   HOSTIR_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/run_gpu_single.sh [PART...]
# PART: kernels (the tuned matmul and normalization benches; with two GPUs the matmul work
# runs on GPU 0 and the normalization work on GPU 1, side by side), layer (tests/gpu, the
# transformer step after `warmup`, the seam kernels, host overhead), shapes (the untuned
# any-shape GEMM and norm-width sweeps), rules (the norm backward's plan rules side by
# side, into $OUT only); default: kernels, layer, shapes. Official results go to
# $RESULTS (default benchmarks/results)/<bench>_<device>.json (the next run overwrites
# them), logs under $OUT; then docs/PERFORMANCE.md is regenerated.
set -uo pipefail
OUT="${OUT:-/tmp/hostir-evidence}"; mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export HOSTIR_CACHE_DIR="${HOSTIR_CACHE_DIR:-/tmp/hostir-cache}"
export HOSTIR_COMMIT="${HOSTIR_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)}"
GPUS=$(python3 -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
[ "$GPUS" -ge 1 ] || { echo "run_gpu_single.sh: error: no CUDA device"; exit 1; }
DEV=$(python3 -c "import torch; from hostir.jobs.results import device_slug
print(device_slug(torch.cuda.get_device_name(0)))" 2>/dev/null)
R="${RESULTS:-benchmarks/results}"; mkdir -p "$R"
PARTS="${*:-kernels layer shapes}"
matmul_work() {
  echo "== wgmma check"; timeout 200 python3 benchmarks/gpu_wgmma_check.py \
    --json "$R/wgmma_check_$DEV.json" > "$OUT/wgmma.log" 2>&1; echo "rc=$?"
  echo "== matmul bench"; timeout 300 python3 -m hostir.run matmul --bench --tune \
    --json "$R/matmul_$DEV.json" > "$OUT/matmul.log" 2>&1; echo "rc=$?"
  echo "== MLP step profile"; timeout 200 python3 benchmarks/profile_mlp_step.py \
    --json "$R/profile_mlp_step_$DEV.json" > "$OUT/profile_mlp_step.log" 2>&1; echo "rc=$?"
}
norm_work() {
  echo "== layer_norm bench"; timeout 300 python3 -m hostir.run layer_norm --bench --tune \
    --no-sweep --json "$R/layer_norm_$DEV.json" > "$OUT/layer_norm.log" 2>&1; echo "rc=$?"
  echo "== tests/gpu"; timeout 400 python3 -m pytest -q -p no:cacheprovider --color=no tests/gpu \
    > "$OUT/gpu_tests.log" 2>&1; echo "rc=$?"
}
layer_work() {  # GPU_TESTS: a narrower selection of tests/gpu
  echo "== tests/gpu"; timeout 400 python3 -m pytest -q -p no:cacheprovider --color=no ${GPU_TESTS:-tests/gpu} \
    > "$OUT/gpu_tests.log" 2>&1; echo "rc=$?"; grep -a -E "passed|failed" "$OUT/gpu_tests.log" | tail -3
  echo "== warmup + transformer step"; timeout 120 python3 -m hostir.run warmup train_transformer \
    --hidden 4096 --head-dim 128 > "$OUT/warmup.log" 2>&1
  timeout 300 python3 -m hostir.run train_transformer --bench --hidden 4096 --heads 32 \
    --kv-heads 8 --tokens 4096 --layers 2 --dtype bfloat16 --json "$R/transformer_layer_$DEV.json" \
    2>&1 | grep -a -E "bench|error"
  echo "== seams"; timeout 200 python3 benchmarks/seams_bench.py --json "$R/seams_$DEV.json" \
    > "$OUT/seams.log" 2>&1; echo "rc=$?"
  echo "== host overhead"; timeout 120 python3 benchmarks/host_overhead.py \
    --json "$R/host_overhead_$DEV.json" > "$OUT/host_overhead.log" 2>&1; echo "rc=$?"
}
shapes_work() {
  # every multiple of 512 (the set), the OFF_LINE and odd widths: about 450 s on
  # an H200 (a run at --budget-s 400 left fp16 65535's last three rows)
  echo "== norm widths"; timeout 560 python3 benchmarks/norm_widths.py --budget-s 500 \
    --json "$R/norm_widths_$DEV.json" > "$OUT/norm_widths.log" 2>&1; echo "rc=$?"
  echo "== matmul shapes"; timeout 240 python3 benchmarks/matmul_shapes.py --budget-s 200 \
    --json "$R/matmul_shapes_$DEV.json" > "$OUT/matmul_shapes.log" 2>&1; echo "rc=$?"
}
rules_work() {  # an experiment, not an official file: the norm backward's plan rules
  echo "== norm backward rules"; timeout 500 python3 benchmarks/seams_bench.py --sweep \
    --hidden 2560,4608,6656,8704,12800,16384,16896,24576,33280,65536 \
    --ops add_rms_norm_bwd,add_layer_norm_bwd --reps 5 --json "$OUT/seams_rules.json" \
    > "$OUT/seams_rules.log" 2>&1; echo "rc=$?"; tail -12 "$OUT/seams_rules.log"
}
for part in $PARTS; do
  case "$part" in
    kernels)
      if [ "$GPUS" -ge 2 ]; then
        (export CUDA_VISIBLE_DEVICES=0; matmul_work) > "$OUT/gpu0.log" 2>&1 &
        (export CUDA_VISIBLE_DEVICES=1; norm_work) > "$OUT/gpu1.log" 2>&1 &
        wait
      else
        (matmul_work) > "$OUT/gpu0.log" 2>&1
        (norm_work) > "$OUT/gpu1.log" 2>&1
      fi
      cat "$OUT/gpu0.log" "$OUT/gpu1.log"
      tail -25 "$OUT/wgmma.log"; tail -12 "$OUT/matmul.log"; tail -16 "$OUT/layer_norm.log"
      grep -a -E "passed|failed" "$OUT/gpu_tests.log" | tail -3 ;;
    layer) layer_work ;;
    shapes) shapes_work ;;
    rules) rules_work ;;
    *) echo "run_gpu_single.sh: error: unknown part '$part' (kernels, layer, shapes, rules)"; exit 2 ;;
  esac
done
[ "$R" = benchmarks/results ] && python3 -m benchmarks.report
