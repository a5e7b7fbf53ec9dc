"""The preference losses as pure functions over per-sequence log-probabilities.

Inputs are what one forward gives per sequence: the summed log-probability of its answer tokens
(the labels that are not -100) and how many tokens that was. A paired batch of B pairs holds 2B
sequences, the B chosen answers first, then the B rejected ones in the same order; an unpaired
(KTO) batch holds B completions and the B mismatched completions its KL estimate reads.

Each loss returns per-example statistics (tensors of shape [B]) that the loop's window averages
and the evaluation gathers: ``loss_sum`` (the example's loss), ``count``, the implicit rewards
of chosen and rejected answers with how many of each the example holds (``chosen_n``,
``rejected_n``: 1 for a pair, 1 or 0 for a KTO row), their policy log-probabilities, ``correct``
(1: the chosen reward is the higher; 0.5 on a tie, so an untrained policy scores chance, 0.5),
and ``gap``: the reference's log-probability minus the policy's, averaged over the answers
(positive: the policy moved probability away from both, the pattern of a broken run), and
``nll_sum``/``nll_tokens``: the chosen answer's negative log-likelihood and its token count (0 for
a KTO row that is not desirable), whose ratio over a batch is the metric ``nll/chosen``; ``nll_sum``
keeps its gradient: in training it is the SFT term's token sum (``sft_weight``, below).

The formulas are the papers' as TRL writes them (trl/trainer/dpo_trainer.py, cpo_trainer.py,
orpo_trainer.py, kto_trainer.py), facts not code:

- DPO: ``z = (pi_c - pi_r) - (ref_c - ref_r)``,
  ``loss = -(1 - eps) log sigmoid(beta z) - eps log sigmoid(-beta z)`` (eps: label smoothing)
- IPO: the same ``z`` over length-averaged log-probs, ``loss = (z - 1 / (2 beta))^2``
- ORPO: ``loss = NLL(chosen) - lambda log sigmoid(log odds(c) - log odds(r))`` with
  ``log odds(p) = log p - log(1 - p)`` on length-averaged log-probs; no reference
- SimPO: ``z = mean_c - mean_r - gamma / beta``, the DPO form over it; no reference
- KTO: ``KL = max(0, mean(pi_kl - ref_kl))`` (no gradient), desirable rows
  ``1 - sigmoid(beta (r - KL))``, undesirable rows ``1 - sigmoid(beta (KL - r))``, with
  ``r = pi - ref`` of the row's completion. TRL averages the KL term over every process's
  micro-batch (``gather_for_metrics(kl).mean()``); in training xtrain averages it over the step's
  whole global batch (every process, every micro-batch of the accumulation window:
  ``reference.PreferenceForward.step_start``), which no process count changes.
- The SFT term (``sft_weight``, TRL's ``rpo_alpha``, LLaMA-Factory's ``pref_ftx``):
  ``loss + sft_weight * NLL``, with ``NLL`` the cross-entropy over every chosen token,
  ``-sum(pi_c) / sum(n_c)`` (the mean over the tokens, not over the answers). In training the sums
  run over the whole step (every micro-batch, every process: ``sft_weight * nll_sum`` is the
  forward's ``token_sum``, ``sft_tokens`` its count, xtrain/train/step_loss.py), where TRL's
  ``nll_loss`` takes each micro-batch's. Here, in a batch's own statistics (evaluation), each pair
  carries its share, ``-pi_c * B / sum(n_c)``, so the mean over the B pairs is the batch's term.
  KTO: over the desirable rows' completions. ORPO's loss holds the NLL already (the task's validate
  refuses a weight on top).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

LOSSES = ("dpo", "ipo", "orpo", "simpo", "kto")
REFERENCE_FREE = ("orpo", "simpo")
UNPAIRED = ("kto",)
IGNORE_INDEX = -100


@dataclass(frozen=True)
class LossSettings:
    """The ``preference:`` section's numbers, as the loss reads them."""

    loss: str = "dpo"
    beta: float = 0.1
    orpo_lambda: float = 0.1
    gamma: float = 0.5
    label_smoothing: float = 0.0
    desirable_weight: float = 1.0
    undesirable_weight: float = 1.0
    sft_weight: float = 0.0


def needs_reference(loss: str) -> bool:
    return loss not in REFERENCE_FREE


