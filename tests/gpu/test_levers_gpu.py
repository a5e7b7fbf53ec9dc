"""The memory levers on CUDA, what the CPU cannot stand in for: activation offloading's copies to
pinned host memory on a side stream (xtrain/model/offload.py) and the chunked loss under bf16
autocast (xtrain/model/chunked_loss.py), each against the plain step on the same GPU: the same
gradients, less device memory. In-process, a small Qwen2-shaped model with LoRA (peft)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

VOCAB = 152_064  # Qwen2's: the logits the chunked loss leaves out


def _model(vocab: int = 32_000, layers: int = 4) -> Any:
    """Eager attention: sdpa's memory-efficient backward adds with atomics (not bit-reproducible)."""
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=vocab, hidden_size=256, intermediate_size=1024, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
                         max_position_embeddings=4096, attn_implementation="eager")  # fmt: skip
    model = Qwen2ForCausalLM(config).cuda()
    targets = ["q_proj", "k_proj", "v_proj", "o_proj"]
    lora = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=targets)
    return get_peft_model(model, lora)


def _batch(vocab: int, seq: int = 1024) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, vocab, (2, seq), generator=torch.Generator().manual_seed(1))
    labels = ids.clone()
    labels[:, : seq // 2] = -100  # a masked prompt
    return {"input_ids": ids.cuda(), "attention_mask": torch.ones_like(ids).cuda(), "labels": labels.cuda()}


def _step(model: Any, batch: dict[str, torch.Tensor]) -> tuple[float, dict[str, torch.Tensor], int, int]:
    """One bf16-autocast forward and backward: the loss, the LoRA gradients, the bytes the forward
    left allocated (what autograd keeps) and the step's peak, both above the start."""
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(**batch).loss
    torch.cuda.synchronize()
    kept = torch.cuda.memory_allocated() - before
    loss.backward()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return float(loss), grads, kept, peak


@pytest.mark.parametrize("pin", [True, False], ids=["pinned", "pageable"])
def test_offloading_moves_the_activations_to_the_host_and_keeps_the_gradients(pin: bool) -> None:
    from xtrain.model.offload import ActivationOffload

    model = _model()
    batch = _batch(32_000)
    _step(model, batch)  # warm: cuBLAS workspaces, the allocator's pools
    loss, grads, kept, _ = _step(model, batch)
    offload = ActivationOffload(model, pin=pin).attach()
    try:
        moved_loss, moved_grads, moved_kept, _ = _step(model, batch)
    finally:
        offload.detach()
    assert offload.moved > 64 * 2**20  # the layers' activations went to the host
    assert moved_kept < kept / 2  # and left the device (``moved`` counts a storage once a view)
    assert moved_loss == loss
    assert grads.keys() == moved_grads.keys() and grads
    for name, g in grads.items():  # the same tensors come back: the same gradients, bit for bit
        assert torch.equal(g, moved_grads[name]), name


def test_offloading_composes_with_gradient_checkpointing_on_cuda() -> None:
    from xtrain.model.offload import ActivationOffload

    model = _model()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.enable_input_require_grads()
    batch = _batch(32_000)
    _step(model, batch)
    loss, grads, kept, _ = _step(model, batch)
    offload = ActivationOffload(model, pin=True).attach()
    try:
        moved_loss, moved_grads, moved_kept, _ = _step(model, batch)
    finally:
        offload.detach()
    assert offload.moved > 0 and moved_kept < kept  # only the checkpoints (each layer's input) moved
    assert moved_loss == loss
    for name, g in grads.items():
        assert torch.equal(g, moved_grads[name]), name


def test_the_chunked_loss_under_bf16_autocast_equals_the_plain_loss_in_less_memory() -> None:
    from xtrain.model.chunked_loss import ChunkedLoss, LogitMap, chunk_rows

    model = _model(VOCAB, layers=2)
    batch = _batch(VOCAB, seq=2048)
    _step(model, batch)
    loss, grads, _, peak = _step(model, batch)
    chunked = ChunkedLoss(model, "next-token", LogitMap(), chunk_rows(VOCAB)).attach()
    try:
        _step(model, batch)
        chunked_loss, chunked_grads, _, chunked_peak = _step(model, batch)
    finally:
        chunked.detach()
    # the head's bf16 matmul over the gathered rows may round apart from the whole batch's
    assert chunked_loss == pytest.approx(loss, rel=2e-3)
    for name, g in grads.items():
        got = chunked_grads[name].float()
        assert torch.linalg.vector_norm(got - g.float()) <= 2e-2 * torch.linalg.vector_norm(g.float()), name
    assert chunked_peak < 0.5 * peak  # 2 x 2048 x 152,064 logits (and their float32 copy) never exist
