"""The terms of the per-GPU memory estimate for training under DDP: pure functions (no torch, no
machine). xtrain/model/memory.py holds the check against the card, its warning and the changes it
suggests (``estimate_run`` gives it the estimate of one run's settings).

Under DDP every GPU holds the whole model. The estimate adds:

- the frozen weights: parameters x bytes per weight (2 for bf16/fp16, 4 for float32);
- the trained weights: float32 weights, gradients and AdamW's two moments (16 bytes each); with
  an 8-bit optimizer (``optim.name`` adamw_8bit, paged_adamw_8bit: bitsandbytes' block-wise
  ``AdamW8bit``) the moments are two uint8 values and a float32 absmax a block of 256 per moment,
  ``2 + 2 x 4 / 256 = 2.03`` bytes a weight, 10.03 in all; a tensor of fewer than 4096 weights
  (bitsandbytes' ``min_8bit_size``) keeps float32 moments, 16 bytes (``ModelSizes.small_trainable``
  counts them; bitsandbytes 0.50, ``optim/optimizer.py``, ``Optimizer2State.init_state``). A
  paged optimizer's state can move to CPU memory under pressure: it is counted on the GPU;
- activations: what autograd keeps for the backward pass in each stack of layers the task runs
  (``Task.stacks``: an encoder at its own positions, Whisper's 1500 frames or a ViT's patches, a
  VLM's vision tower and merger, the decoder or language model at ``data.max_length`` tokens),
  as each stack trains (``xtrain/model/activations.py``: a frozen stack whose input needs no
  gradient keeps nothing); with gradient checkpointing each layer's input, plus one layer while
  it is recomputed. A model no task hook reads falls back to a token a layer in 16-bit
  (Korthikanti et al. 2022): ``34 x hidden`` bytes for a GELU MLP, ``17 x hidden + 8 x
  intermediate`` for a gated one, at ``batch.per_device x data.max_length`` tokens;
- the logits of the loss: a token x the vocabulary x 10 bytes (16-bit logits, the float32 copy
  the loss takes, its log-softmax kept for the backward pass): 1.5 GiB for 1024 tokens of
  Qwen2's 152k vocabulary. Under the chunked loss (``model.chunked_loss``) one chunk of them
  (``chunk_rows`` positions, 128 MiB of float32 entries) and the gathered hidden states of the
  trained tokens (``chunked_logits_bytes``);
- generation's KV cache where the task generates in training (GRPO's completions): a micro-batch
  of sequences of ``kv_tokens`` (its prompt and completion), 2 (keys and values) x layers x
  key/value heads x head size values a token in the activations' precision (``kv_values``;
  Qwen2.5-7B in bf16: 56 KiB a token). Counted on top of the rest: on CUDA the compiled decode
  keeps its static cache from one step to the next;
- 10 % for the CUDA context, allocator slack and temporary buffers.

Quantized weights (``model.quantization``, bitsandbytes): the Linear layers that 4-bit or 8-bit
loading replaces (``ModelSizes.quantizable``: the language model's Linear layers, not the output
head, the modules trained whole or a vision tower) are counted at

- 4-bit NF4 with double quantization: 4 bits a weight, plus its block constants: one 8-bit absmax
  per block of 64 and one float32 constant per 256 blocks, ``8/64 + 32/(64 x 256) = 0.127`` bits
  (Dettmers et al. 2023, QLoRA, section 3 "Double Quantization"; bitsandbytes' ``blocksize=64``);
- 8-bit (LLM.int8): 1 byte a weight plus one float32 scale a row (``SCB``), ``4 / hidden``;

the rest (embeddings, norms, the output head, a vision tower) in float32: peft's
``prepare_model_for_kbit_training`` casts every 16-bit parameter that is not 4-bit to float32
(Qwen2.5-7B's untied embeddings and head: 1.09B parameters, 4.1 GiB).

Sequence parallelism (``parallel.sequence: N``, ``MemoryLevers.sequence``) counts each process's
share of every sequence: the activations and the loss's logits of ``max_length / N`` positions.
Ulysses' attention runs the whole sequence for ``1 / N`` of the heads: q, k, v, its output and
log-sum-exp are as many values as a share's for every head (the same term), and eager attention's
probabilities ``heads / N x length x length``, N times a share's square (counted so). Ring
attention keeps the share's q, k, v, output and log-sum-exp too. The weights, gradients and
optimizer states are every process's whole (DDP).

Activation offloading (``model.activation_offload``) leaves ``OFFLOAD_LAYERS`` layers' worth of
what autograd saves on the device (and, with checkpointing, the layer recomputed in the backward)
and counts the rest in host memory, held against the machine's RAM shared by its processes.

It is meant to tell "fits" from "far too big" before a long download, not to the last gigabyte.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from xtrain.model.activations import (
    OFFLOAD_LAYERS,
    Precision,
    Stack,
    activation_term,
    at_length,
    chunked_logits_bytes,
    loss_bytes,
    recompute_term,
    step_bytes,
    step_parts,
)

GIB = 1024**3
HALF = ("bfloat16", "float16")
# bits a weight of NF4 with double quantization: 4, the 8-bit absmax of each block of 64 and the
# float32 constant of each 256 blocks (QLoRA, section 3)
NF4_BITS = 4 + 8 / 64 + 32 / (64 * 256)
# bytes of a trained weight: its float32 value and gradient, and AdamW's two moments, float32 or
# bitsandbytes' 8-bit block-wise ones (a uint8 each, and a float32 absmax a block of 256 each)
TRAINED_BYTES = 4 + 4
MOMENT_BYTES = 2 * 4
MOMENT_BYTES_8BIT = 2 * (1 + 4 / 256)
# bitsandbytes' min_8bit_size: a tensor of fewer weights keeps float32 moments
MIN_8BIT_SIZE = 4096
# bytes of a weight that is not quantized in a quantized run: peft's prepare_model_for_kbit_training
# casts every fp16/bf16 parameter that is not 4-bit to float32 (peft/utils/other.py, peft 0.21)
KBIT_REST_BYTES = 4


def quantized_bytes(count: int, quantization: str, hidden: int) -> float:
    """Bytes of ``count`` weights loaded in ``quantization`` (4bit: NF4 with double quantization;
    8bit: LLM.int8's int8 weights and a float32 scale a row of about ``hidden`` weights)."""
    if quantization == "4bit":
        return count * NF4_BITS / 8
    return count * (1 + 4 / hidden)


def trained_bytes(trainable: int, moments_8bit: bool = False, small_trainable: int = 0) -> float:
    """Bytes of ``trainable`` trained weights with their gradients and AdamW's moments, 8-bit
    ones (``moments_8bit``) but for the ``small_trainable`` weights in tensors under
    ``MIN_8BIT_SIZE``, which bitsandbytes keeps in float32."""
    if not moments_8bit:
        return trainable * (TRAINED_BYTES + MOMENT_BYTES)
    small = min(small_trainable, trainable)
    return trainable * TRAINED_BYTES + small * MOMENT_BYTES + (trainable - small) * MOMENT_BYTES_8BIT


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
    quantized: int = 0,
    quantization: str | None = None,
    moments_8bit: bool = False,
    small_trainable: int = 0,
    saved: float | None = None,
    logits_bytes: float | None = None,
    offload: bool = False,
    recompute: float | None = None,
    generation_bytes: float = 0.0,
) -> float:
    """Estimated peak GPU memory in GiB of one training process (see the module docstring).
    ``tokens_per_device``: ``batch.per_device`` x tokens a sequence, image tokens included;
    ``activation_bytes``: 2 under fp16/bf16 autocast or 16-bit weights, 4 in float32;
    ``intermediate``: a gated MLP's width (None: a 4 x hidden GELU MLP); ``vocab``: the
    output vocabulary (0: no logits term); ``quantized``: how many of ``params`` are loaded in
    ``quantization`` (4bit, 8bit; None: none); ``moments_8bit``: an 8-bit optimizer, with
    ``small_trainable`` of the trained weights in tensors too small for 8-bit state; ``saved``:
    the activations' bytes from the task's stacks (``activations.step_bytes``), which then
    replace the per-token rule and leave ``tokens_per_device`` to the logits; ``logits_bytes``:
    the loss's term when it is not the plain one (the chunked loss: ``chunked_logits_bytes``);
    ``offload``: what autograd saves lives in host memory, the device keeps ``OFFLOAD_LAYERS``
    layers' worth of it (the one computing, the one whose copy is in flight) and, with
    checkpointing, the layer recomputed in the backward (``recompute``: its bytes where ``saved``
    gives the activations; else the per-token rule's); ``generation_bytes``: generation's KV cache
    (``kv_cache_bytes``)."""
    if quantization is None:
        weights = params * weight_bytes
    else:
        weights = (params - quantized) * weight_bytes + quantized_bytes(quantized, quantization, hidden)
    trained = trained_bytes(trainable, moments_8bit, small_trainable)
    activations = activation_term(tokens_per_device, hidden, layers, gradient_checkpointing,
                                  activation_bytes, intermediate, saved)  # fmt: skip
    if offload:
        again = recompute_term(tokens_per_device, hidden, gradient_checkpointing, activation_bytes,
                               intermediate, recompute)  # fmt: skip
        activations = again + (activations - again) * min(1.0, OFFLOAD_LAYERS / max(layers, 1))
    logits = tokens_per_device * vocab * 10 if logits_bytes is None else logits_bytes
    return 1.1 * (weights + trained + activations + logits + generation_bytes) / GIB


