"""GRPO's numbers, as pure functions of tensors: group-relative advantages and the clipped
surrogate with its three normalisations, as TRL's ``GRPOTrainer`` defines them
(trl/trainer/grpo_trainer.py: ``_generate_and_score_completions`` and ``_compute_loss``).

- advantages: a completion's reward minus its group's mean, divided (``scale_rewards``) by its
  group's standard deviation (``group``), the whole batch's (``batch``) or nothing (``none``),
  plus 1e-4; rewards are the weighted sum of the functions' rewards, a None (NaN) counting 0.
- per token: ``-min(r A, clip(r, 1 - epsilon, 1 + epsilon_high) A) + beta KL``, r the ratio to the
  old policy's probability (1 with one update per generation: old = current, detached), KL the
  k3 estimate ``exp(ref - logp) - (ref - logp) - 1``.
- normalisation over the step's global batch of N completions (T completion tokens in all):
  ``grpo``: each completion's token mean, averaged over completions; ``dr_grpo``: the token sum
  over N x max_completion_length; ``dapo``: the token sum over T.

A micro-batch's loss is scaled (``micro_batch_loss``) so that the loop's averaging over
micro-batches and processes gives exactly these global numbers at any process count.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["LossSettings", "advantages", "micro_batch_loss", "normalised", "per_token_loss"]
SCALES = ("group", "batch", "none")
STD_FLOOR = 1e-4  # TRL's: advantages / (std + 1e-4)


@dataclass(frozen=True)
class LossSettings:
    loss: str = "dapo"
    epsilon: float = 0.2
    epsilon_high: float = 0.2
    beta: float = 0.0
    max_completion_length: int = 64


def total_rewards(per_function: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """[N, F] rewards (NaN: no reward from that function) -> [N] weighted sums (NaN counts 0)."""
    return (per_function * weights.to(per_function).unsqueeze(0)).nansum(dim=1)


def group_std(rewards: torch.Tensor, generations: int) -> torch.Tensor:
    """[N] -> [N / generations]: each group's (unbiased) standard deviation."""
    return rewards.view(-1, generations).std(dim=1)


def advantages(rewards: torch.Tensor, generations: int, scale: str) -> torch.Tensor:
    """[N] rewards of consecutive groups of ``generations`` -> [N] advantages."""
    grouped = rewards.view(-1, generations)
    centred = (grouped - grouped.mean(dim=1, keepdim=True)).reshape(-1)
    if scale == "group":
        std = grouped.std(dim=1).repeat_interleave(generations)
    elif scale == "batch":
        std = rewards.std().expand_as(rewards)
    else:
        return centred
    return centred / (std + STD_FLOOR)


def per_token_loss(
    s: LossSettings,
    logps: torch.Tensor,
    old_logps: torch.Tensor | None,
    ref_logps: torch.Tensor | None,
    adv: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """([N, L] token losses, [N, L] clipped flags, [N, L] KL or None) of the completion tokens."""
    old = old_logps if old_logps is not None else logps.detach()
    ratio = torch.exp(logps - old)
    clipped = torch.clamp(ratio, 1 - s.epsilon, 1 + s.epsilon_high)
    a = adv.unsqueeze(1)
    loss = -torch.min(ratio * a, clipped * a)
    was_clipped = ((ratio < 1 - s.epsilon) & (a < 0)) | ((ratio > 1 + s.epsilon_high) & (a > 0))
    kl = None
    if s.beta != 0.0 and ref_logps is not None:
        delta = ref_logps - logps
        kl = torch.exp(delta) - delta - 1
        loss = loss + s.beta * kl
    return loss, was_clipped, kl


def normalised(
    s: LossSettings, token_loss: torch.Tensor, mask: torch.Tensor, total_tokens: float,
    row_tokens: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    """The loss of a batch taken whole (TRL's three normalisations); ``total_tokens``: dapo's
    normaliser, the completion tokens of the whole global batch (``mask.sum()`` for one batch);
    ``row_tokens``: grpo's, each completion's tokens (None: ``mask``'s rows; a sequence shard's
    rows hold part of them)."""
    mask = mask.to(token_loss)
    if s.loss == "grpo":
        rows = mask.sum(-1) if row_tokens is None else row_tokens.to(mask)
        return ((token_loss * mask).sum(-1) / rows.clamp(min=1.0)).mean()
    if s.loss == "dr_grpo":
        return (token_loss * mask).sum() / (token_loss.size(0) * s.max_completion_length)
    if s.loss == "dapo":
        return (token_loss * mask).sum() / max(total_tokens, 1.0)
    raise ValueError(f"unknown GRPO loss {s.loss}")


def micro_batch_loss(
    s: LossSettings, token_loss: torch.Tensor, mask: torch.Tensor, total_tokens: float, micro_batches: int,
    row_tokens: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    """A micro-batch's share, scaled so that the mean over the step's ``micro_batches`` (the
    loop divides by the accumulation, data parallelism averages the processes) is ``normalised``
    over the whole global batch: grpo and dr_grpo are means already (equal micro-batches); dapo's
    token sum is over the global token count, times the micro-batches the mean divides by."""
    if s.loss == "dapo":
        return normalised(s, token_loss, mask, total_tokens) * micro_batches
    return normalised(s, token_loss, mask, total_tokens, row_tokens)
