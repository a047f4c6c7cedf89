#!/usr/bin/env bash
# The multi-GPU evidence in benchmarks/results/, in one go, on a 2-GPU machine (run from the
# repo root): OUT=dir HOSTIR_COMMIT=sha bash benchmarks/run_gpu_evidence.sh
# (benchmarks/run_gpu_single.sh has the single-GPU kernels.) Needs python3 with torch,
# cupy (NCCL), mpi4py and pytest-mpi, and Open MPI's mpirun. Every step writes under $OUT.
set -uo pipefail
OUT="${OUT:-/tmp/hostir-evidence}"; mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export HOSTIR_CACHE_DIR="${HOSTIR_CACHE_DIR:-/tmp/hostir-cache}" HOSTIR_COMMIT="${HOSTIR_COMMIT:-}"
ROOT=(); [ "$(id -u)" = 0 ] && ROOT=(--allow-run-as-root)
M=(mpirun "${ROOT[@]}" -np 2 -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST
   -x NVSHMEM_DISABLE_NVLS -x PYTHONPATH -x HOSTIR_COMMIT -x PYTHONUNBUFFERED -x HOSTIR_CACHE_DIR)
run() { echo "== $*"; timeout "$@"; }
quiet() { grep -a -v "Warn\|enable_symm\|warn(" ; }

# 1. multi-GPU tests (NCCL, copy engine, torch backends; TP layers; leaks)
run 240 "${M[@]}" python3 -m pytest -q -p no:cacheprovider --color=no --with-mpi tests/multigpu \
  > "$OUT/multigpu.log" 2>&1; echo "rc=$?"; grep -a -E "passed|failed" "$OUT/multigpu.log" | tail -2
# 2. the overlap benchmark (issue 3); stores autotuned schedules
run 240 "${M[@]}" python3 -m hostir.run pipelined_matmul --bench --autotune --iters 8 --warmup 2 \
  --shape-timeout 150 --json "$OUT/pipelined_matmul.json" 2>&1 | quiet > "$OUT/bench.log"
tail -9 "$OUT/bench.log"
# 3. the TP MLP block (issue 6): exact GELU (unfused), then the tanh GELU with the fused
#    ParallelMLP (cuBLASLt GELU_AUX / DGELU epilogues) first among the variants
run 200 "${M[@]}" python3 -m hostir.run train_mlp --bench --hidden 8192 --tokens 16384 \
  --json "$OUT/" 2>&1 | quiet | tail -2
run 240 "${M[@]}" python3 -m hostir.run train_mlp --bench --hidden 8192 --tokens 16384 \
  --activation gelu_tanh --json "$OUT/" 2>&1 | quiet | tail -2
# 4. a picture of the overlap: the default schedule at 8192^3
run 60 "${M[@]}" python3 -m hostir.run pipelined_matmul --m 8192 --k 8192 --n 8192 \
  --dtype bfloat16 --check --trace /tmp/t_ring.json --timeline "$OUT/timeline_ring.png" 2>&1 \
  | grep -a "pipelined_matmul M"
# 5. the main job's check at 8192^3, default schedule, bf16 and fp32
for dt in bfloat16 float32; do
  run 60 "${M[@]}" python3 -m hostir.run pipelined_matmul --m 8192 --k 8192 --n 8192 --dtype $dt \
    --check --json "$OUT/e2e.jsonl" 2>&1 | grep -a "pipelined_matmul M"
done
# 6. where the host time of an eager call goes (copy-engine ring, 2048^3)
run 60 "${M[@]}" python3 benchmarks/host_profile.py 2>&1 | quiet | head -40 > "$OUT/host_profile.txt"
head -12 "$OUT/host_profile.txt"
# 7. the TP step's kernel trace (where a step spends its time beyond its GEMMs), the staged
#    copy-engine SendRecv with large messages, and the fault scenarios (NCCL, copy engine)
run 120 "${M[@]}" python3 benchmarks/trace_tp_step.py --out "$OUT/trace_tp_step" 2>&1 | quiet | tail -3
run 150 "${M[@]}" python3 benchmarks/staged_sendrecv_stress.py --out "$OUT/staged_sendrecv_stress.json" \
  2>&1 | grep -a "rank"
HOSTIR_FAULT_EVIDENCE="$OUT/faults.json" run 400 python3 -m pytest -q -p no:cacheprovider --color=no \
  tests/faults/test_faults_nccl.py 2>&1 | tail -2
