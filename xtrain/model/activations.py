"""The activation term of the memory estimate: the bytes autograd keeps for the backward pass of
one training step, from the stacks of layers the step runs (pure functions: no torch, no machine).

A task says which stacks a step runs (``Task.stacks``: an encoder of 1500 audio frames and a
decoder of ``data.max_length`` tokens for Whisper, a ViT encoder of (image / patch)^2 + 1 patches,
a VLM's vision tower, its merger and its language model); ``model_size`` says how each trains
(``frozen``, ``lora`` with the adapters on each site, ``full``). The bytes follow what autograd
really saves, op by op (read from the ``_saved_*`` tensors of each op's backward node, torch 2.13,
transformers 5.24, peft 0.21), for a pre-norm transformer layer:

- a norm keeps its input in float32 (transformers' RMSNorm upcasts; LayerNorm runs in float32
  under autocast) when its input needs a gradient or its weight trains, and a trained RMSNorm
  weight the normalized input too;
- a Linear keeps its input only when its weight trains (``full``); a frozen Linear keeps nothing
  (its input's gradient needs only the weight). Under LoRA each adapter keeps its input (with
  ``lora.dropout`` > 0: its own dropped copy, and the dropout mask when the input needs a
  gradient) and ``r`` values a position (``lora_A``'s output);
- attention through sdpa/flash keeps q, k, v, its output and a float32 log-sum-exp a head;
  eager attention keeps q, k, v and the probabilities (heads x keys a position, float32 and a
  16-bit copy under autocast): the attention score memory of eager attention is counted;
- a GELU MLP keeps the activation's input; a gated one (SwiGLU) the gate, its activation and
  the up projection; a model's own dropout (TrOCR's 0.1) keeps a mask after attention and MLP;
- a cross-attention (Whisper's, TrOCR's decoder) keeps k and v of the encoder's positions in
  every decoder layer: the encoder's length shows in the decoder's term too.

Nothing is kept where nothing needs a gradient: a frozen encoder whose input needs none (LoRA
on the decoder only, the default vision tower of a VLM) keeps no activations; a frozen stack after
a trained one keeps them (the gradient passes through it). With gradient checkpointing each layer
keeps its input, plus one layer's activations while it is recomputed.

Not counted: RoPE's cos/sin tables, the attention mask, LayerNorm's mean/rstd (a few values a
position), a ViT pooler; a model whose layers are not attention + MLP blocks is estimated as one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

NORM_BYTES = 4  # norms keep their input in float32
LSE_BYTES = 4  # sdpa/flash's log-sum-exp, float32, a head and a position
INDEX_BYTES = 8  # an embedding lookup keeps its int64 indices

# Linear layers by where their input comes from in a layer (their leaf name, and for a cross-
# attention a parent named like one): adapters on one site share an input, and a trained
# Linear keeps it once.
SITES = {
    "attn_in": ("q_proj", "k_proj", "v_proj", "query", "key", "value", "qkv", "c_attn", "Wqkv", "in_proj"),
    "attn_out": ("o_proj", "out_proj", "proj", "c_proj", "dense"),
    "mlp_in": ("fc1", "gate_proj", "up_proj", "c_fc", "w1", "w3", "0"),
    "mlp_out": ("fc2", "down_proj", "w2", "2"),
}
CROSS = ("encoder_attn", "crossattention", "cross_attn")
MLP_PARENTS = ("mlp", "feed_forward", "ffn")


def site_of(name: str) -> str | None:
    """The site of a Linear layer inside a layer from its qualified name (``...self_attn.q_proj``:
    attn_in; ``...encoder_attn.k_proj``: cross_kv); None for one the rules do not know."""
    parts = name.split(".")
    leaf, parents = parts[-1], parts[:-1]
    if any(p in CROSS for p in parents):
        if leaf in ("k_proj", "v_proj", "key", "value", "c_attn"):
            return "cross_kv"
        return "cross_q" if leaf in SITES["attn_in"] + ("q_attn",) else "cross_out"
    if leaf == "c_proj":  # GPT-2: attn.c_proj, mlp.c_proj
        return "mlp_out" if any(p in MLP_PARENTS for p in parents) else "attn_out"
    if leaf == "dense" and parents and parents[-1] in ("intermediate",):  # BERT/ViT
        return "mlp_in"
    if leaf == "dense" and len(parents) > 1 and parents[-1] == "output" and parents[-2] != "attention":
        return "mlp_out"
    return next((site for site, leaves in SITES.items() if leaf in leaves), None)


@dataclass(frozen=True)
class Stack:
    """One stack of layers a training step runs: a sample's positions through it, its depth and
    widths, its attention (eager keeps the scores), what it reads (``cross``: the positions of the
    previous stack's output its cross-attention reads; ``follows``: its input is the previous
    stack's output, a VLM's merged image features), and how it trains (``model_size`` fills
    ``trains`` and ``adapters``: (site, adapters a layer))."""

    part: str  # "encoder", "decoder", "vision tower", "projector", "language model"
    positions: int
    layers: int
    hidden: int
    intermediate: int
    heads: int
    module: str = ""  # its qualified module name (where model_size looks for what trains)
    gated: bool = False  # SwiGLU/GeGLU MLP
    rms_norm: bool = False  # transformers' RMSNorm: a trained weight also keeps the normalized input
    eager: bool = False  # eager attention: the probabilities are kept
    cross: int = 0  # positions of the encoder output its cross-attention reads (0: none)
    cross_hidden: int = 0  # their width
    follows: bool = False  # its input is the previous stack's output
    mlp_only: bool = False  # a projector: a norm and an MLP, no attention
    dropout: bool = False  # the model's own dropout after attention and MLP (a mask each)
    stem: int = 0  # values a position its input layers keep when they train (a conv stem, patches)
    embeds: bool = False  # its input is token embeddings (indices kept when they train)
    text: bool = False  # its positions are data.max_length tokens (the estimate sets them)
    # positions a sample has beyond data.max_length (a completion the step generates: GRPO's,
    # distillation's), kept when the estimate sets the length
    extra: int = 0
    # processes its sequences are split across (parallel.sequence): ``positions`` are one process's
    # share; eager attention's probabilities span every process's keys (Ulysses: the whole sequence
    # for 1/N of the heads, N times a share's square)
    sequence: int = 1
    trains: str = "frozen"  # frozen | lora | full
    adapters: tuple[tuple[str, int], ...] = field(default=())


@dataclass(frozen=True)
class Precision:
    """Bytes a value: ``act`` of activations (2 under fp16/bf16, 4 in float32), ``mask`` of a
    dropout mask (1 on CUDA, whose fused dropout keeps a bool mask; the activation's size on the
    CPU, which multiplies by a float mask), LoRA's ``rank`` and whether its dropout is on."""

    act: int = 2
    mask: int = 1
    rank: int = 8
    lora_dropout: bool = True


