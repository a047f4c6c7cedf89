"""Matmul specs -> CUDA C++ for tensor cores (mma.sync m16n8k16, ldmatrix, cp.async).

A CTA computes a BM x BN tile of C over a range of K ("slice"). Warps split the tile
into WARPS_M x WARPS_N warp tiles; shared memory holds STAGES tiles of A and B fed by
cp.async so that loads of stage k+STAGES-1 overlap the MMAs of stage k. Shared memory
rows are XOR-swizzled by 16-byte chunk so that ldmatrix over 8 rows hits 8 distinct bank
groups.

Layouts:
  TN: C[M,N] = A[M,K] @ B[N,K]^T  (both K-contiguous, like torch.nn.functional.linear)
  NN: C[M,N] = A[M,K] @ B[K,N]    (B row-major, N-contiguous; ldmatrix.trans reads it)

Split-K modes:
  none:     one CTA per tile, epilogue straight from registers.
  serial:   the `split_k` slices of a tile run as consecutive CTAs and take turns through
            an int semaphore (from the zeroed arena, runtime/workspace.py): slice s waits
            until the semaphore reads s, adds the fp32 partial of slices < s from the
            workspace, and either stores the running sum and releases s+1, or (the last
            slice) applies the epilogue, writes C and puts the semaphore back to 0. One
            launch, no memset: the arena is zero before and after.
  parallel: every slice stores its fp32 partial to workspace[slice]; a second kernel sums
            the slices and applies the epilogue. Two launches, nothing to zero.
  cluster:  (Hopper, the non-persistent wgmma feeds) the `split_k` slices of a tile are
            the CTAs of one thread-block cluster. Each stages its fp32 partial in its own
            shared memory; after a cluster barrier, CTA r sums rows r/split_k of the
            tile over every CTA's partial through distributed shared memory, applies the
            epilogue and writes C. One launch, no workspace, no semaphore: the partials
            never leave the GPC. The cluster size is compiled in (`__cluster_dims__`), so
            unlike the other modes split_k is part of the source.

Example:
    >>> spec = MatmulSpec(a_dtype="bf16", b_dtype="bf16", out_dtype="bf16", layout="TN")
    >>> src = render(spec)
    >>> src.launch(1024, 2048, 4096).grid
    (128, 1, 1)

The package, by concern: `spec` (the spec, its validation and launch geometry),
`snippets` (the device functions), `bodies` (the kernel body parts per feed) and
`renderer`. The names importers use are re-exported here. The tile and split-K
heuristic is `lowering.kernels.heuristics`.
"""

from lowering.kernels.matmul.bodies import BODIES, MMA_INSTR, SNIPPET_NAMES, WGMMA_TYPE
from lowering.kernels.matmul.renderer import RENDERER, render
from lowering.kernels.matmul.snippets import MATMUL_SNIPPETS
from lowering.kernels.matmul.spec import (
    C_BOX, C_BOX_BYTES, CLUSTER_SPLITS, CPAD, DEFAULT_SM_COUNT, FEED_SUFFIX, GROUP_M, IN_DTYPES,
    INSTRS, LAYOUTS, MAX_SMEM_BYTES, MODE_CODE, OUT_DTYPES, PRODUCER_WARPS, REDUCE_THREADS,
    SPLIT_MODES, SWIZZLE_ALIGN, TENSOR_MAP_BYTES, TMA_PRODUCER_WARPS, KernelSource, LaunchConfig, MatmulSpec,
    launch_config, reduce_launch, supports_wgmma, tail_tiles, tiles,
)
