"""The reward model's loss as pure functions over each pair's two rewards (docs/reward-models.md).

A pair's rewards are the model's scalar outputs for the chosen and the rejected answer after the
same prompt (``r_c``, ``r_r``). Its loss is the Bradley-Terry negative log-likelihood that the
chosen answer is preferred, as TRL's RewardTrainer writes it (trl/trainer/reward_trainer.py),
facts not code:

- ``loss = -log sigmoid(r_c - r_r - margin)``: ``margin`` a number per pair when the data has one
  (``reward.margin_column``, Llama 2's), else 0;
- ``+ coef * (r_c + r_r)^2`` with ``coef`` = ``reward.center_rewards_coefficient`` (Eisenstein et
  al.'s auxiliary term, TRL's ``center_rewards_coefficient``): it pulls the rewards towards 0, so
  their scale stays comparable between models and runs.

TRL takes the mean of each term over a micro-batch's pairs; the sum of both per pair, averaged,
is the same number. Here each pair's loss is its own (``loss_sum``), so a step's loss is the mean
over the step's pairs at any split of the batch (xtrain/train/step_loss.py's per-sequence mode).

Statistics per pair (tensors of shape [B]) for the loop's window and the evaluation: the two
rewards, ``correct`` (1 when the chosen reward is the higher; 0.5 on a tie, so an untrained model
scores chance) and ``count``. Reduced: ``rewards/accuracy``, ``rewards/margin`` (the mean of
``r_c - r_r``), ``rewards/chosen``, ``rewards/rejected``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def bradley_terry(
    chosen: torch.Tensor,
    rejected: torch.Tensor,
    margin: torch.Tensor | None = None,
    center: float = 0.0,
) -> dict[str, torch.Tensor]:
    """Per-pair statistics of the rewards ``chosen`` and ``rejected`` ([B] each, in fp32):
    ``loss_sum`` (with its gradient), ``count``, the rewards and ``correct``."""
    diff = chosen - rejected
    losses = -F.logsigmoid(diff - margin.to(diff)) if margin is not None else -F.logsigmoid(diff)
    if center:
        losses = losses + center * (chosen + rejected) ** 2
    d = diff.detach()
    return {
        "loss_sum": losses,
        "count": torch.ones_like(losses),
        "reward_chosen": chosen.detach(),
        "reward_rejected": rejected.detach(),
        "correct": (d > 0).to(d.dtype) + 0.5 * (d == 0).to(d.dtype),
    }


def reduce_tensors(stats: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The metrics of per-pair statistics, on the device (the loop's logging window)."""
    count = stats["count"].float().sum().clamp(min=1)
    chosen = stats["reward_chosen"].float().sum() / count
    rejected = stats["reward_rejected"].float().sum() / count
    return {
        "rewards/accuracy": stats["correct"].float().sum() / count,
        "rewards/margin": chosen - rejected,
        "rewards/chosen": chosen,
        "rewards/rejected": rejected,
    }


def reduce(stats: dict[str, torch.Tensor]) -> dict[str, float]:
    """``reduce_tensors`` as numbers (an evaluation's gathered statistics)."""
    return {k: float(v) for k, v in reduce_tensors(stats).items()}