def kv_values(config: object) -> int:
    """Values a token holds in a KV cache: 2 (keys and values) x layers x key/value heads x head
    size, from a model's (text) config; 0 when it does not say its shape."""
    get_text = getattr(config, "get_text_config", None)
    text = get_text() if callable(get_text) else config
    layers = getattr(text, "num_hidden_layers", None)
    heads = getattr(text, "num_attention_heads", None)
    hidden = getattr(text, "hidden_size", None)
    if not (isinstance(layers, int) and isinstance(heads, int) and isinstance(hidden, int) and heads):
        return 0
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or hidden // heads
    return 2 * layers * kv_heads * head_dim


def kv_cache_bytes(sequences: int, tokens: int, values: int, value_bytes: int) -> float:
    """Generation's KV cache: ``sequences`` of ``tokens`` of ``values`` (``kv_values``) each."""
    return float(sequences * tokens * values * value_bytes)


@dataclass(frozen=True)
class ModelSizes:
    """What the estimate needs from a model: its parameters, the trained ones, its language
    model's shape (``Shape``), the bytes of a frozen weight as loaded (one not quantized), the
    frozen Linear weights that 4-bit/8-bit loading replaces (``quantizable``; 0: none, or a
    full fine-tune, which cannot train quantized weights) and how they are loaded
    (``quantization``: 4bit, 8bit, None: as ``weight_bytes``); whether the optimizer keeps
    8-bit moments (``moments_8bit``: ``optim.name`` adamw_8bit, paged_adamw_8bit) and the trained
    weights in tensors under ``MIN_8BIT_SIZE`` (``small_trainable``), which keep float32 ones."""

    params: int
    trainable: int
    shape: Shape
    weight_bytes: int
    # not compared: the plan counts it on the config's skeleton, a built 16-bit model by its frozen
    # Linear layers; the two can differ by layers that are frozen but never quantized
    quantizable: int = field(default=0, compare=False)
    quantization: str | None = None
    moments_8bit: bool = False
    small_trainable: int = 0
    # the task's stacks with how each trains (``activations``; empty: the per-token rule), whether
    # the output head trains (it keeps its input), LoRA's rank (0: none) and whether its dropout is on
    stacks: tuple[Stack, ...] = ()
    head_trains: bool = False
    lora_rank: int = 0
    lora_dropout: bool = False
    # generation in training (``Task.kv_cache_tokens``): tokens a sequence holds in the KV cache
    # (0: the task does not generate in training) and the values a token (``kv_values``)
    kv_tokens: int = 0
    kv_values: int = 0