def _site(
    stack: Stack, p: Precision, name: str, width: int, positions: int, grad_in: bool, shared: bool = False
) -> float:
    """Bytes a sample the Linear layers on one site keep for their weights' gradients (``shared``:
    their input is kept once for the whole stack, ``stack_bytes`` counts it)."""
    if stack.trains == "full":
        return 0.0 if shared else width * positions * p.act
    count = dict(stack.adapters).get(name, 0)
    if not count:
        return 0.0
    kept = count * p.rank * positions * p.act  # lora_A's output, kept by lora_B
    if p.lora_dropout:  # each adapter's own dropped copy, and its mask where the input needs a gradient
        return kept + count * width * positions * (p.act + (p.mask if grad_in else 0))
    return kept + (0 if shared else width * positions * p.act)  # the input, shared by the site's adapters


def _norm(stack: Stack, p: Precision, positions: int, grad_in: bool) -> float:
    """Bytes a sample a norm keeps: its float32 input when that needs a gradient or its weight
    trains; a trained RMSNorm weight also the normalized input (in the activations' dtype)."""
    full = stack.trains == "full"
    if not (grad_in or full):
        return 0.0
    return stack.hidden * positions * (NORM_BYTES + (p.act if full and stack.rms_norm else 0))


def _attention(stack: Stack, p: Precision, queries: int, keys: int, spread: int = 1) -> float:
    """Bytes a sample one attention keeps once q/k/v need a gradient (k and v at the full width:
    grouped-query heads are repeated before sdpa); ``spread``: the processes a sequence is split
    across, whose keys every query's probabilities span (eager)."""
    h = stack.hidden
    if stack.eager:  # q, k, v and the probabilities (float32 softmax, a 16-bit copy under autocast)
        probs = stack.heads * queries * keys * spread * (4 + (p.act if p.act < 4 else 0))
        return (queries + 2 * keys) * h * p.act + probs
    return 2 * (queries + keys) * h * p.act + queries * stack.heads * LSE_BYTES


