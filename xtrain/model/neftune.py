"""NEFTune (Jain et al. 2023, "NEFTune: Noisy Embeddings Improve Instruction Finetuning"):
uniform noise in [-m, m], m = alpha / sqrt(L x d), added to the input embeddings while training
(``optim.neftune_alpha``). L is the batch's (padded) sequence length and d the embedding width,
as in the paper's code and transformers' Trainer.

A forward hook on the model's input embedding module, registered on the unwrapped model (before
accelerate wraps it: DDP runs the same module). It acts only when that module is in training mode,
so evaluation and ``xtrain predict`` see the embeddings as they are.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from xtrain.errors import XtrainError

if TYPE_CHECKING:
    from torch import Tensor
    from torch.nn import Module
    from torch.utils.hooks import RemovableHandle


class NEFTuneHook:
    """The forward hook (a class, not a closure: it says what it is in ``_forward_hooks``)."""

    def __init__(self, alpha: float) -> None:
        self.alpha = alpha
        # a sequence shard's embeddings (parallel.sequence): L is the whole sequence's, shards x its own
        self.shards = 1

    def __call__(self, module: Module, inputs: tuple[Any, ...], output: Tensor) -> Tensor:
        if not module.training:
            return output
        import torch

        length, width = output.size(-2) * self.shards, output.size(-1)
        scale = self.alpha / math.sqrt(length * width)
        return output + torch.empty_like(output).uniform_(-scale, scale)


def attach(model: Module, alpha: float) -> RemovableHandle:
    """Register NEFTune on ``model``'s input embeddings; returns the hook's handle."""
    get = getattr(model, "get_input_embeddings", None)
    embeddings = get() if callable(get) else None
    if embeddings is None:
        raise XtrainError(
            f"optim.neftune_alpha needs the model's input embeddings, and {type(model).__name__} names none",
            "leave optim.neftune_alpha unset for this model",
        )
    return embeddings.register_forward_hook(NEFTuneHook(alpha))
