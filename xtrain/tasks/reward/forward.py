"""The reward task's forward (``Workload.forward``): one forward of the model over a micro-batch's
2B sequences (the B chosen answers, then the B rejected ones, padded together:
``collate.PreferenceCollator``), each sequence's reward the sequence classifier's one logit at its
last token that is not padding (transformers' own pooling: the rightmost position whose id is not
the pad id), then the Bradley-Terry loss per pair (``loss``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from xtrain.tasks.reward import loss as rl

INPUTS = ("input_ids", "attention_mask")  # the model's inputs (the labels are the rows' answer masks)


@dataclass
class RewardOutput:
    """What the loop reads off a reward forward: the loss (the mean over the micro-batch's pairs),
    the per-pair statistics the evaluation gathers, and the window's metrics."""

    loss: torch.Tensor
    stats: dict[str, torch.Tensor]
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)


def rewards(model: torch.nn.Module, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """[N] rewards of the batch's sequences, in fp32."""
    logits = model(**{k: batch[k] for k in INPUTS if k in batch}, use_cache=False).logits
    return logits[:, 0].float()


@dataclass(frozen=True)
class RewardForward:
    """``Workload.forward``: the pairs' rewards and loss; ``center``: the centring coefficient."""

    center: float = 0.0

    def __call__(self, model: torch.nn.Module, batch: Mapping[str, torch.Tensor]) -> RewardOutput:
        scores = rewards(model, batch)
        n = len(scores) // 2
        stats = rl.bradley_terry(scores[:n], scores[n:], batch.get("margin"), self.center)
        return RewardOutput(stats["loss_sum"].mean(), stats, rl.reduce_tensors(stats))


def eval_stats(outputs: RewardOutput, batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``Workload.eval_batch``: the forward's per-pair statistics, as they are."""
    return outputs.stats
