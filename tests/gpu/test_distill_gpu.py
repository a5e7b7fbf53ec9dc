"""Distillation on CUDA, what the CPU cannot stand in for: the divergence under bf16 autocast with a
Qwen2-sized vocabulary, its heads in chunks against the whole logits (the same loss and gradients,
less device memory: the logits of every trained token are never held), and a teacher loaded in 4
bits by bitsandbytes' CUDA kernels beside the student. In-process, small Qwen2-shaped models."""

from __future__ import annotations

from typing import Any

import pytest
import torch

VOCAB = 152_064  # Qwen2.5's head: the logits the chunks leave out


def _qwen(seed: int) -> Any:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=256, intermediate_size=1024, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
                         max_position_embeddings=4096, attn_implementation="eager")  # fmt: skip
    return Qwen2ForCausalLM(config)


def _student() -> Any:
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(_qwen(0).cuda(), LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0,
                                                       target_modules=["q_proj", "v_proj"]))  # fmt: skip
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05, generator=torch.Generator(device="cuda").manual_seed(len(name)))
    return model.train()


def _batch(prompt: int = 256, answer: int = 768) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (2, prompt + answer), generator=g)
    labels = ids.clone()
    labels[:, :prompt] = -100
    return {"input_ids": ids.cuda(), "attention_mask": torch.ones_like(ids).cuda(), "labels": labels.cuda()}


def _step(student: Any, teacher: Any, batch: dict, chunks: Any) -> tuple[float, dict[str, torch.Tensor], int]:
    from xtrain.tasks.distill.losses import Divergence
    from xtrain.tasks.distill.step import divergence_sums

    student.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        sums, _ = divergence_sums(student, teacher, batch, Divergence("gkd", 0.5), chunks)
    sums.loss.backward()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    grads = {n: p.grad.detach().float().clone() for n, p in student.named_parameters() if p.grad is not None}
    return float(sums.loss), grads, peak


def _teacher(model: Any) -> Any:
    from xtrain.model.chunked_loss import LogitMap
    from xtrain.tasks.distill.teacher import Teacher

    return Teacher(model.eval().requires_grad_(False), LogitMap(), None, None)  # type: ignore[arg-type]


def test_the_chunked_divergence_under_bf16_equals_the_whole_logits_and_holds_less(tmp_path) -> None:
    from xtrain.model.chunked_loss import LogitMap, chunk_rows

    student, teacher, batch = _student(), _teacher(_qwen(1).cuda()), _batch()
    _step(student, teacher, batch, None)  # warm: cuBLAS workspaces, the allocator's pools
    loss, grads, peak = _step(student, teacher, batch, None)
    c_loss, c_grads, c_peak = _step(student, teacher, batch, (LogitMap(), chunk_rows(VOCAB)))
    assert c_loss == pytest.approx(loss, rel=1e-3)
    for name, g in grads.items():  # bf16 matmuls in another order: close, not equal
        assert float((c_grads[name] - g).norm()) <= 2e-2 * float(g.norm()) + 1e-6, name
    # the whole logits: 2 x 1536 trained tokens x 152k entries, float32 for both models and their
    # log-softmaxes (several GiB); the chunks hold one chunk of them
    assert c_peak < peak / 2, (c_peak, peak)


def test_a_4bit_teacher_on_cuda_is_the_formula_over_that_teacher(tmp_path) -> None:
    from support.distill import reference_loss
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    from xtrain.model.chunked_loss import LogitMap
    from xtrain.tasks.distill.losses import Divergence
    from xtrain.tasks.distill.step import divergence_sums

    _qwen(1).save_pretrained(tmp_path / "teacher")
    settings = BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.float32,
    )  # fmt: skip
    four = AutoModelForCausalLM.from_pretrained(tmp_path / "teacher", quantization_config=settings,
                                                device_map={"": 0}, dtype=torch.float32)  # fmt: skip
    student, batch = _student(), _batch(16, 48)
    sums, _ = divergence_sums(student, _teacher(four), batch, Divergence("on_policy"), (LogitMap(), 32))
    sums.loss.backward()
    got = {n: p.grad.detach().clone() for n, p in student.named_parameters() if p.grad is not None}
    student.zero_grad()
    want, _ = reference_loss(student, four, batch, "on_policy", 0.5)
    want.backward()
    assert float(sums.loss) == pytest.approx(float(want), rel=1e-4, abs=1e-4)
    for name, p in student.named_parameters():
        if p.grad is not None:
            assert float((got[name] - p.grad).norm()) <= 1e-3 * float(p.grad.norm()) + 1e-6, name
