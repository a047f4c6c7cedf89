"""Tensor- and sequence-parallel layers whose forward and backward run host IR programs.

- ``hostir.nn.linear``: ``ColumnParallelLinear``, ``RowParallelLinear``, ``ParallelMLP``
  (Megatron style, every collective overlapped with its GEMM); layouts and schedules are
  described there.
- ``hostir.nn.transformer``: ``ParallelTransformerBlock`` (Llama or GPT-2 style), built
  from those layers, the fused seams of ``runtime.fused`` and torch's attention.
- ``hostir.nn.graphs``: ``capture_blocks``, each block's forward and backward replayed from
  CUDA graphs (one GPU).
- ``hostir.nn.llama``: ``parallelize``, which turns an unsharded Llama-style torch block
  (``LlamaBlock`` or Hugging Face's decoder layer naming) into the parallel block, and
  ``parallelize_model``, which does so for every block of a model and shards the sequence
  at the first block and gathers it at the last (the rest of the model runs unchanged).

    >>> from hostir.nn import parallelize, LlamaBlock             # doctest: +SKIP
    >>> block = parallelize(LlamaBlock(256, heads=8, kv_heads=2, ffn=512))  # doctest: +SKIP
"""

from hostir.nn.linear import (  # noqa: F401  (the private names: tests and jobs use them)
    _PLANS, _RUNTIMES, ColumnParallelLinear, ParallelMLP, RowParallelLinear,
    _plan, _resolve, copy_engine_available, fused_mlp, sequence_rows, shard_sequence)
from hostir.nn.graphs import capture_blocks  # noqa: F401
from hostir.nn.llama import LlamaBlock, parallelize, parallelize_model  # noqa: F401
from hostir.nn.transformer import ParallelTransformerBlock  # noqa: F401

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "ParallelMLP", "fused_mlp",
           "shard_sequence", "sequence_rows", "copy_engine_available",
           "ParallelTransformerBlock", "LlamaBlock", "parallelize", "parallelize_model",
           "capture_blocks"]
