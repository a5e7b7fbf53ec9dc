"""What an export needs in RAM, from the model's sizes alone (a rule: plain numbers in, bytes
out), and the refusal when the machine has less available (its figure read at the edge,
``available_bytes``).

The export holds one model at a time (docs/export.md#memory): the merged model in its
checkpoint's dtype while it is merged, checked and written, then, for a GGUF, the file read back
in its own 16 bits once the merged model is freed. Besides the weights, one tensor at a time is
converted in float32 (the float32 logits upcast one module's weights; the GGUF writer converts
and quantizes one tensor; the reader dequantizes one), a few copies of the largest tensor (the
embedding or the head) at worst, and the probes' activations and logits are small.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from xtrain.errors import XtrainError

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel


FLOAT32_COPIES = 3  # of the largest tensor at once (dequantized, copied, converted: measured 300M Llama)
MARGIN = 512 * 2**20  # the probes' activations and logits, the adapter, the tokenizer


@dataclass(frozen=True)
class ModelSizes:
    """The figures the estimate needs, read from the config (no weights loaded)."""

    parameters: int
    weight_bytes: int  # in the checkpoint's dtype
    largest: int  # elements of the largest tensor


def need_bytes(sizes: ModelSizes) -> int:
    """RAM the export needs on top of what the process already holds, the same for every target:
    the weights once (a GGUF's read-back is 16-bit, never larger than the merged model's 16 or 32
    bits), plus the largest tensor in float32 a few times, plus a margin."""
    return sizes.weight_bytes + FLOAT32_COPIES * 4 * sizes.largest + MARGIN


def check_memory(sizes: ModelSizes | None, available: int | None) -> None:
    """Refuse in one line when ``available`` bytes of RAM cannot hold the export; ``None``: unknown."""
    if sizes is None or available is None:
        return
    need = need_bytes(sizes)
    if available >= need:
        return
    raise XtrainError(
        f"the export needs about {need / 2**30:.1f} GiB of RAM and this machine has "
        f"{available / 2**30:.1f} GiB available ({sizes.parameters / 1e9:.2f}B parameters, "
        f"{sizes.weight_bytes / 2**30:.1f} GiB of weights)",
        "close other programs, or export on a machine with more memory: it runs on the CPU, any "
        "machine with the files will do",
    )


def model_sizes(model_class: type[PreTrainedModel], config: PretrainedConfig) -> ModelSizes | None:
    """The parameter count, the weights' bytes in the checkpoint's dtype and the largest tensor,
    from a model built on the meta device (nothing allocated); ``None`` where the model cannot be
    built that way (an estimate that fails must not stop an export that would fit)."""
    import torch
    from accelerate import init_empty_weights

    build = getattr(model_class, "from_config", model_class)  # an Auto class, or the model's own
    try:
        with init_empty_weights():
            model = build(config)
    except Exception:
        return None
    dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or torch.float32
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, torch.float32)
    size = torch.empty((), dtype=dtype).element_size()
    shapes = [p.numel() for p in model.parameters()]  # tied weights: counted once by parameters()
    return ModelSizes(sum(shapes), sum(shapes) * size, max(shapes, default=0))


def available_bytes() -> int | None:
    """The machine's available RAM now (psutil), ``None`` where it cannot tell."""
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except Exception:  # a platform psutil cannot read: no refusal rather than a wrong one
        return None
