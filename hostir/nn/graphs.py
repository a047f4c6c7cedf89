"""CUDA graphs of whole blocks, forward and backward, so a training step's host time is a
few graph launches a block instead of a launch (and its Python) a kernel.

    >>> blocks = capture_blocks(model, x_local)          # doctest: +SKIP
    >>> loss = mse(blocks(x_local), target); loss.backward(); opt.step()  # unchanged

``capture_blocks`` hands the blocks of a ``torch.nn.Sequential`` (or a list of modules)
to ``torch.cuda.make_graphed_callables``: each block's forward and its backward become a
CUDA graph, captured once on ``example`` (the first block's input: its shape, dtype and
``requires_grad``; every later block's input requires grad). After that the model runs
as before: autograd, the user's optimizer stepping the parameters in place,
``zero_grad``, checkpoints. What a graph fixes: the input shapes (a new token count
needs a new capture), the parameters (replaced tensors, not updated ones, would be
stale), and that nothing in a block synchronizes with the host.

Where it helps: a step whose GPU work starts behind its host work, as the first kernels
of each step do when the host issues them one by one (measured with the training job:
``python -m hostir.run train_transformer --bench`` times ``ours_graphed`` beside
``ours``). On the CPU, or with grad disabled, the blocks run eagerly. Collectives are not
captured yet: more than one rank is refused (the multi-GPU capture is untested).
"""

from __future__ import annotations

import torch

from hostir.errors import LoweringError


def capture_blocks(model, example: torch.Tensor, *, warmup: int = 3):
    """The model with each block's forward and backward replayed from CUDA graphs
    (a ``torch.nn.Sequential`` of the graphed blocks, the same modules and parameters).
    ``model``: a ``torch.nn.Sequential`` or a list of blocks applied in order;
    ``example``: an input of the first block like the real ones. Returns the model
    unchanged (as a ``Sequential``) off CUDA."""
    if not isinstance(model, (torch.nn.Sequential, torch.nn.ModuleList, list, tuple)):
        raise LoweringError(f"capture_blocks: expected a torch.nn.Sequential or a list of "
                            f"blocks, got {type(model).__name__}")
    if not isinstance(example, torch.Tensor):
        raise LoweringError(f"capture_blocks: expected example a torch.Tensor, got "
                            f"{type(example).__name__}")
    blocks = tuple(model)
    if not blocks:
        raise LoweringError("capture_blocks: no blocks to capture")
    if not (example.is_cuda and torch.cuda.is_available()):
        return torch.nn.Sequential(*blocks)
    for block in blocks:
        world = getattr(block, "world_size", 1)
        if world != 1:
            raise LoweringError(f"capture_blocks: {type(block).__name__} runs on {world} "
                                "ranks; capturing collectives is not supported yet (one "
                                "rank only)")
    samples = tuple((example.detach().clone().requires_grad_(example.requires_grad or i > 0),)
                    for i in range(len(blocks)))
    graphed = torch.cuda.make_graphed_callables(blocks, samples, num_warmup_iters=warmup)
    return torch.nn.Sequential(*graphed)
