#!/usr/bin/env bash
# The single-GPU evidence (generated kernels). With two GPUs the matmul work runs on GPU 0
# and the normalization work on GPU 1, side by side; with one, one after the other
# (run from the repo root):
#   OUT=dir HOSTIR_COMMIT=sha bash benchmarks/run_gpu_single.sh
set -uo pipefail
OUT="${OUT:-/tmp/hostir-evidence}"; mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export HOSTIR_CACHE_DIR="${HOSTIR_CACHE_DIR:-/tmp/hostir-cache}" HOSTIR_COMMIT="${HOSTIR_COMMIT:-}"
GPUS=$(python3 -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
matmul_work() {
  echo "== wgmma check"; timeout 200 python3 benchmarks/gpu_wgmma_check.py --out "$OUT/wgmma.json" \
    > "$OUT/wgmma.log" 2>&1; echo "rc=$?"
  echo "== matmul bench"; timeout 300 python3 -m hostir.run matmul --bench --tune \
    --json "$OUT/matmul.json" > "$OUT/matmul.log" 2>&1; echo "rc=$?"
  echo "== split-K: parallel, serial and cluster side by side"; timeout 150 python3 \
    benchmarks/split_k_probe.py --out "$OUT/split_k_probe.json" > "$OUT/split_k_probe.log" 2>&1; echo "rc=$?"
  echo "== matmul host time a call"; timeout 120 python3 benchmarks/matmul_host_probe.py \
    --out "$OUT/matmul_host_probe.json" > "$OUT/matmul_host_probe.log" 2>&1; echo "rc=$?"
  echo "== 256x4096x16384 on same, rotated and flushed inputs"; timeout 200 python3 \
    benchmarks/skinny_probe.py --out "$OUT/skinny_probe.json" > "$OUT/skinny_probe.log" 2>&1; echo "rc=$?"
}
norm_work() {
  echo "== layer_norm bench"; timeout 240 python3 -m hostir.run layer_norm --bench --sweep \
    --json "$OUT/layer_norm.json" > "$OUT/layer_norm.log" 2>&1; echo "rc=$?"
  echo "== normalization with fewer 1-D tensors"; timeout 120 python3 benchmarks/norm_params_probe.py \
    --out "$OUT/norm_params_probe.json" > "$OUT/norm_params_probe.log" 2>&1; echo "rc=$?"
  echo "== 16-bit pair adds off/on"; timeout 120 python3 benchmarks/norm_flag_probe.py --flag PACKED_HEAD \
    --out "$OUT/norm_flag_PACKED_HEAD.json" > "$OUT/norm_flag.log" 2>&1; echo "rc=$?"
  echo "== normalization host time a call"; timeout 120 python3 benchmarks/norm_host_probe.py \
    --out "$OUT/norm_host_probe.json" > "$OUT/norm_host_probe.log" 2>&1; echo "rc=$?"
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
