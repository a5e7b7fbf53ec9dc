"""Distillation's losses and their gradients against a plain PyTorch reference written out by hand
over the same student and teacher (issue 61): the per-token reverse KL of sampled tokens
(on-policy, its gradient the score-function estimate ``k * grad log p``), the generalized JSD at
beta 0, 0.5 and 1 (GKD), each through the chunked heads (several chunks) and the whole logits, a
student whose head trains whole, a 4-bit teacher (bitsandbytes NF4 on the CPU), and the
distributions over a shared tokenizer where the heads' widths differ."""

from __future__ import annotations

import pytest
import torch
from support.distill import logits_of, reference_loss

from xtrain.model.chunked_loss import LogitMap
from xtrain.tasks.distill import losses
from xtrain.tasks.distill.step import divergence_sums
from xtrain.tasks.distill.teacher import Teacher

VOCAB = 96


def _llama(seed: int, vocab: int = VOCAB):
    from transformers import LlamaForCausalLM

    from xtrain.builtin.text import tiny_llama_config

    torch.manual_seed(seed)
    config = tiny_llama_config(vocab_size=vocab, max_position_embeddings=64, pad_token_id=0)
    return LlamaForCausalLM(config).float()


def _student(lora: bool = True):
    model = _llama(1)
    if not lora:
        return model.train()
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                             lora_dropout=0.0))  # fmt: skip
    with torch.no_grad():  # B starts at 0: every adapter weight then has a gradient
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))) * 0.3)
    return model.train()


def _teacher(model=None) -> Teacher:
    model = model if model is not None else _llama(2).eval().requires_grad_(False)
    return Teacher(model, LogitMap(), None, None)  # type: ignore[arg-type]


def _batch() -> dict:
    """Left-padded prompts, then completions whose padding follows their end (mask 0), as
    ``DistillStep.complete`` makes them."""
    g = torch.Generator().manual_seed(3)
    prompt = torch.randint(3, VOCAB, (3, 5), generator=g)
    prompt_mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 1, 1, 1, 1]])
    done = torch.randint(3, VOCAB, (3, 6), generator=g)
    done_mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0]])
    ids = torch.cat([prompt.masked_fill(prompt_mask == 0, 0), done.masked_fill(done_mask == 0, 0)], 1)
    labels = torch.cat([torch.full_like(prompt, -100), done.masked_fill(done_mask == 0, -100)], 1)
    return {"input_ids": ids, "attention_mask": torch.cat([prompt_mask, done_mask], 1), "labels": labels}


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize(("mode", "beta"), [("on_policy", 0.5), ("gkd", 0.0), ("gkd", 0.5), ("gkd", 1.0)])
@pytest.mark.parametrize("rows", [None, 4], ids=["whole-logits", "chunks-of-4"])
def test_the_loss_and_its_gradients_are_the_formula_written_out(mode, beta, rows):
    student, teacher, batch = _student(), _teacher(), _batch()
    how = losses.Divergence(mode, beta)
    chunks = (LogitMap(), rows) if rows else None
    sums, keep = divergence_sums(student, teacher, batch, how, chunks)
    sums.loss.backward()
    got = _grads(student)
    assert sums.tokens == 12 and keep.numel() == 12  # the completions' tokens (4 + 6 + 2)
    student.zero_grad()
    want, tokens = reference_loss(student, teacher.model, batch, mode, beta)
    want.backward()
    expected = _grads(student)
    assert tokens == sums.tokens
    torch.testing.assert_close(sums.loss.detach(), want.detach(), rtol=1e-5, atol=1e-5)
    assert got.keys() == expected.keys() and len(got) == 8  # q and v: A and B, two layers
    for name, g in expected.items():
        torch.testing.assert_close(got[name], g, rtol=1e-4, atol=1e-6, msg=name)
    # the curves' KL: the exact reverse KL a token, whatever the loss
    p = torch.log_softmax(logits_of(student, batch)[:, :-1], -1)
    q = torch.log_softmax(logits_of(teacher.model, batch)[:, :-1], -1)
    exact = (p.exp() * (p - q)).sum(-1)[batch["labels"][:, 1:] != -100]
    torch.testing.assert_close(sums.kl, exact.detach(), rtol=1e-4, atol=1e-5)


def test_a_student_whose_head_trains_whole_gets_the_head_s_gradient_from_the_chunks():
    """A full fine-tune: the head's weight is a parameter the eager chunks take gradients for."""
    student, teacher, batch = _student(lora=False), _teacher(), _batch()
    how = losses.Divergence("gkd", 0.5)
    sums, _ = divergence_sums(student, teacher, batch, how, (LogitMap(), 3))
    sums.loss.backward()
    got = _grads(student)
    student.zero_grad()
    reference_loss(student, teacher.model, batch, "gkd", 0.5)[0].backward()
    expected = _grads(student)
    assert "lm_head.weight" in got and got.keys() == expected.keys()
    for name, g in expected.items():
        torch.testing.assert_close(got[name], g, rtol=1e-4, atol=1e-6, msg=name)


