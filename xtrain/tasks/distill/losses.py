"""Distillation's losses as pure functions of the student's and the teacher's logits at the trained
positions (each position t of a sequence predicts its token t + 1), in float32
(docs/distillation.md#the-losses).

- ``on_policy`` (Thinking Machines' on-policy distillation, tinker-cookbook's
  ``incorporate_kl_penalty``): the student samples the tokens ``y``; the reverse KL of each sampled
  token, ``k = log p(y) - log q(y)`` (p the student, q the teacher), is the negative of its
  advantage (discount 0: no later token's KL), trained by the importance-sampling policy-gradient
  loss at ratio 1, ``-A exp(log p - log p_sampled)``. Here the token's loss is
  ``k.detach() * exp(log p(y) - log p(y).detach())``: its value is ``k`` (the loss curve is the
  sampled reverse KL a token) and its gradient ``k * grad log p(y)``, the score-function estimate of
  each position's reverse KL, ``sum_v p(v) (log p(v) - log q(v))``, whose expected gradient it is
  (the ``-1`` of the exact gradient has expectation 0 under p).
- ``gkd`` (TRL's ``GKDTrainer.generalized_jsd_loss``): the generalized Jensen-Shannon divergence
  between the whole distributions, ``beta`` 0: forward KL(q || p), 1: reverse KL(p || q), between:
  ``beta KL(q || m) + (1 - beta) KL(p || m)`` with ``m = beta q + (1 - beta) p``, computed with
  ``F.kl_div`` exactly as TRL does; its gradient is the exact one.

Both at temperature 1, as TRL's GKDTrainer computes its loss (``distill.temperature`` is the
sampling temperature). Besides the loss a token: the exact reverse KL of its distributions (the
curves' "KL to the teacher") and whether the student's most likely token is the teacher's.

``vocab``: where the two heads' widths differ (Qwen2.5's 0.5B and 7B: 151,936 and 152,064 rows, one
tokenizer of 151,665 tokens), both distributions over the shared tokenizer's first ``vocab``
entries; a sampled token beyond them adds no loss.

``chunked``: the sums over the trained tokens, ``rows`` positions at a time (``chunked_loss``'s
eager chunks: each chunk's gradient taken at once, its logits freed), never the logits of every
trained token at once; ``plain``: the same from whole logits (``model.chunked_loss=off``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from xtrain.model.chunked_loss import LogitMap, eager_chunk_sum

MODES = ("on_policy", "gkd")
Head = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Divergence:
    """What the loss is: ``mode`` (``MODES``), GKD's ``beta``, and the shared vocabulary's width
    (None: the heads' whole width)."""

    mode: str = "on_policy"
    beta: float = 0.5
    vocab: int | None = None


@dataclass
class Sums:
    """A micro-batch's loss summed over its K trained tokens (with its gradient), and each token's
    exact reverse KL and top-1 agreement ([K], detached)."""

    loss: torch.Tensor
    kl: torch.Tensor
    agree: torch.Tensor

    @property
    def tokens(self) -> int:
        return int(self.kl.numel())


def log_probs(logits: torch.Tensor, vocab: int | None) -> torch.Tensor:
    """float32 log-softmax over the first ``vocab`` entries (all: None)."""
    logits = logits.float()
    return torch.log_softmax(logits[..., :vocab] if vocab is not None else logits, dim=-1)


def generalized_jsd(student: torch.Tensor, teacher: torch.Tensor, beta: float) -> torch.Tensor:
    """[K] the generalized JSD of each row's distributions (log-probs ``student``, ``teacher``:
    [K, V]), as TRL's ``generalized_jsd_loss`` computes it before its reduction."""
    if beta == 0:
        return F.kl_div(student, teacher, reduction="none", log_target=True).sum(-1)
    if beta == 1:
        return F.kl_div(teacher, student, reduction="none", log_target=True).sum(-1)
    b = torch.tensor(beta, dtype=student.dtype, device=student.device)
    mixture = torch.logsumexp(torch.stack([student + torch.log1p(-b), teacher + torch.log(b)]), dim=0)
    kl_teacher = F.kl_div(mixture, teacher, reduction="none", log_target=True)
    kl_student = F.kl_div(mixture, student, reduction="none", log_target=True)
    return (b * kl_teacher + (1 - b) * kl_student).sum(-1)


def token_terms(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, targets: torch.Tensor, how: Divergence
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """([K] the loss of each token, [K] its exact reverse KL(p || q), [K] 1 where the student's
    most likely token is the teacher's; the last two detached) from [K, V] logits and the [K]
    tokens that follow (the sampled ones, on-policy)."""
    s, t = log_probs(student_logits, how.vocab), log_probs(teacher_logits.detach(), how.vocab)
    if how.mode == "on_policy":
        inside = targets < s.size(-1)
        at = targets.clamp(max=s.size(-1) - 1).unsqueeze(-1)
        lp, lq = s.gather(-1, at).squeeze(-1), t.gather(-1, at).squeeze(-1)
        k = ((lp - lq) * inside).detach()
        loss = k * torch.exp(lp - lp.detach())  # value k, gradient k * grad log p
    else:
        loss = generalized_jsd(s, t, how.beta)
    with torch.no_grad():
        kl = (s.exp() * (s - t)).sum(-1)
        agree = (s.argmax(-1) == t.argmax(-1)).float()
    return loss, kl, agree


def chunked(
    student_hidden: torch.Tensor,
    teacher_hidden: torch.Tensor,
    targets: torch.Tensor,
    heads: tuple[Head, Head],
    maps: tuple[LogitMap, LogitMap],
    how: Divergence,
    rows: int,
    params: Sequence[torch.Tensor] = (),
) -> Sums:
    """The sums over K trained tokens from the hidden states that predict them (``student_hidden``
    [K, H], ``teacher_hidden`` [K, H']), each model's head (``heads``) and what it does to its
    logits (``maps``), ``rows`` tokens a chunk: each chunk's loss gradient (to the student's hidden
    states and its trained head ``params``) taken inside the forward, its logits freed. Under no
    gradient (evaluation) no gradient is taken."""
    (s_head, t_head), (s_map, t_map) = heads, maps
    kl, agree = [], []

    def chunk(hidden: torch.Tensor, start: int) -> torch.Tensor:
        with torch.no_grad():
            teacher = t_map(t_head(teacher_hidden[start : start + rows]).float())
        student = s_map(s_head(hidden).float())
        loss, k, a = token_terms(student, teacher, targets[start : start + rows], how)
        kl.append(k)
        agree.append(a)
        return loss.sum()

    if torch.is_grad_enabled():
        total = eager_chunk_sum(student_hidden, chunk, rows, params)
    else:
        zero = student_hidden.new_zeros((), dtype=torch.float32)
        total = sum((chunk(student_hidden[i : i + rows], i) for i in range(0, targets.numel(), rows)), zero)
    empty = student_hidden.new_zeros(0, dtype=torch.float32)
    return Sums(total, torch.cat([empty, *kl]), torch.cat([empty, *agree]))


def plain(student_logits: torch.Tensor, teacher_logits: torch.Tensor, targets: torch.Tensor,
          how: Divergence) -> Sums:  # fmt: skip
    """The same sums from the whole [K, V] logits of the K trained tokens."""
    loss, kl, agree = token_terms(student_logits, teacher_logits, targets, how)
    return Sums(loss.sum(), kl, agree)
