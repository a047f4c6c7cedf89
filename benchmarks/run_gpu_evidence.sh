#!/usr/bin/env bash
# The multi-GPU benchmarks and evidence, on one machine of N GPUs, from the repo root:
#   HOSTIR_COMMIT=$(git rev-parse --short HEAD) [NP=N] bash benchmarks/run_gpu_evidence.sh
# NP: the ranks, one a GPU (default: every GPU; the fault scenarios use 2 of them).
# Official results go to benchmarks/results/<bench>_<device>_x<NP>.json (the next run
# overwrites them; then `python -m benchmarks.report` regenerates docs/PERFORMANCE.md);
# logs and traces go under $OUT. benchmarks/run_gpu_single.sh has the one-GPU benches.
# Needs python3 with torch, cupy (NCCL), mpi4py and pytest-mpi, and Open MPI's mpirun.
set -uo pipefail
OUT="${OUT:-/tmp/hostir-evidence}"; mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export HOSTIR_CACHE_DIR="${HOSTIR_CACHE_DIR:-/tmp/hostir-cache}"
export HOSTIR_COMMIT="${HOSTIR_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)}"
NP="${NP:-$(python3 -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)}"
[ "$NP" -ge 2 ] || { echo "run_gpu_evidence.sh: error: needs 2 or more CUDA GPUs (NP=$NP)"; exit 1; }
DEV=$(python3 -c "import torch; from hostir.jobs.results import device_slug
print(device_slug(torch.cuda.get_device_name(0)))" 2>/dev/null)
[ -n "$DEV" ] || { echo "run_gpu_evidence.sh: error: no CUDA device"; exit 1; }
R="benchmarks/results"; SUFFIX="${DEV}_x${NP}"
ROOT=(); [ "$(id -u)" = 0 ] && ROOT=(--allow-run-as-root)
M=(mpirun "${ROOT[@]}" -np $NP -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST
   -x NVSHMEM_DISABLE_NVLS -x PYTHONPATH -x HOSTIR_COMMIT -x PYTHONUNBUFFERED -x HOSTIR_CACHE_DIR)
run() { echo "== $*"; timeout "$@"; }
quiet() { grep -a -v "Warn\|enable_symm\|warn(" ; }

# 1. multi-GPU tests (NCCL, copy engine, torch backends; TP layers; leaks)
run 240 "${M[@]}" python3 -m pytest -q -p no:cacheprovider --color=no --with-mpi tests/multigpu \
  > "$OUT/multigpu.log" 2>&1; echo "rc=$?"; grep -a -E "passed|failed" "$OUT/multigpu.log" | tail -2
# 2. the overlap benchmark; stores autotuned schedules
run 240 "${M[@]}" python3 -m hostir.run pipelined_matmul --bench --autotune --iters 8 --warmup 2 \
  --shape-timeout 150 --json "$R/pipelined_matmul_$SUFFIX.json" 2>&1 | quiet > "$OUT/bench.log"
tail -9 "$OUT/bench.log"
# 3. the TP MLP block: exact GELU (unfused), then the tanh GELU (fused ParallelMLP first)
run 200 "${M[@]}" python3 -m hostir.run train_mlp --bench --hidden 8192 --tokens 16384 \
  --json "$R/tp_mlp_$SUFFIX.json" 2>&1 | quiet | tail -2
run 240 "${M[@]}" python3 -m hostir.run train_mlp --bench --hidden 8192 --tokens 16384 \
  --activation gelu_tanh --json "$R/tp_mlp_gelu_tanh_$SUFFIX.json" 2>&1 | quiet | tail -2
# 4. the transformer layer: ours vs torch's tensor parallelism, eager and async-TP
run 100 python3 -m hostir.run warmup train_transformer --hidden 8192 --head-dim 128 --world $NP \
  2>&1 | tail -1
run 260 "${M[@]}" python3 -m hostir.run train_transformer --bench --hidden 8192 --heads 64 \
  --kv-heads 8 --tokens 8192 --layers 2 --dtype bfloat16 --iters 12 --warmup 3 \
  --json "$R/transformer_layer_$SUFFIX.json" 2>&1 | grep -a -E "bench|error"
# 5. a picture of the overlap: the default schedule at 8192^3, checked in bf16 and fp32
run 60 "${M[@]}" python3 -m hostir.run pipelined_matmul --m 8192 --k 8192 --n 8192 \
  --dtype bfloat16 --check --trace "$OUT/trace_ring.json" --timeline "$OUT/timeline_ring.png" \
  2>&1 | grep -a "pipelined_matmul M"
run 60 "${M[@]}" python3 -m hostir.run pipelined_matmul --m 8192 --k 8192 --n 8192 \
  --dtype float32 --check 2>&1 | grep -a "pipelined_matmul M"
# 6. where the host time of an eager call goes (copy-engine ring, 2048^3)
run 60 "${M[@]}" python3 benchmarks/host_profile.py 2>&1 | quiet | head -40 > "$OUT/host_profile.txt"
head -12 "$OUT/host_profile.txt"
# 7. the TP step's kernel trace (rank summaries merged into one results file)
run 120 "${M[@]}" python3 benchmarks/trace_tp_step.py --out "$OUT/trace_tp_step" 2>&1 | quiet | tail -3
python3 - "$OUT/trace_tp_step" "$R/trace_tp_step_$SUFFIX.json" <<'PY'
import datetime, glob, json, os, sys
ranks = [json.load(open(p)) for p in sorted(glob.glob(os.path.join(sys.argv[1], "trace_rank*.json")))]
if ranks:
    json.dump({"device": f"{len(ranks)}x {ranks[0]['device']}",
               "date": datetime.date.today().isoformat(), "commit": ranks[0]["commit"],
               "ranks": ranks}, open(sys.argv[2], "w"), indent=1)
PY
# 8. the staged copy-engine SendRecv with large messages, and the fault scenarios
run 150 "${M[@]}" python3 benchmarks/staged_sendrecv_stress.py \
  --json "$R/staged_sendrecv_stress_$SUFFIX.json" 2>&1 | grep -a "rank"
HOSTIR_FAULTS_JSON="$R/faults_${DEV}_x2.json" run 400 python3 -m pytest -q -p no:cacheprovider \
  --color=no tests/faults/test_faults_nccl.py 2>&1 | tail -2
python3 -m benchmarks.report