def test_a_4bit_teacher_is_the_reference_over_the_same_4bit_teacher(tmp_path):
    """The teacher loaded in 4 bits (bitsandbytes NF4 on the CPU, kept in the layout its plain
    forward computes with): the loss and gradients equal the formula over that same teacher's
    logits, and the teacher is not the 16-bit one (its weights were rounded)."""
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    from xtrain.model.quantization import keep_training_layout
    from xtrain.runtime.quiet import quiet_bitsandbytes

    quiet_bitsandbytes()
    _llama(2).save_pretrained(tmp_path / "teacher")
    settings = BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.float32,
    )  # fmt: skip
    four = AutoModelForCausalLM.from_pretrained(
        tmp_path / "teacher", quantization_config=settings, device_map={"": "cpu"}, dtype=torch.float32
    )
    assert keep_training_layout(four) > 0
    four.eval().requires_grad_(False)
    student, batch = _student(), _batch()
    sums, _ = divergence_sums(student, _teacher(four), batch, losses.Divergence("gkd", 0.5), (LogitMap(), 4))
    sums.loss.backward()
    got = _grads(student)
    student.zero_grad()
    want, _ = reference_loss(student, four, batch, "gkd", 0.5)
    want.backward()
    torch.testing.assert_close(sums.loss.detach(), want.detach(), rtol=1e-5, atol=1e-5)
    for name, g in _grads(student).items():
        torch.testing.assert_close(got[name], g, rtol=1e-4, atol=1e-6, msg=name)
    plain, _ = reference_loss(student, _llama(2).eval(), batch, "gkd", 0.5)
    assert abs(float(plain) - float(want)) > 1e-4  # NF4 rounded the teacher


def test_heads_of_other_widths_compare_over_the_shared_tokenizer():
    """A teacher whose head has more rows (padding past the tokenizer's tokens): both
    distributions over the tokenizer's first 90 tokens; a sampled token beyond them adds no loss."""
    from xtrain.tasks.distill.teacher import shared_width

    assert shared_width(96, 96, 90, "t") is None
    assert shared_width(96, 128, 90, "t") == 90
    student, teacher, batch = (
        _student(),
        _teacher(_llama(2, vocab=128).eval().requires_grad_(False)),
        _batch(),
    )
    teacher.vocab = 90
    for mode in ("on_policy", "gkd"):
        student.zero_grad()
        sums, _ = divergence_sums(student, teacher, batch, losses.Divergence(mode, 0.5, 90), (LogitMap(), 4))
        sums.loss.backward()
        got = _grads(student)
        student.zero_grad()
        beyond = batch["labels"].masked_fill(batch["labels"] >= 90, -100)  # on-policy: no loss there
        kept = dict(batch, labels=beyond) if mode == "on_policy" else batch
        want, _ = reference_loss(student, teacher.model, kept, mode, 0.5, vocab=90)
        want.backward()
        torch.testing.assert_close(sums.loss.detach(), want.detach(), rtol=1e-5, atol=1e-5)
        for name, g in _grads(student).items():
            torch.testing.assert_close(got[name], g, rtol=1e-4, atol=1e-6, msg=name)


def test_a_step_s_loss_is_its_token_losses_over_the_tokens_of_all_its_micro_batches():
    """``DistillStep``: two micro-batches completed by the data's answers (GKD, lmbda 0), the step's
    trained tokens counted over both (``step_start``'s gather), each forward's loss scaled so that
    their mean (the loop's, over the step's micro-batches) is every token's loss summed over the
    whole step's tokens: the formula by hand over both micro-batches, and its gradients."""
    from xtrain.config.schema import DistillConfig
    from xtrain.tasks.distill.step import DistillStep

    student, teacher = _student(), _teacher()
    step = DistillStep(DistillConfig(teacher="t", mode="gkd", beta=0.5, lmbda=0.0), teacher, 7, 0, [2])
    step.use_chunked_loss(LogitMap(), 5)
    g = torch.Generator().manual_seed(5)
    micro = []
    for width, answers in ((4, [3, 1]), (6, [6, 2])):  # two micro-batches, 12 answer tokens in all
        prompt = torch.randint(3, VOCAB, (2, width), generator=g)
        answer = torch.randint(3, VOCAB, (2, 6), generator=g)
        mask = torch.tensor([[1] * n + [0] * (6 - n) for n in answers])
        micro.append({
            "input_ids": prompt, "attention_mask": torch.ones_like(prompt), "row": torch.tensor([0, 1]),
            "answer_ids": answer.masked_fill(mask == 0, 0), "answer_mask": mask,
        })  # fmt: skip
    step.at_step(0)
    step.step_start(student, micro, lambda t: t)  # one process: the gather is the identity
    assert [float(b["stat/total_tokens"]) for b in micro] == [12.0, 12.0]
    (sum(step(student, b).loss for b in micro) / len(micro)).backward()
    got = _grads(student)
    student.zero_grad()
    sums = [reference_loss(student, teacher.model, b, "gkd", 0.5) for b in micro]
    assert sum(n for _, n in sums) == 12
    (sum(s for s, _ in sums) / 12).backward()
    for name, want in _grads(student).items():
        torch.testing.assert_close(got[name], want, rtol=1e-4, atol=1e-6, msg=name)
