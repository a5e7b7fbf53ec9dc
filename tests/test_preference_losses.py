"""The preference losses against their formulas written out by hand, on small tensors."""

from __future__ import annotations

import math

import pytest
import torch

from xtrain.tasks.preference import losses as pl

# two pairs: policy and reference summed log-probs of (chosen 0, chosen 1, rejected 0, rejected 1)
POLICY = torch.tensor([-4.0, -6.0, -5.0, -5.5])
REFERENCE = torch.tensor([-4.5, -6.0, -4.0, -5.0])
COUNTS = torch.tensor([2, 3, 4, 2])


def sig(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def test_dpo_at_policy_equal_reference_is_log_2_and_chance():
    stats = pl.paired_loss(pl.LossSettings("dpo", beta=0.3), POLICY, COUNTS, POLICY.clone())
    assert torch.allclose(stats["loss_sum"], torch.full((2,), math.log(2)))
    metrics = pl.reduce(stats)
    assert metrics["rewards/accuracy"] == 0.5 and metrics["rewards/margin"] == 0.0
    assert metrics["logps/gap"] == 0.0


@pytest.mark.parametrize("smoothing", [0.0, 0.2])
def test_dpo_by_hand(smoothing: float):
    beta = 0.5
    settings = pl.LossSettings("dpo", beta=beta, label_smoothing=smoothing)
    stats = pl.paired_loss(settings, POLICY, COUNTS, REFERENCE)
    for i in range(2):
        pc, pr, rc, rr = POLICY[i].item(), POLICY[2 + i].item(), REFERENCE[i].item(), REFERENCE[2 + i].item()
        z = (pc - pr) - (rc - rr)
        want = -(1 - smoothing) * math.log(sig(beta * z)) - smoothing * math.log(sig(-beta * z))
        assert stats["loss_sum"][i].item() == pytest.approx(want, rel=1e-5)
        assert stats["reward_chosen"][i].item() == pytest.approx(beta * (pc - rc))
        assert stats["reward_rejected"][i].item() == pytest.approx(beta * (pr - rr))
        assert stats["gap"][i].item() == pytest.approx(((rc - pc) + (rr - pr)) / 2)
    # pair 0: chosen reward 0.25 > rejected -0.5; pair 1: 0 > -0.25
    assert pl.reduce(stats)["rewards/accuracy"] == 1.0


def test_ipo_by_hand():
    beta = 0.2
    stats = pl.paired_loss(pl.LossSettings("ipo", beta=beta), POLICY, COUNTS, REFERENCE)
    n = COUNTS.float()
    for i in range(2):
        policy = POLICY[i] / n[i] - POLICY[2 + i] / n[2 + i]
        z = policy - (REFERENCE[i] / n[i] - REFERENCE[2 + i] / n[2 + i])
        assert stats["loss_sum"][i].item() == pytest.approx((z.item() - 1 / (2 * beta)) ** 2, rel=1e-5)


def test_orpo_by_hand():
    lam = 0.25
    stats = pl.paired_loss(pl.LossSettings("orpo", orpo_lambda=lam), POLICY, COUNTS)
    n = COUNTS.float()
    for i in range(2):
        mc, mr = (POLICY[i] / n[i]).item(), (POLICY[2 + i] / n[2 + i]).item()
        odds = (mc - math.log(1 - math.exp(mc))) - (mr - math.log(1 - math.exp(mr)))
        want = -mc - lam * math.log(sig(odds))
        assert stats["loss_sum"][i].item() == pytest.approx(want, rel=1e-5)
        assert stats["reward_chosen"][i].item() == pytest.approx(lam * mc, rel=1e-6)


def test_simpo_by_hand():
    beta, gamma = 2.0, 0.5
    stats = pl.paired_loss(pl.LossSettings("simpo", beta=beta, gamma=gamma), POLICY, COUNTS)
    n = COUNTS.float()
    for i in range(2):
        mc, mr = (POLICY[i] / n[i]).item(), (POLICY[2 + i] / n[2 + i]).item()
        want = -math.log(sig(beta * (mc - mr - gamma / beta)))
        assert stats["loss_sum"][i].item() == pytest.approx(want, rel=1e-5)


def test_kto_by_hand():
    beta = 0.1
    # rows: 0 desirable, 1 undesirable; then the two mismatched completions of the KL estimate
    pol = torch.tensor([-3.0, -4.0, -7.0, -6.0])
    ref = torch.tensor([-3.5, -3.0, -8.0, -6.5])
    stats = pl.kto_loss(pl.LossSettings("kto", beta=beta), pol, ref, torch.tensor([1, 0]))
    kl = max(0.0, ((-7.0 + 8.0) + (-6.0 + 6.5)) / 2)
    assert stats["kl"][0].item() == pytest.approx(kl)
    assert stats["loss_sum"][0].item() == pytest.approx(1 - sig(beta * (0.5 - kl)), rel=1e-5)
    assert stats["loss_sum"][1].item() == pytest.approx(1 - sig(beta * (kl - (-1.0))), rel=1e-5)
    metrics = pl.reduce(stats)
    assert metrics["rewards/chosen"] == pytest.approx(0.05)
    assert metrics["rewards/rejected"] == pytest.approx(-0.1)
    assert metrics["rewards/accuracy"] == 1.0  # each reward's sign matches its label


def test_sequence_logps_is_the_log_softmax_at_the_shifted_labels():
    torch.manual_seed(0)
    logits = torch.randn(2, 4, 7)
    labels = torch.tensor([[-100, 3, 5, -100], [-100, -100, 1, 2]])
    total, count = pl.sequence_logps(logits, labels)
    logp = logits.log_softmax(-1)
    assert torch.allclose(total[0], logp[0, 0, 3] + logp[0, 1, 5])
    assert torch.allclose(total[1], logp[1, 1, 1] + logp[1, 2, 2])
    assert count.tolist() == [2, 2]


@pytest.mark.parametrize("loss", ["dpo", "ipo", "simpo"])
def test_the_sft_term_is_the_chosen_tokens_mean_nll_as_trl_takes_it(loss: str):
    """``loss + w * NLL``, the NLL over every chosen token of the micro-batch (TRL's ``nll_loss``:
    cross-entropy over the chosen tokens), each pair carrying its share ``-pi_c * B / sum(n_c)``."""
    w = 0.7
    ref = REFERENCE if pl.needs_reference(loss) else None
    plain = pl.paired_loss(pl.LossSettings(loss, beta=0.5), POLICY, COUNTS, ref)
    with_sft = pl.paired_loss(pl.LossSettings(loss, beta=0.5, sft_weight=w), POLICY, COUNTS, ref)
    nll = -(POLICY[0] + POLICY[1]).item() / (COUNTS[0] + COUNTS[1]).item()  # 10 / 5 = 2 nats a token
    assert with_sft["loss_sum"].mean().item() == pytest.approx(
        plain["loss_sum"].mean().item() + w * nll, rel=1e-6
    )
    for i in range(2):
        share = -POLICY[i].item() * 2 / (COUNTS[0] + COUNTS[1]).item()
        assert with_sft["loss_sum"][i].item() == pytest.approx(
            plain["loss_sum"][i].item() + w * share, rel=1e-6
        )
    for key in ("reward_chosen", "correct", "logp_chosen"):  # the metrics do not move
        assert torch.equal(with_sft[key], plain[key])
    assert pl.reduce(plain)["nll/chosen"] == pytest.approx(nll)


def test_the_sft_term_gradient_is_the_token_mean_nll_s():
    """d(mean loss)/d(pi_c) gains ``-w / sum(n_c)`` for every chosen answer, nothing for rejected."""
    w = 2.0
    grads = []
    for weight in (0.0, w):
        logps = POLICY.clone().requires_grad_(True)
        pl.paired_loss(pl.LossSettings("dpo", sft_weight=weight), logps, COUNTS, REFERENCE)[
            "loss_sum"
        ].mean().backward()
        grads.append(logps.grad)
    tokens = (COUNTS[0] + COUNTS[1]).item()
    assert torch.allclose(grads[1] - grads[0], torch.tensor([-w / tokens, -w / tokens, 0.0, 0.0]))


def test_kto_s_sft_term_covers_the_desirable_completions_only():
    w = 0.5
    pol = torch.tensor([-3.0, -4.0, -7.0, -6.0])
    ref = torch.tensor([-3.5, -3.0, -8.0, -6.5])
    counts = torch.tensor([3, 5, 4, 4])
    desirable = torch.tensor([1, 0])
    plain = pl.kto_loss(pl.LossSettings("kto"), pol, ref, desirable, counts=counts)
    with_sft = pl.kto_loss(pl.LossSettings("kto", sft_weight=w), pol, ref, desirable, counts=counts)
    assert with_sft["loss_sum"][1] == plain["loss_sum"][1]  # the undesirable row: no SFT term
    assert with_sft["loss_sum"].mean().item() == pytest.approx(plain["loss_sum"].mean().item() + w * 3.0 / 3)
    assert pl.reduce(plain)["nll/chosen"] == pytest.approx(1.0)  # 3 nats over the desirable row's 3 tokens
    with pytest.raises(ValueError, match="token counts"):
        pl.kto_loss(pl.LossSettings("kto", sft_weight=w), pol, ref, desirable)


def test_orpo_refuses_a_second_nll_term():
    with pytest.raises(ValueError, match="holds the chosen answers' NLL"):
        pl.paired_loss(pl.LossSettings("orpo", sft_weight=1.0), POLICY, COUNTS)
