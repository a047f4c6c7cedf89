#!/usr/bin/env bash
# One process a GPU on this host (or on the nodes of a Slurm allocation):
#   launch_scripts/mpirun.sh 8 pipelined_matmul --m 16384 --n 8192 --k 8192 --check
#   launch_scripts/mpirun.sh 2 train_mlp --bench --hidden 8192 --tokens 16384
# Runs `python -m hostir.run JOB FLAGS...` on NP ranks (docs/JOBS.md lists the jobs).
# NVLink multicast stays off (NCCL_NVLS_ENABLE=0 and friends): on shared machines it can
# put the host's GPUs out of service. hostir's own variables reach every rank when they
# are set here; unset ones are not passed (Open MPI warns about each -x of an unset one).
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 NP JOB [flags...]   (e.g. $0 2 pipelined_matmul --check)" >&2
  exit 2
fi
NP="$1"; JOB="$2"; shift 2
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
ARGS=(-np "$NP")
[ "$(id -u)" = 0 ] && ARGS+=(--allow-run-as-root)
# every HOSTIR_* variable that is set (dumps, switches, flight recorder, fault injection...)
for var in NCCL_NVLS_ENABLE TORCH_SYMM_MEM_DISABLE_MULTICAST NVSHMEM_DISABLE_NVLS \
           PYTHONPATH CUDA_VISIBLE_DEVICES $(compgen -e | grep '^HOSTIR_'); do
  [ -n "${!var+set}" ] && ARGS+=(-x "$var")
done
exec mpirun "${ARGS[@]}" "${PYTHON:-python3}" -m hostir.run "$JOB" "$@"
