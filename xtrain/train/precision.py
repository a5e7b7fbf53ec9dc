"""Mixed precision beyond accelerate's wrappers: fp32 master weights and skipped-step detection.

- **fp32 trainable weights.** With fp16/bf16 autocast the *compute* runs in half precision while
  the weights the optimizer updates stay in float32. A checkpoint loaded in float16 (``dtype:
  auto`` on a GPU keeps the checkpoint's dtype) would otherwise train float16 weights: with fp16
  the GradScaler refuses them ("Attempting to unscale FP16 gradients", torch/amp/grad_scaler.py),
  and with bf16 small updates vanish in the rounding. Frozen weights stay as loaded (LoRA keeps
  its memory saving).
- **Skipped steps.** With fp16 a step whose gradients overflowed is skipped and the loss scale is
  halved. accelerate learns of the skip by watching whether the optimizer's ``step`` was called
  (accelerate/optimizer.py); a *fused* AdamW (the CUDA default here) is always called and skips
  inside its kernel (``_step_supports_amp_scaling``), so accelerate reports no skip and its
  scheduler wrapper advances the learning rate anyway. The scale itself is the truth: it falls
  exactly when a step was skipped (``GradScaler.update`` multiplies it by ``backoff_factor`` < 1 on
  an inf/NaN and never lowers it otherwise). Reading it costs one host sync per optimizer step, only
  when a scaler exists (fp16): torch's own non-fused path syncs there too (``_maybe_opt_step``).
"""

from __future__ import annotations

import torch

HALF = (torch.float16, torch.bfloat16)


def upcast_trainable(model: torch.nn.Module, mixed_precision: str) -> int:
    """Trainable half-precision parameters -> float32 under fp16/bf16 autocast; returns how many
    parameters were upcast. Must run before the optimizer is built (it holds the tensors)."""
    if mixed_precision not in ("fp16", "bf16"):
        return 0
    count = 0
    for p in model.parameters():
        if p.requires_grad and p.dtype in HALF:
            p.data = p.data.float()
            count += 1
    return count


def frequent_overflow(skipped: int, steps: int) -> bool:
    """More skipped steps than the few a GradScaler spends finding its scale at the start (it
    begins at 2**16 and halves per overflow): worth suggesting bf16."""
    return skipped > max(3, steps // 20)


class SkipDetector:
    """Tells whether an optimizer step was skipped for an inf/NaN gradient (fp16), without
    stalling the GPU.

    ``record()`` right after ``optimizer.step()`` queues a copy of the new loss scale into pinned
    host memory and an event; ``settle()`` reads it later, normally right before the *next*
    optimizer step, when the next step's forward and backward are already queued and the GPU has
    long finished the copy, so the host waits for nothing and the GPU never runs dry. The lr
    scheduler steps in ``settle``: step t's schedule advance lands before step t+1's update, exactly
    where it would have landed with an immediate read. Without a scaler (bf16, fp32) there is
    nothing to read and ``record`` returns False at once.
    """

    def __init__(self, scaler: torch.amp.GradScaler | None) -> None:
        self.scaler = scaler if (scaler is not None and scaler.is_enabled()) else None
        self._last: float | None = None  # the scale the recorded step started from
        self._pending: tuple[torch.cuda.Event | None, torch.Tensor] | None = None
        self._buffer: torch.Tensor | None = None

    @property
    def pending(self) -> bool:
        return self._pending is not None

    def before_step(self) -> None:
        """Call right before the first ``optimizer.step()`` of a session (one sync, once)."""
        if self.scaler is not None and self._last is None:
            self._last = float(self.scaler.get_scale())

    def record(self) -> None:
        """Call right after ``optimizer.step()`` (accelerate has run ``scaler.update()``)."""
        if self.scaler is None:
            return
        scale = getattr(self.scaler, "_scale", None)  # the device tensor GradScaler keeps
        if scale is None or scale.device.type != "cuda":
            self._pending = (None, torch.tensor(float(self.scaler.get_scale())))
            return
        if self._buffer is None:
            self._buffer = torch.empty((), dtype=scale.dtype, pin_memory=True)
        self._buffer.copy_(scale, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        self._pending = (event, self._buffer)

    def settle(self) -> bool:
        """Was the recorded step skipped? Waits for the recorded copy (normally long done)."""
        if self._pending is None:
            return False
        event, host = self._pending
        if event is not None:
            event.synchronize()
        after = float(host)
        skipped = self._last is not None and after < self._last
        self._last, self._pending = after, None
        return skipped
