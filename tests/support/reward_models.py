"""The reward task's gradient check, shared by tests/test_reward.py (CPU) and
tests/gpu/test_reward_gpu.py (CUDA): xtrain's step read at its first optimizer step
(support/gradients.py), and the reward model and its loss written out by hand over the same weights
and batches: the body's hidden state at each sequence's last real token (its length - 1: right
padding), the head's row, ``mean(-log sigmoid(r_c - r_r - m) + c (r_c + r_r)^2)`` over the step's
pairs."""

from __future__ import annotations

from typing import Any

import torch

from support.gradients import Capture, reference_model, xtrain_gradients


def moved_and_recorded(batches: list[dict[str, torch.Tensor]]) -> Any:
    """An ``on_workload`` hook: the adapters' B and the head moved off their start (a zero head
    passes no gradient to the body), and every batch the reward forward gets appended to ``batches``."""

    def hook(workload: Any) -> None:
        forward = workload.forward
        with torch.no_grad():
            for name, p in workload.model.named_parameters():
                if p.requires_grad and ("lora_B" in name or "score" in name):
                    noise = torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))) * 0.3
                    p.copy_(noise.to(p.device, p.dtype))

        def recorded(model: Any, batch: dict[str, torch.Tensor]) -> Any:
            batches.append({k: v.detach().clone() for k, v in batch.items()})
            return forward(model, batch)

        workload.forward = recorded

    return hook


def reward_step(cfg: Any, plan: Any = None) -> tuple[Capture, list[dict[str, torch.Tensor]]]:
    """xtrain's first step of the reward run ``cfg``: (what it computed, the batches it read)."""
    batches: list[dict[str, torch.Tensor]] = []
    return xtrain_gradients(cfg, plan, on_workload=moved_and_recorded(batches)), batches


Batches = list[dict[str, torch.Tensor]]


def hand_gradients(capture: Capture, batches: Batches, center: float) -> dict[str, torch.Tensor]:
    """The gradients of the step's loss written out by hand, in float32, on the batches' device."""
    device = batches[0]["input_ids"].device
    ref = reference_model(capture, device).train()
    body, head = ref.base_model.model.model, ref.base_model.model.score.modules_to_save["default"]
    for batch in batches:
        hidden = body(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
        last = batch["attention_mask"].sum(1) - 1
        rewards = hidden[torch.arange(len(last), device=device), last].float() @ head.weight[0].float()
        b = len(rewards) // 2
        chosen, rejected = rewards[:b], rewards[b:]
        margin = batch["margin"].float() if "margin" in batch else torch.zeros_like(chosen)
        pair = -torch.log(torch.sigmoid(chosen - rejected - margin)) + center * (chosen + rejected) ** 2
        (pair.mean() / len(batches)).backward()
    return {n: p.grad.detach().float().cpu() for n, p in ref.named_parameters() if p.grad is not None}
