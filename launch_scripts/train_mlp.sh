#!/usr/bin/env bash
# The tensor-parallel MLP example, one process a GPU on this host:
#   launch_scripts/train_mlp.sh 2 --steps 30 --dtype bfloat16
#   launch_scripts/train_mlp.sh 2 --bench --hidden 8192 --tokens 16384
# NVLink multicast stays off (NCCL_NVLS_ENABLE=0 and friends): on shared machines it can
# put the host's GPUs out of service.
set -euo pipefail
NP="${1:-2}"; shift || true
ROOT=()
[ "$(id -u)" = 0 ] && ROOT=(--allow-run-as-root)
exec mpirun "${ROOT[@]}" -np "$NP" \
  -x NCCL_NVLS_ENABLE=0 -x TORCH_SYMM_MEM_DISABLE_MULTICAST=1 -x NVSHMEM_DISABLE_NVLS=1 \
  -x PYTHONPATH -x HOSTIR_DUMP -x HOSTIR_COMM_TIMEOUT -x HOSTIR_CACHE_DIR \
  "${PYTHON:-python3}" -m hostir.run train_mlp "$@"
