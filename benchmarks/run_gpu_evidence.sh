#!/usr/bin/env bash
# The GPU evidence in benchmarks/results/, in one go, on a 2-GPU machine (run from the repo
# root): OUT=dir HOSTIR_COMMIT=sha bash benchmarks/run_gpu_evidence.sh
# Needs python3 with torch, cupy (NCCL), mpi4py and pytest-mpi, and Open MPI's mpirun.
set -uo pipefail
OUT="${OUT:-/tmp/hostir-evidence}"; mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export HOSTIR_CACHE_DIR="${HOSTIR_CACHE_DIR:-/tmp/hostir-cache}" HOSTIR_COMMIT="${HOSTIR_COMMIT:-}"
ROOT=(); [ "$(id -u)" = 0 ] && ROOT=(--allow-run-as-root)
M=(mpirun "${ROOT[@]}" -np 2 -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST
   -x NVSHMEM_DISABLE_NVLS -x PYTHONPATH -x HOSTIR_COMMIT -x PYTHONUNBUFFERED -x HOSTIR_CACHE_DIR)
run() { echo "== $*"; timeout "$@"; }

# 1. the overlap benchmark (issue 3), stores autotuned schedules
run 240 "${M[@]}" python3 -m hostir.run pipelined_matmul --bench --autotune --iters 6 --warmup 2 \
  --out "$OUT/pipelined_matmul.json" 2>&1 | grep -a -v "Warn\|enable_symm" | tail -8
# 2. pictures of the overlap: the default schedule and the naive per-stage pipeline
for s in "ring" "pipelined --comm nccl --stages 4"; do
  run 60 "${M[@]}" python3 -m hostir.run pipelined_matmul --m 8192 --k 8192 --n 8192 \
    --dtype bfloat16 --check --schedule $s --trace "/tmp/t_${s%% *}.json" \
    --timeline "$OUT/timeline_${s%% *}.png" 2>&1 | grep -a "pipelined_matmul M"
done
# 3. the main job's check at the shapes of issue 2, default schedule
for dt in bfloat16 float32; do
  run 60 "${M[@]}" python3 -m hostir.run pipelined_matmul --m 8192 --k 8192 --n 8192 --dtype $dt \
    --check --json "$OUT/e2e.jsonl" 2>&1 | grep -a "pipelined_matmul M"
done
# 4. multi-GPU tests, then the NCCL fault scenarios (issue 7)
run 200 "${M[@]}" python3 -m pytest -q -p no:cacheprovider --color=no --with-mpi tests/multigpu \
  > "$OUT/multigpu.log" 2>&1; grep -a -E "passed|failed" "$OUT/multigpu.log" | tail -2
HOSTIR_FAULT_EVIDENCE="$OUT/faults.json" run 200 python3 -m pytest -q -p no:cacheprovider \
  --color=no tests/faults/test_faults_nccl.py > "$OUT/faults.log" 2>&1; tail -2 "$OUT/faults.log"
