"""A rough per-GPU memory estimate for LoRA training under DDP, and the warning when it exceeds the
card: pure functions (no torch, no machine). ``xtrain train`` shows it with the plan (sizes from
the model's config, ``model_size.offline_sizes``) and the training loop checks it again on CUDA
with the real counts and the card's memory (``model_size.live_sizes``).

Under DDP every GPU holds the whole model. The estimate adds:

- the frozen weights: parameters x bytes per weight (2 for bf16/fp16, 4 for float32);
- the trained weights: float32 weights, gradients and AdamW's two moments (16 bytes each);
- activations, a token a layer in 16-bit (Korthikanti et al. 2022, attention scores not kept:
  sdpa/flash): about ``34 x hidden`` bytes for a GELU MLP of 4 x hidden; with a gated MLP
  (SwiGLU: Llama, Qwen, Mistral) of ``intermediate`` width, ``17 x hidden + 8 x intermediate``
  (gate, up, activation and product outputs: Qwen2-7B's 18944 makes it 1.7x the GELU figure).
  With gradient checkpointing only each layer's input is kept (``2 x hidden``), plus one layer's
  activations while it is recomputed. Twice all that in float32 (no mixed precision);
- the logits of the loss: a token x the vocabulary x 10 bytes (16-bit logits, the float32 copy
  the loss takes, its log-softmax kept for the backward pass): 1.5 GiB for 1024 tokens of
  Qwen2's 152k vocabulary;
- 10 % for the CUDA context, allocator slack and temporary buffers.

Tokens a process: ``batch.per_device x data.max_length``. A vision-language model's image tokens
are inside ``data.max_length`` (the collator cuts there), and its vision tower is frozen: it keeps
no activations for the backward pass.

It is meant to tell "fits" from "far too big" before a long download, not to the last gigabyte.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

GIB = 1024**3
HALF = ("bfloat16", "float16")


def estimate_gib(
    params: int,
    trainable: int,
    weight_bytes: int,
    tokens_per_device: int,
    hidden: int,
    layers: int,
    gradient_checkpointing: bool,
    activation_bytes: int = 2,
    *,
    intermediate: int | None = None,
    vocab: int = 0,
) -> float:
    """Estimated peak GPU memory in GiB of one training process (see the module docstring).
    ``tokens_per_device``: ``batch.per_device`` x tokens a sequence, image tokens included;
    ``activation_bytes``: 2 under fp16/bf16 autocast or 16-bit weights, 4 in float32;
    ``intermediate``: a gated MLP's width (None: a 4 x hidden GELU MLP); ``vocab``: the
    output vocabulary (0: no logits term)."""
    weights = params * weight_bytes
    trained = trainable * 16
    layer = 34 * hidden if intermediate is None else 17 * hidden + 8 * intermediate  # bytes, 16-bit
    if gradient_checkpointing:
        kept = tokens_per_device * (layers * 2 * hidden + layer)  # layer inputs + one recomputed layer
    else:
        kept = tokens_per_device * layers * layer
    activations = kept * activation_bytes // 2
    logits = tokens_per_device * vocab * 10
    return 1.1 * (weights + trained + activations + logits) / GIB


def size(gib: float, digits: int) -> str:
    """``24 GiB``, ``17.9 GiB``; below 1 GiB in MiB (tiny models, test cards)."""
    return f"{gib:.{digits}f} GiB" if gib >= 1 else f"{gib * 1024:.0f} MiB"


def memory_warning(
    estimate: float,
    gpu_gib: float,
    name: str = "the GPU",
    *,
    half_weights: bool = False,
    checkpointing: bool = False,
    per_device: int | None = None,
    images: bool = True,
) -> str | None:
    """One line when ``estimate`` does not fit ``gpu_gib``, naming what lowers it (leaving out
    what the config already does); else None."""
    if estimate <= gpu_gib:
        return None
    fixes = [] if half_weights else ["load the weights in bf16/fp16 (model.dtype)"]
    fixes += [] if checkpointing else ["set model.gradient_checkpointing=true"]
    fixes.append("lower data.max_pixels / data.max_length" if images else "lower data.max_length")
    if per_device != 1:
        fixes.append("use batch.per_device=1 with batch.global_batch for accumulation")
    return (
        f"the estimated training memory ({size(estimate, 1)} a process) exceeds {name} ({size(gpu_gib, 0)}): "
        + ", ".join(fixes[:-1])
        + (", and " if len(fixes) > 1 else "")
        + fixes[-1]
    )


@dataclass(frozen=True)
class ModelSizes:
    """What the estimate needs from a model: its parameters, the trained ones, its language
    model's shape (``Shape``), and the bytes of a frozen weight as loaded."""

    params: int
    trainable: int
    shape: Shape
    weight_bytes: int