def layer_bytes(stack: Stack, p: Precision, grad_in: bool, memory_grad: bool) -> tuple[float, bool]:
    """(bytes a sample one layer keeps, whether its output needs a gradient), from whether its
    input does (``grad_in``) and whether the encoder output its cross-attention reads does."""
    full = stack.trains == "full"
    adapted = dict(stack.adapters)
    L, h, f = stack.positions, stack.hidden, stack.intermediate
    g, total = grad_in, 0.0
    masks = 0
    if not stack.mlp_only:
        total += _norm(stack, p, L, g)
        total += _site(stack, p, "attn_in", h, L, g)
        qkv = g or full or "attn_in" in adapted
        total += _attention(stack, p, L, L, stack.sequence) if qkv else 0
        total += _site(stack, p, "attn_out", h, L, qkv)
        g = g or qkv or "attn_out" in adapted
        masks += 1 if g else 0
        if stack.cross:
            S, width = stack.cross, stack.cross_hidden or h
            total += _norm(stack, p, L, g)
            total += _site(stack, p, "cross_q", h, L, g)
            total += _site(stack, p, "cross_kv", width, S, memory_grad, shared=_shared_memory(stack, p))
            kv = memory_grad or full or "cross_kv" in adapted
            q = g or full or "cross_q" in adapted
            total += _attention(stack, p, L, S) if q or kv else 0
            total += _site(stack, p, "cross_out", h, L, q or kv)
            g = g or q or kv or "cross_out" in adapted
            masks += 1 if g else 0
    total += _norm(stack, p, L, g)
    total += _site(stack, p, "mlp_in", h, L, g)
    inner = g or full or "mlp_in" in adapted
    total += (3 if stack.gated else 1) * f * L * p.act if inner else 0
    total += _site(stack, p, "mlp_out", f, L, inner)
    g = g or inner or "mlp_out" in adapted
    masks += 1 if g else 0
    if stack.dropout:
        total += masks * h * L * p.mask
    return total, g


def _shared_memory(stack: Stack, p: Precision) -> bool:
    """The encoder output is kept once for every cross-attention layer: its k/v projections train
    (each keeps the same tensor) or carry adapters without dropout."""
    return stack.trains == "full" or bool(dict(stack.adapters).get("cross_kv") and not p.lora_dropout)


def stack_bytes(stack: Stack, p: Precision, grad_in: bool, memory_grad: bool) -> tuple[float, bool]:
    """(bytes a sample the whole stack keeps, whether its output needs a gradient)."""
    if stack.trains == "frozen" and not grad_in and not (stack.cross and memory_grad):
        return 0.0, False  # nothing in it or before it trains: autograd records nothing
    full = stack.trains == "full"
    total = 0.0
    if full:  # its input layers train: a conv stem or patch embedding, token indices
        total += stack.stem * stack.positions * p.act + (INDEX_BYTES * stack.positions if stack.embeds else 0)
        grad_in = True
    if stack.cross and _shared_memory(stack, p):  # the encoder output: one storage for every layer
        total += stack.cross * (stack.cross_hidden or stack.hidden) * p.act
    g = grad_in
    for i in range(stack.layers):
        kept, g = layer_bytes(stack, p, g, memory_grad)
        total += kept
        if i == 0 and stack.layers > 1:  # the rest repeat the second layer
            rest, g = layer_bytes(stack, p, g, memory_grad)
            total += rest * (stack.layers - 1)
            break
    if not stack.mlp_only:
        total += _norm(stack, p, stack.positions, g)  # the final norm
    return total, g


def step_bytes(stacks: Sequence[Stack], p: Precision, checkpointing: bool = False) -> float:
    """Bytes a sample all stacks keep for the backward pass, in the order a step runs them. With
    gradient checkpointing each layer that passes a gradient keeps its input, and the largest
    layer's activations exist again while it is recomputed."""
    return sum(step_parts(stacks, p, checkpointing))