def sequence_logps(
    logits: torch.Tensor, labels: torch.Tensor, shifted: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed log-probability of each row's labelled tokens, their count): logits [N, T, V]
    predict labels [N, T] shifted by one (position t's logits predict token t + 1; ``shifted``:
    the labels are so already, a sequence shard's), -100 skipped. The log-softmax is taken as
    ``logit - logsumexp`` at the labels only, in fp32."""
    logits = logits.float() if shifted else logits[:, :-1, :].float()
    target = labels if shifted else labels[:, 1:]
    mask = target != IGNORE_INDEX
    safe = target.masked_fill(~mask, 0)
    picked = torch.gather(logits, 2, safe.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    return (picked * mask).sum(-1), mask.sum(-1)


def _halves(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    n = t.shape[0] // 2
    return t[:n], t[n:]


def _dpo_form(z: torch.Tensor, beta: float, smoothing: float) -> torch.Tensor:
    return -(1 - smoothing) * F.logsigmoid(beta * z) - smoothing * F.logsigmoid(-beta * z)


def sft_shares(logps: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Each answer's share of the micro-batch's token-mean NLL (TRL's ``nll_loss``): ``-logp * B /
    tokens``, whose mean over the B answers is ``-sum(logps) / sum(counts)``. ``counts`` 0 leaves
    an answer out (a KTO row that is not desirable)."""
    tokens = counts.to(logps.dtype).sum().clamp(min=1)
    return -logps * (counts > 0).to(logps.dtype) * len(logps) / tokens


def sft_tokens(batch: dict[str, torch.Tensor]) -> int:
    """The SFT term's trained tokens of a collated micro-batch of 2B sequences, on the host
    (``Workload.trained_tokens``): the labelled tokens (after the next-token shift) of the first B,
    the chosen answers (KTO: the completions of the desirable rows), as ``sequence_logps`` counts."""
    labels = batch["labels"]
    shifted = batch.get("shift_labels")  # a sequence shard's: shifted before the cut, its own tokens
    half = len(labels) // 2
    chosen = shifted[:half] if shifted is not None else labels[:half, 1:]
    per_row = (chosen != IGNORE_INDEX).sum(-1)
    if "desirable" in batch:
        per_row = per_row * batch["desirable"].to(per_row.dtype)
    return int(per_row.sum())


def _correct(chosen: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    return (chosen > rejected).float() + 0.5 * (chosen == rejected).float()


def paired_loss(
    s: LossSettings,
    logps: torch.Tensor,
    counts: torch.Tensor,
    ref_logps: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Per-pair statistics of DPO, IPO, ORPO or SimPO over 2B sequences (chosen, then rejected):
    ``logps``/``counts`` of the policy, ``ref_logps`` of the reference (None for ORPO/SimPO)."""
    pc, pr = _halves(logps)
    nc, nr = (c.clamp(min=1).to(logps.dtype) for c in _halves(counts))
    mc, mr = pc / nc, pr / nr  # length-averaged log-probs
    ones = torch.ones_like(pc)
    gap = torch.zeros_like(pc)
    if s.loss in ("dpo", "ipo"):
        if ref_logps is None:
            raise ValueError(f"{s.loss} needs the reference log-probabilities")
        rc, rr = _halves(ref_logps.to(logps.dtype))
        if s.loss == "dpo":
            z = (pc - pr) - (rc - rr)
            losses = _dpo_form(z, s.beta, s.label_smoothing)
            reward_c, reward_r = s.beta * (pc - rc), s.beta * (pr - rr)
        else:
            z = (mc - mr) - (rc / nc - rr / nr)
            losses = (z - 1 / (2 * s.beta)) ** 2
            reward_c, reward_r = s.beta * (mc - rc / nc), s.beta * (mr - rr / nr)
        gap = ((rc - pc) + (rr - pr)) / 2
    elif s.loss == "orpo":
        log_odds = (mc - mr) - (torch.log1p(-torch.exp(mc)) - torch.log1p(-torch.exp(mr)))
        losses = -mc - s.orpo_lambda * F.logsigmoid(log_odds)
        reward_c, reward_r = s.orpo_lambda * mc, s.orpo_lambda * mr
    elif s.loss == "simpo":
        z = (mc - mr) - s.gamma / s.beta
        losses = _dpo_form(z, s.beta, s.label_smoothing)
        reward_c, reward_r = s.beta * mc, s.beta * mr
    else:
        raise ValueError(f"{s.loss} is not a paired loss")
    if s.sft_weight:
        if s.loss == "orpo":
            raise ValueError("orpo's loss holds the chosen answers' NLL already")
        losses = losses + s.sft_weight * sft_shares(pc, _halves(counts)[0])
    reward_c, reward_r = reward_c.detach(), reward_r.detach()
    return {
        "loss_sum": losses,
        "count": ones,
        "reward_chosen": reward_c,
        "reward_rejected": reward_r,
        "chosen_n": ones,
        "rejected_n": ones,
        "logp_chosen": pc.detach(),
        "logp_rejected": pr.detach(),
        "correct": _correct(reward_c, reward_r),
        "gap": gap.detach(),
        "nll_sum": -pc,  # (with its gradient: the SFT term's token sum in training)
        "nll_tokens": _halves(counts)[0].to(pc.dtype),
    }


def kto_kl(pol_kl: torch.Tensor, ref_kl: torch.Tensor) -> torch.Tensor:
    """KTO's KL estimate from the mismatched completions' log-probs: ``max(0, mean(pi - ref))``,
    without gradient."""
    return (pol_kl - ref_kl.to(pol_kl.dtype)).mean().clamp(min=0).detach()


def kto_loss(
    s: LossSettings,
    logps: torch.Tensor,
    ref_logps: torch.Tensor,
    desirable: torch.Tensor,
    kl: torch.Tensor | None = None,
    counts: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Per-row KTO statistics; ``desirable`` [B] is 1 for a desirable row, 0 otherwise. Without
    ``kl``, ``logps``/``ref_logps`` (and ``counts``, their token counts) hold 2B sequences (the B
    completions, then the B mismatched completions the KL estimate reads: the micro-batch's own
    estimate); with ``kl`` (an estimate over a larger batch, ``kto_kl``), the B completions only.
    ``counts`` None: no NLL statistics (and no SFT term)."""
    if kl is None:
        pol, pol_kl = _halves(logps)
        ref, ref_kl = _halves(ref_logps)
        kl = kto_kl(pol_kl, ref_kl)
        counts = None if counts is None else _halves(counts)[0]
    else:
        pol, ref = logps, ref_logps
    ref = ref.to(logps.dtype)
    kl = kl.to(logps.dtype)
    ratio = pol - ref
    good = desirable.to(logps.dtype)
    bad = 1 - good
    losses = good * s.desirable_weight * (1 - torch.sigmoid(s.beta * (ratio - kl)))
    losses = losses + bad * s.undesirable_weight * (1 - torch.sigmoid(s.beta * (kl - ratio)))
    tokens = torch.zeros_like(pol) if counts is None else counts.to(pol.dtype) * good
    if s.sft_weight:
        if counts is None:
            raise ValueError("the SFT term needs the completions' token counts")
        losses = losses + s.sft_weight * sft_shares(pol, tokens)
    reward = (s.beta * ratio).detach()
    # a row "ranks right" when its reward's sign matches its label (0.5 at reward 0: chance)
    zero = torch.zeros_like(reward)
    correct = good * _correct(reward, zero) + bad * _correct(-reward, zero)
    return {
        "loss_sum": losses,
        "count": torch.ones_like(losses),
        "reward_chosen": reward * good,
        "reward_rejected": reward * bad,
        "chosen_n": good,
        "rejected_n": bad,
        "logp_chosen": pol.detach() * good,
        "logp_rejected": pol.detach() * bad,
        "correct": correct,
        "gap": (ref - pol).detach(),
        "kl": kl.expand_as(losses),
        "nll_sum": -pol * (tokens > 0),  # (with its gradient, as paired_loss's)
        "nll_tokens": tokens,
    }


def reduce(stats: dict[str, torch.Tensor]) -> dict[str, float]:
    """Per-example statistics (one micro-batch's, a whole gathered eval set's, or their sums over a
    logging window: ``window_metrics``) -> the metrics:
    ``rewards/chosen``, ``rewards/rejected``, ``rewards/accuracy``, ``rewards/margin``,
    ``logps/chosen``, ``logps/rejected``, ``logps/gap``, ``nll/chosen`` (the chosen answers'
    NLL per token; KTO: the desirable rows') and KTO's ``kl``."""
    return {k: float(v) for k, v in reduce_tensors(stats).items()}


# the per-example statistics ``reduce`` reads (the loss is the loop's)
REDUCED = ("count", "chosen_n", "rejected_n", "reward_chosen", "reward_rejected", "correct",
           "logp_chosen", "logp_rejected", "gap", "nll_sum", "nll_tokens", "kl")  # fmt: skip


def sums(stats: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A micro-batch's per-example statistics summed, without gradients: what the loop's logging
    window adds up over its micro-batches and processes (``Workload.forward``'s ``.metrics``)."""
    return {k: v.detach().float().sum() for k, v in stats.items() if k in REDUCED}


def window_metrics(summed: dict[str, torch.Tensor], micro_batches: int) -> dict[str, float]:
    """``Workload.window_metrics``: a logging window's summed statistics -> its metrics, by the
    same ``reduce`` as an evaluation's over its whole eval set (a window of KTO rows, where the
    micro-batches hold different numbers of desirable rows, weighs every row alike)."""
    return reduce(summed)


def reduce_tensors(stats: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``reduce`` on the device, without a host sync (the loop's logging window)."""
    cn = stats["chosen_n"].float().sum().clamp(min=1)
    rn = stats["rejected_n"].float().sum().clamp(min=1)
    count = stats["count"].float().sum().clamp(min=1)
    reward_c = stats["reward_chosen"].float().sum() / cn
    reward_r = stats["reward_rejected"].float().sum() / rn
    out = {
        "rewards/chosen": reward_c,
        "rewards/rejected": reward_r,
        "rewards/accuracy": stats["correct"].float().sum() / count,
        "rewards/margin": reward_c - reward_r,
        "logps/chosen": stats["logp_chosen"].float().sum() / cn,
        "logps/rejected": stats["logp_rejected"].float().sum() / rn,
        "logps/gap": stats["gap"].float().sum() / count,
    }
    if "nll_sum" in stats:
        out["nll/chosen"] = stats["nll_sum"].float().sum() / stats["nll_tokens"].float().sum().clamp(min=1)
    if "kl" in stats:
        out["kl"] = stats["kl"].float().sum() / count
    return out
