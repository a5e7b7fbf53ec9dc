"""Mixed-precision pieces on the CPU: fp32 master weights and the skipped-step check (CPU
GradScaler + fused AdamW run the same scale/skip logic as on CUDA; tests/gpu covers CUDA)."""

from __future__ import annotations

import torch

from xtrain.train.precision import SkipDetector, upcast_trainable


def test_upcast_trainable_only_under_autocast_and_only_trainable() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)).half()
    model[0].requires_grad_(False)
    assert upcast_trainable(model, "no") == 0
    assert model[1].weight.dtype == torch.float16
    assert upcast_trainable(model, "fp16") == 2
    assert model[1].weight.dtype == torch.float32 and model[0].weight.dtype == torch.float16


def test_no_scaler_means_nothing_to_check() -> None:
    skips = SkipDetector(None)
    skips.before_step()
    skips.record()
    assert not skips.pending and skips.settle() is False


def test_fused_adamw_skip_is_read_from_the_scale() -> None:
    """The fused optimizer runs even on overflow (it skips inside the kernel): only the scale
    tells. One overflowing step, then a normal one."""
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1, fused=True)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)
    skips = SkipDetector(scaler)
    results = []
    for bad in (True, False):
        loss = model(torch.ones(2, 4)).sum() * (float("inf") if bad else 1.0)
        scaler.scale(loss).backward()
        before = model.weight.detach().clone()
        skips.before_step()
        scaler.step(opt)
        scaler.update()
        skips.record()
        results.append((skips.settle(), torch.equal(before, model.weight.detach())))
        opt.zero_grad()
    assert results == [(True, True), (False, False)]


def test_frequent_overflow_threshold() -> None:
    from xtrain.train.precision import frequent_overflow

    assert not frequent_overflow(3, 30)  # the scaler's first steps
    assert frequent_overflow(4, 30) and not frequent_overflow(40, 1000) and frequent_overflow(51, 1000)
