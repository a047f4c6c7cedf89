#!/usr/bin/env bash
# The fused-GELU MLP (issue 6) on a 2-GPU machine, from the repo root:
#   OUT=dir bash benchmarks/run_gpu_fused_mlp.sh
# 1. the cuBLASLt binding on one GPU and the fused MLP on two (fast), 2. the TP MLP bench
# with the tanh GELU (fused ParallelMLP first), then the exact-GELU bench for comparison.
set -uo pipefail
OUT="${OUT:-/tmp/hostir-evidence}"; mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export HOSTIR_CACHE_DIR="${HOSTIR_CACHE_DIR:-/tmp/hostir-cache}"
ROOT=(); [ "$(id -u)" = 0 ] && ROOT=(--allow-run-as-root)
M=(mpirun "${ROOT[@]}" -np 2 -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST
   -x NVSHMEM_DISABLE_NVLS -x PYTHONPATH -x PYTHONUNBUFFERED -x HOSTIR_CACHE_DIR)
run() { echo "== $*"; timeout "$@"; }
quiet() { grep -a -v "Warn\|enable_symm\|warn(" ; }

run 120 python3 -m pytest -q -p no:cacheprovider --color=no tests/gpu/test_cublaslt_gpu.py \
  > "$OUT/cublaslt_gpu.log" 2>&1; echo "rc=$?"; tail -3 "$OUT/cublaslt_gpu.log"
run 180 "${M[@]}" python3 -m pytest -q -p no:cacheprovider --color=no --with-mpi \
  tests/multigpu/test_parallel_mlp_gpu.py > "$OUT/parallel_mlp_gpu.log" 2>&1; echo "rc=$?"
grep -a -E "passed|failed|Error" "$OUT/parallel_mlp_gpu.log" | tail -4
run 240 "${M[@]}" python3 -m hostir.run train_mlp --bench --hidden 8192 --tokens 16384 \
  --activation gelu_tanh --json "$OUT/" 2>&1 | quiet > "$OUT/tp_mlp_gelu_tanh.log"; tail -1 "$OUT/tp_mlp_gelu_tanh.log"
run 200 "${M[@]}" python3 -m hostir.run train_mlp --bench --hidden 8192 --tokens 16384 \
  --json "$OUT/" 2>&1 | quiet > "$OUT/tp_mlp_gelu.log"; tail -1 "$OUT/tp_mlp_gelu.log"
