"""The matmul renderer: a spec -> the CUDA C++ of its kernel and its split-K reduction.

The prelude (type aliases, the spec's constants, dtype macros) comes from the spec;
every other line from the tables of `snippets` (device functions) and `bodies` (the
kernel body in parts), assembled by the shared `lowering.kernels.render.Renderer`.
"""

from __future__ import annotations

from lowering.kernels.matmul.bodies import (
    BODIES, CLUSTER_EPILOGUE, EPILOGUE, MMA_INSTR, REDUCE_BODY, SNIPPET_NAMES, WGMMA_TYPE,
)
from lowering.kernels.matmul.snippets import MATMUL_SNIPPETS
from lowering.kernels.matmul.spec import (
    C_BOX, C_BOX_BYTES, CPAD, DEFAULT_SM_COUNT, FEED_SUFFIX, GROUP_M, MODE_CODE, REDUCE_THREADS,
    SWIZZLE_ALIGN, TENSOR_MAP_BYTES, KernelSource, MatmulSpec, launch_config, reduce_launch,
)
from lowering.kernels.render import FROM_FLOAT, PACK2, TO_FLOAT, Renderer

RENDERER = Renderer(extra=MATMUL_SNIPPETS)


def _prelude(spec: MatmulSpec) -> str:
    """Type aliases, the spec's constants and the dtype-specific macros."""
    wtm, wtn = spec.tile_m // spec.warps_m, spec.tile_n // spec.warps_n
    if spec.instr == "wgmma":
        # Each warpgroup: WG_ROWS rows = MI stacked m64 wgmmas of the CTA's full BN.
        wg_rows = spec.tile_m if spec.pingpong else spec.tile_m // spec.warpgroups
        tiling = {"WG_ROWS": wg_rows, "MI": wg_rows // 64, "NACC": spec.tile_n // 2,
                  "PINGPONG": spec.pingpong,
                  "SWIZZLE_ALIGN": SWIZZLE_ALIGN, "CONSUMER_WARPS": spec.warps,
                  "PRODUCER_WARPS": spec.producer_warps, "USE_TMA": spec.tma,
                  "FULL_ARRIVALS": 1 if spec.tma else spec.producer_warps * 32,
                  "TENSOR_MAP_BYTES": TENSOR_MAP_BYTES,
                  "C_STAGED": spec.c_staged, "C_BOX": C_BOX, "C_BOX_BYTES": C_BOX_BYTES}
    else:
        tiling = {"WTM": wtm, "WTN": wtn, "MI": wtm // 16, "NI": wtn // 8}
    consts = {
        "BM": spec.tile_m, "BN": spec.tile_n, "BK": spec.tile_k,
        "WARPS_M": spec.warps_m, "WARPS_N": spec.warps_n, "THREADS": spec.threads,
        "STAGES": spec.stages, **tiling,
        "STAGE_ELEMS": (spec.tile_m + spec.tile_n) * spec.tile_k, "CLD": spec.tile_n + CPAD,
        "GROUP_M": GROUP_M, "CLUSTER_M": spec.cluster_m, "CLUSTER_K": spec.cluster_k,
        "MODE_NONE": MODE_CODE["none"],
        "MODE_SERIAL": MODE_CODE["serial"], "MODE_PARALLEL": MODE_CODE["parallel"],
        "MODE_TAIL": MODE_CODE["tail"],
        "B_KMAJOR": spec.layout == "TN",
        "OUT_IS_F32": spec.out_dtype == "fp32",
    }
    out = spec.out_dtype
    macros = [
        f'#define MMA_INSTR "{MMA_INSTR[spec.a_dtype]}"',
        f"#define TO_FLOAT_OUT {TO_FLOAT[out]}",
        f"#define FROM_FLOAT_OUT {FROM_FLOAT[out]}",
        # fp32 output never packs; the name only has to compile in the discarded branch.
        f"#define PACK2_OUT {PACK2.get(out, 'pack_bf16x2')}",
    ]
    return "\n".join([RENDERER.typedefs({"in_t": spec.a_dtype, "out_t": out}),
                      RENDERER.constants(consts), *macros])


def _snippet(name: str, spec: MatmulSpec) -> str:
    """A snippet of the table, with the wgmma instruction's operand list filled in."""
    text = RENDERER.snippet(name)
    if name != "wgmma_instr":
        return text
    n = spec.tile_n
    regs = n // 2
    fields = {"N": str(n), "TYPE": WGMMA_TYPE[spec.a_dtype],
              "REGS": ", ".join(f"%{i}" for i in range(regs)),
              "OPERANDS": ", ".join(f'"+f"(d[{i}])' for i in range(regs)),
              "IDX_A": str(regs), "IDX_B": str(regs + 1), "IDX_SCALE": str(regs + 2)}
    for key, value in fields.items():
        text = text.replace(f"@{key}@", value)
    return text


# A CUtensorMap by value: the TMA takes the parameter's own (generic) address, so the maps
# need no device buffer, and a launch under stream capture records them with its
# arguments.
MAP_PARAM = "const __grid_constant__ TensorMap"


def _params(spec: MatmulSpec) -> list[tuple[str, str]]:
    return [("const in_t* __restrict__", "A"), ("const in_t* __restrict__", "B"),
            ("out_t* __restrict__", "C"), ("const out_t* __restrict__", "bias"),
            ("float*", "ws"), ("int*", "sems"), ("int", "M"), ("int", "N"), ("int", "K"),
            ("int", "lda"), ("int", "ldb"), ("int", "ldc"), ("int", "split"),
            ("int", "mode")] + [(MAP_PARAM, f"map_{x}") for x in "ab" if spec.tma] + (
                [(MAP_PARAM, "map_c"), ("int", "c_tma")] if spec.persistent else [])


def _reduce_params() -> list[tuple[str, str]]:
    return [("const float* __restrict__", "ws"), ("out_t* __restrict__", "C"),
            ("const out_t* __restrict__", "bias"), ("int", "M"), ("int", "N"),
            ("int", "ldc"), ("int", "split")]


def render(spec: MatmulSpec) -> KernelSource:
    """CUDA C++ for `spec`: the matmul kernel and its split-K reduction kernel.

    The source depends only on `spec.source_key` (dtypes, layout, tile, warps, stages,
    instruction; wgmma sources compile for sm_90a only, see `MatmulSpec.arch`):
    split mode, split factor and bias are kernel arguments, so one compiled module serves
    every mode and CI can compile every variant.

    Matmul kernel parameters, in order: A, B, C, bias (null: none), ws (fp32 workspace,
    split-K only), sems (zeroed ints, one per output tile, serial only), M, N, K, lda,
    ldb, ldc, split, mode (0 none, 1 serial, 2 parallel, 3 cluster, 4 tail); TMA kernels add
    map_a and map_b (the CUtensorMaps of A and B, TENSOR_MAP_BYTES each, by value); persistent ones
    map_c and c_tma (1, `c_staged` kernels only: map_c is C's, and unsplit units store C
    by TMA; else map_c is not read).
    Reduction kernel: ws, C, bias, M, N, ldc, split.
    """
    name = spec.kernel_name
    reduce_name = name + "_reduce"
    kind = spec.instr + FEED_SUFFIX[spec.feed]
    parts, snippets = BODIES[kind], SNIPPET_NAMES[kind]
    if spec.cluster_k > 1:  # the tile's slices sum in the cluster, not through memory
        parts = tuple(CLUSTER_EPILOGUE if p is EPILOGUE else p for p in parts)
        # cluster_sync lives in the mbarrier snippet, which the plain wgmma feed lacks
        snippets += tuple(n for n in ("mbarrier", "dsmem") if n not in snippets)
    body = "".join(parts)
    source = RENDERER.source(
        [], _prelude(spec),
        *[_snippet(s, spec) for s in snippets],
        RENDERER.kernel(name, _params(spec), body, threads=spec.threads,
                        cluster=spec.cluster_size),
        RENDERER.kernel(reduce_name, _reduce_params(), REDUCE_BODY, threads=REDUCE_THREADS))

    return KernelSource(spec=spec, source=source, kernel_name=name, reduce_name=reduce_name,
                        launch=lambda M, N, K, sms=DEFAULT_SM_COUNT: launch_config(spec, M, N, K, sms),
                        reduce_launch=reduce_launch)