@dataclass(frozen=True)
class Shape:
    """The part whose activations grow with the tokens: width, depth, a gated MLP's width
    (None: not gated or unknown) and the output vocabulary (0: unknown)."""

    hidden: int
    layers: int
    intermediate: int | None = None
    vocab: int = 0


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


@dataclass(frozen=True)
class MemoryLevers:
    """The levers without Triton, as a run has them and as the warning may offer them: the chunked
    loss (``chunked``; ``chunkable``: the task's loss could run chunked and the config turned it
    off), activation offloading (``offload``; offered where ``host_gib``, the machine's RAM, is
    known) and the processes that share that RAM."""

    chunked: bool = False
    chunkable: bool = False
    offload: bool = False
    host_gib: float | None = None
    processes: int = 1
    # parallel.sequence: each sequence split across this many processes, each holding its share of
    # the tokens (the activations and logits of max_length / N positions; Ulysses' attention runs
    # the whole sequence for 1/N of the heads: the same bytes, eager's probabilities N times)
    sequence: int = 1


def estimate_run(
    sizes: ModelSizes,
    per_device: int,
    max_length: int,
    checkpointing: bool,
    precision: str | None,
    levers: MemoryLevers = MemoryLevers(),
) -> tuple[float, float]:
    """(GiB on the device, GiB of activations a process keeps in host memory: 0 without offload)."""
    shape = sizes.shape
    # quantized: the rest in float32, as peft's prepare_model_for_kbit_training leaves it
    rest = max(sizes.weight_bytes, KBIT_REST_BYTES) if sizes.quantization else sizes.weight_bytes
    act = activation_bytes(precision, sizes.weight_bytes)
    share = -(-max_length // levers.sequence)  # this process's tokens of each sequence
    saved, tokens, recompute = None, per_device * share, None
    if sizes.stacks:  # what autograd keeps of the task's stacks; the logits at the last one's tokens
        stacks = at_length(sizes.stacks, max_length, levers.sequence)
        last, bytes_of = stacks[-1], Precision(act, 1, sizes.lora_rank, sizes.lora_dropout)
        kept, again = step_parts(stacks, bytes_of, checkpointing)
        head = last.positions * last.hidden * act if sizes.head_trains else 0  # a trained head's input
        saved, tokens = per_device * (kept + again + head), per_device * last.positions
        recompute = per_device * again
    logits = chunked_logits_bytes(tokens, shape.vocab, shape.hidden, act) if levers.chunked else None
    args = (sizes.params, sizes.trainable, rest, tokens, shape.hidden, shape.layers, checkpointing, act)
    more = {
        "intermediate": shape.intermediate, "vocab": shape.vocab, "quantized": sizes.quantizable,
        "quantization": sizes.quantization, "moments_8bit": sizes.moments_8bit,
        "small_trainable": sizes.small_trainable, "saved": saved, "logits_bytes": logits,
    }  # fmt: skip
    more["generation_bytes"] = kv_cache_bytes(per_device, sizes.kv_tokens, sizes.kv_values, act)
    device = estimate_gib(*args, **more, offload=levers.offload, recompute=recompute)
    if not levers.offload:
        return device, 0.0
    host = activation_term(tokens, shape.hidden, shape.layers, checkpointing, act, shape.intermediate, saved)
    host -= recompute_term(tokens, shape.hidden, checkpointing, act, shape.intermediate, recompute)
    return device, host / GIB


def saved_bytes(sizes: ModelSizes, checkpointing: bool, precision: Precision) -> tuple[float, float]:
    """(bytes a sample the stacks keep for the backward pass, a trained output head's input
    included; bytes a sample the loss keeps: the float32 log-softmax over the vocabulary at the
    last stack's positions). The benchmark holds these against autograd's saved tensors."""
    layers = step_bytes(sizes.stacks, precision, checkpointing)
    last = sizes.stacks[-1]
    head = loss_bytes(0, last.positions, last.hidden, sizes.head_trains, precision)
    return layers + head, loss_bytes(sizes.shape.vocab, last.positions, last.hidden, False, precision)
