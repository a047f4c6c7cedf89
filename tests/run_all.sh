#!/usr/bin/env bash
# The whole test suite: unit (no GPU), MPI on 2 and 4 CPU ranks, GPU and multi-GPU tests
# (these skip cleanly without CUDA). Exits non-zero on any failure, and on "no tests".
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-python}"
# mpirun as root and with more ranks than cores (CI machines have 2): Open MPI 4 and 5.
if [ "$(id -u)" = 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
export PRTE_MCA_rmaps_default_mapping_policy=:oversubscribe OMPI_MCA_rmaps_base_oversubscribe=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export HOSTIR_CACHE_DIR="${HOSTIR_CACHE_DIR:-$(mktemp -d)}"
PYTEST=(-q -p no:cacheprovider --color=no)

echo "== multigpu, 2 ranks (skips without 2 GPUs)"
timeout 900 mpirun -np 2 "$PY" -m pytest "${PYTEST[@]}" --with-mpi tests/multigpu
echo "== unit + gpu (single process)"
"$PY" -m pytest "${PYTEST[@]}" tests/unit tests/gpu
for np in 2 4; do
  echo "== mpi, $np ranks"
  timeout 900 mpirun -np "$np" "$PY" -m pytest "${PYTEST[@]}" --with-mpi tests/mpi
done
echo "== the main job, 2 CPU ranks"
timeout 300 mpirun -np 2 "$PY" -m hostir.run pipelined_matmul --device cpu --check --dtype bfloat16 --stages 2
echo "== faults: one mpirun job per fault, launched by a plain pytest (2 and 4 CPU ranks)"
"$PY" -m pytest "${PYTEST[@]}" tests/faults
echo "all tests passed"
