"""Distillation's loss written out by hand over plain models (tests/test_distill_losses.py,
tests/test_distill.py): no xtrain code, the formulas as the issue and the docs state them."""

from __future__ import annotations

import torch


def logits_of(model, batch: dict) -> torch.Tensor:
    mask = batch["attention_mask"]
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return model(input_ids=batch["input_ids"], attention_mask=mask, position_ids=positions).logits.float()


def reference_loss(student, teacher, batch: dict, mode: str, beta: float, vocab: int | None = None):
    """(the summed loss over the trained tokens, its tokens) written out: position t's logits
    predict token t + 1; p the student's distribution, q the teacher's."""
    s_logits = logits_of(student, batch)[:, :-1, :vocab]
    with torch.no_grad():
        t_logits = logits_of(teacher, batch)[:, :-1, :vocab]
    trained = batch["labels"][:, 1:] != -100
    y = batch["input_ids"][:, 1:].clamp(max=s_logits.size(-1) - 1)  # (a token past vocab: not trained)
    log_p, log_q = torch.log_softmax(s_logits, -1), torch.log_softmax(t_logits, -1)
    p, q = log_p.exp(), log_q.exp()
    if mode == "on_policy":
        lp, lq = log_p.gather(-1, y.unsqueeze(-1)).squeeze(-1), log_q.gather(-1, y.unsqueeze(-1)).squeeze(-1)
        k = (lp - lq).detach()
        # value: the sampled reverse KL; gradient: k * grad log p(y) (the surrogate's)
        per = k + k * (lp - lp.detach())
    elif beta == 0:
        per = (q * (log_q - log_p)).sum(-1)  # forward KL(q || p)
    elif beta == 1:
        per = (p * (log_p - log_q)).sum(-1)  # reverse KL(p || q)
    else:
        log_m = torch.log(beta * q + (1 - beta) * p)
        per = beta * (q * (log_q - log_m)).sum(-1) + (1 - beta) * (p * (log_p - log_m)).sum(-1)
    return (per * trained).sum(), int(trained.sum())