@dataclass(frozen=True)
class Shape:
    """The part whose activations grow with the tokens: width, depth, a gated MLP's width
    (None: not gated or unknown) and the output vocabulary (0: unknown)."""

    hidden: int
    layers: int
    intermediate: int | None = None
    vocab: int = 0


@dataclass(frozen=True)
class MemoryCheck:
    """The estimate for one process against the smallest card it runs on."""

    estimate_gib: float
    gpu_gib: float
    gpu_name: str
    warning: str | None  # one line when it does not fit

    def summary(self) -> str:
        return f"~{size(self.estimate_gib, 1)} a process (estimate; {self.gpu_name}: {size(self.gpu_gib, 0)})"


def weight_bytes(dtype: str, checkpoint_dtype: str | None) -> int:
    """Bytes of a loaded weight: ``model.dtype``, where ``auto`` on a GPU keeps the checkpoint's
    dtype (``config.dtype``; float32 when the checkpoint does not say)."""
    name = checkpoint_dtype if dtype == "auto" else dtype
    return 2 if str(name).removeprefix("torch.") in HALF else 4


def activation_bytes(precision: str | None, weight_bytes: int) -> int:
    """16-bit activations under fp16/bf16 autocast or with 16-bit weights, else float32."""
    return 2 if precision in ("fp16", "bf16") or weight_bytes == 2 else 4


# activation functions of gated MLPs (SwiGLU/GeGLU: Llama, Qwen, Mistral, Gemma)
GATED_ACTS = ("silu", "swiglu", "gelu_pytorch_tanh", "geglu")


def model_shape(config: object) -> Shape | None:
    """The ``Shape`` of a config: a VLM's ``text_config``, an encoder-decoder's halves (widest,
    summed depth, the decoder's vocabulary), or the model itself (``hidden_size``/
    ``num_hidden_layers``, ``d_model``/``*_layers``, GPT-2's ``n_embd``/``n_layer``). None when
    the config names no width or depth."""
    text = getattr(config, "text_config", None)
    if text is not None:
        return model_shape(text)
    halves = [getattr(config, k, None) for k in ("encoder", "decoder")]
    if all(h is not None and not isinstance(h, (int, bool)) for h in halves):
        enc, dec = (model_shape(h) for h in halves)
        if enc is None or dec is None:
            return None
        return Shape(max(enc.hidden, dec.hidden), enc.layers + dec.layers, None, dec.vocab)

    def first(*names: str) -> int | None:
        values = [getattr(config, n, None) for n in names]
        return next((v for v in values if isinstance(v, int) and not isinstance(v, bool) and v > 0), None)

    hidden = first("hidden_size", "d_model", "n_embd", "dim")
    layers = first("num_hidden_layers", "n_layer", "num_layers", "n_layers")
    seq2seq = [n for n in (first("encoder_layers"), first("decoder_layers")) if n]
    if seq2seq:  # Whisper/BART: both stacks (num_hidden_layers is the encoder's); TrOCR's decoder
        layers = sum(seq2seq)
    if not hidden or not layers:
        return None
    gated = getattr(config, "hidden_act", None) in GATED_ACTS
    intermediate = first("intermediate_size") if gated else None
    return Shape(hidden, layers, intermediate, first("vocab_size") or 0)


def smallest_gpu(gpus: Sequence[tuple[int, str, int]], ids: Sequence[int] | None) -> tuple[str, float] | None:
    """(name, GiB) of the smallest of ``gpus`` ((index, name, memory MiB)) that the plan uses
    (``ids``, None: all); None when none has a known size."""
    used = [g for g in gpus if (ids is None or g[0] in ids) and g[2] > 0]
    if not used:
        return None
    _, name, mib = min(used, key=lambda g: g[2])
    return name, mib / 1024


def check_memory(
    sizes: ModelSizes,
    per_device: int,
    max_length: int,
    gradient_checkpointing: bool,
    precision: str | None,
    gpu_gib: float,
    gpu_name: str,
    images: bool = False,
) -> MemoryCheck:
    """The estimate for a config's batch and length on a card of ``gpu_gib``, with the warning
    when it does not fit (``images``: a vision-language model, whose image tokens
    ``data.max_pixels`` bounds)."""
    shape = sizes.shape
    gib = estimate_gib(
        sizes.params,
        sizes.trainable,
        sizes.weight_bytes,
        per_device * max_length,
        shape.hidden,
        shape.layers,
        gradient_checkpointing,
        activation_bytes(precision, sizes.weight_bytes),
        intermediate=shape.intermediate,
        vocab=shape.vocab,
    )
    warning = memory_warning(
        gib,
        gpu_gib,
        gpu_name,
        half_weights=sizes.weight_bytes == 2,
        checkpointing=gradient_checkpointing,
        per_device=per_device,
        images=images,
    )
    return MemoryCheck(gib, gpu_gib, gpu_name, warning)
