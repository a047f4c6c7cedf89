#!/usr/bin/env bash
# The one-GPU benchmarks (generated kernels) and tests/gpu, from the repo root:
#   HOSTIR_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/run_gpu_single.sh
# With two GPUs the matmul work runs on GPU 0 and the normalization work on GPU 1, side by
# side; with one, one after the other. Official results go to
# benchmarks/results/<bench>_<device>.json (the next run overwrites them), logs under $OUT;
# then docs/PERFORMANCE.md is regenerated.
set -uo pipefail
OUT="${OUT:-/tmp/hostir-evidence}"; mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export HOSTIR_CACHE_DIR="${HOSTIR_CACHE_DIR:-/tmp/hostir-cache}"
export HOSTIR_COMMIT="${HOSTIR_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)}"
GPUS=$(python3 -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
[ "$GPUS" -ge 1 ] || { echo "run_gpu_single.sh: error: no CUDA device"; exit 1; }
DEV=$(python3 -c "import torch; print(torch.cuda.get_device_name(0).lower().replace(' ', '-'))")
R="benchmarks/results"
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
grep -a -E "passed|failed" "$OUT/gpu_tests.log" | tail -3
python3 -m benchmarks.report