def step_parts(stacks: Sequence[Stack], p: Precision, checkpointing: bool = False) -> tuple[float, float]:
    """``step_bytes`` in two parts: (what autograd saves during the forward, the largest layer
    recomputed in the backward: 0 without checkpointing). Activation offloading moves the first."""
    total, before = 0.0, False
    recompute = 0.0
    for stack in stacks:
        grad_in = before if stack.follows else False
        memory = before if stack.cross else False
        kept, after = stack_bytes(stack, p, grad_in, memory)
        if checkpointing and kept:
            one, _ = layer_bytes(stack, p, True, memory)
            recompute = max(recompute, one)
            kept = stack.layers * stack.positions * stack.hidden * p.act + (
                stack.cross * (stack.cross_hidden or stack.hidden) * p.act if stack.cross else 0
            )
        total += kept
        before = after
    return total, recompute


def loss_bytes(vocab: int, positions: int, hidden: int, head_trains: bool, p: Precision) -> float:
    """Bytes a sample the output head and the loss keep: the float32 log-softmax of every
    position (cross-entropy's backward), and the head's input when the head trains."""
    return positions * (4 * vocab + (hidden * p.act if head_trains else 0))


def with_training(stack: Stack, trains: str, adapters: dict[str, int]) -> Stack:
    return replace(stack, trains=trains, adapters=tuple(sorted(adapters.items())))


def at_length(stacks: Sequence[Stack], max_length: int, sequence: int = 1) -> tuple[Stack, ...]:
    """``stacks`` with their text stacks at ``max_length`` tokens a sample (and their ``extra``),
    each process's share of them when ``sequence`` processes split each sequence (parallel.sequence)."""
    return tuple(
        replace(s, positions=-(-(max_length + s.extra) // sequence), sequence=sequence) if s.text else s
        for s in stacks
    )


# -- the memory levers' terms (xtrain/model/estimate.py's estimate) -------------------------
# The chunked loss's chunks: logits entries a chunk (rows x vocabulary), 2^25 = 128 MiB in float32:
# 220 positions of Qwen2's 152,064-entry vocabulary, 1048 of a 32k one (xtrain/model/chunked_loss.py)
CHUNK_ENTRIES = 2**25
MIN_CHUNK_ROWS = 16
# activation offloading: the device keeps the activations of about this many layers (the one
# computing and the one whose copy to the host is in flight)
OFFLOAD_LAYERS = 2


def activation_term(
    tokens: int,
    hidden: int,
    layers: int,
    checkpointing: bool,
    act: int,
    intermediate: int | None,
    saved: float | None,
) -> float:
    """The activations' bytes: ``saved`` (the task's stacks) where known, else the per-token rule
    (Korthikanti et al. 2022; with checkpointing each layer's input and one recomputed layer)."""
    if saved is not None:
        return saved
    layer = 34 * hidden if intermediate is None else 17 * hidden + 8 * intermediate  # bytes, 16-bit
    # with checkpointing: the layer inputs + one recomputed layer
    kept = tokens * (layers * 2 * hidden + layer) if checkpointing else tokens * layers * layer
    return kept * act // 2


def recompute_term(
    tokens: int,
    hidden: int,
    checkpointing: bool,
    act: int,
    intermediate: int | None,
    recompute: float | None,
) -> float:
    """Of ``activation_term``, the layer recomputed in the backward under checkpointing (created in
    the backward: activation offloading does not move it); ``recompute`` where the stacks give it."""
    if not checkpointing:
        return 0.0
    if recompute is not None:
        return recompute
    layer = 34 * hidden if intermediate is None else 17 * hidden + 8 * intermediate  # bytes, 16-bit
    return tokens * layer * act // 2


def chunk_rows(vocab: int, entries: int = CHUNK_ENTRIES) -> int:
    """Positions a chunk of the chunked loss for a head of ``vocab`` outputs."""
    return max(MIN_CHUNK_ROWS, entries // max(vocab, 1))


def chunked_logits_bytes(tokens: int, vocab: int, hidden: int, act: int) -> float:
    """The chunked loss's peak (xtrain/model/chunked_loss.py): one chunk's logits at the plain
    loss's 10 bytes an entry (``estimate_gib``: 16-bit logits, their float32 copy, its gradient),
    and the gathered hidden states of every trained token with their float32 gradient (all
    ``tokens`` counted as trained: the estimate does not know the labels)."""
    rows = min(tokens, chunk_rows(vocab))
    return rows * vocab * 10 + tokens * hidden * (act + 4)
