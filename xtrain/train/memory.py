"""A rough per-GPU memory estimate for LoRA training under DDP, and the warning when it exceeds the
card: pure functions (no torch, no machine), for the train plan or ``xtrain doctor`` to call.

Under DDP every GPU holds the whole model. The estimate adds:

- the frozen weights: parameters x bytes per weight (2 for bf16/fp16, 4 for float32);
- the trained weights: float32 weights, gradients and AdamW's two moments (16 bytes each);
- activations: about ``34 x hidden`` bytes a token a layer in 16-bit without checkpointing (the
  usual transformer figure), about ``2 x hidden`` a token a layer with it (only layer inputs kept);
- 10 % for the CUDA context, allocator slack and temporary buffers.

It is meant to tell "fits" from "far too big" before a long download, not to the last gigabyte.
"""

from __future__ import annotations

GIB = 1024**3


def estimate_gib(
    params: int,
    trainable: int,
    weight_bytes: int,
    tokens_per_device: int,
    hidden: int,
    layers: int,
    gradient_checkpointing: bool,
) -> float:
    """Estimated peak GPU memory in GiB of one training process (see the module docstring).
    ``tokens_per_device``: ``batch.per_device`` x tokens a sequence, image tokens included."""
    weights = params * weight_bytes
    trained = trainable * 16
    per_token_layer = (2 if gradient_checkpointing else 34) * hidden
    activations = tokens_per_device * layers * per_token_layer
    return 1.1 * (weights + trained + activations) / GIB


def memory_warning(estimate: float, gpu_gib: float, name: str = "the GPU") -> str | None:
    """One line when ``estimate`` does not fit ``gpu_gib``, naming what lowers it; else None."""
    if estimate <= gpu_gib:
        return None
    return (
        f"the estimated training memory ({estimate:.1f} GiB a process) exceeds {name} ({gpu_gib:.0f} GiB): "
        "load the weights in bf16/fp16 (model.dtype), set model.gradient_checkpointing=true, "
        "lower data.max_pixels / data.max_length, and use batch.per_device=1 with batch.global_batch "
        "for accumulation"
    )
