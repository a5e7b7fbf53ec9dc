"""Cross-entropy over the trained tokens only, in chunks: the model's own loss without its logits.

A causal LM's training step materialises ``batch x sequence x vocabulary`` logits and their
float32 copy in the loss (Qwen2's 152,064 entries: 1.2 GiB a 2048-token sequence for the float32
copy alone), most of them for prompt tokens whose label is -100. Here the output head runs only on
the positions that carry a label, a chunk of ``rows`` positions at a time:

1. the labels are shifted as the model's own loss shifts them (``shift``: a causal LM's position
   t predicts label t+1, transformers' ``ForCausalLMLoss``; an encoder-decoder's decoder positions
   line up with their labels, Whisper's and ``VisionEncoderDecoderModel``'s ``CrossEntropyLoss``);
2. the hidden states of the positions whose label is not -100 are gathered (one host sync: the
   count sizes the chunks);
3. each chunk runs the head's ``forward`` (a frozen ``nn.Linear``, a trained copy behind peft's
   ``modules_to_save``, a LoRA-adapted ``lora.Linear``; under FSDP2 on the weights its group
   gathered: the module's hooks fire once, for the model's own call of the head), maps the
   logits as the model does after its head (``LogitMap``: Gemma 2's soft-capping, Cohere's and
   Granite's scaling), upcasts to float32 as transformers' loss does,
   and sums its cross-entropy; the sum over every chunk divided by the number of trained tokens is
   the model's own mean (``reduction="mean"`` with ``ignore_index=-100``).

How a chunk's logits are kept out of memory (``chunked_cross_entropy``'s ``how``):

- ``"eager"`` (the default): each chunk's gradients are taken at once, inside the forward
  (``torch.autograd.grad`` on the chunk: the hidden states' and the trained head weights'), and the
  logits freed; the backward only scales them by the incoming gradient. No recomputation: the head
  runs once a chunk forward and once backward, as in the plain loss, on the trained tokens only.
  A head trained whole holds its gradient from the forward on (``vocab x hidden`` float32);
- ``"checkpoint"``: ``torch.utils.checkpoint`` per chunk (non-reentrant): the chunk's logits are
  recomputed in the backward. One more head matmul a chunk; a trained head's gradient is made in the
  backward, as usual. ``benchmarks/chunked_loss.py`` measures both.

``ChunkedLoss`` puts it into a model's training forward through two module hooks, so the loop's
``model(**batch).loss`` is unchanged: the pre-hook takes the ``labels`` out of the call (an
encoder-decoder gets the ``decoder_input_ids`` its forward would have made from them), and
replaces the head's ``forward`` for that one call; the head call computes the loss and returns an
empty logits tensor made from the loss (so that hooks on the head's output, FSDP2's pre-backward
all-gather among them, run before the loss's backward: ``ChunkedLoss._head_call``); the forward
hook puts the loss in the output's ``loss``. Evaluation and
generation (eval mode or no gradient) run the model untouched.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from xtrain.model.activations import CHUNK_ENTRIES, chunk_rows

if TYPE_CHECKING:
    from torch.utils.hooks import RemovableHandle
    from transformers import PretrainedConfig
    from transformers.utils import ModelOutput

IGNORE_INDEX = -100
HOWS = ("eager", "checkpoint")
__all__ = ["CHUNK_ENTRIES", "ChunkedLoss", "LogitMap", "chunk_rows", "chunked_cross_entropy", "logit_map"]


@dataclass(frozen=True)
class LogitMap:
    """What a model does to its head's output before the loss: ``logits * scale`` (Cohere's
    ``logit_scale``; Granite's ``1 / logits_scaling``), then ``softcap * tanh(logits / softcap)``
    (Gemma 2/3's ``final_logit_softcapping``)."""

    scale: float = 1.0
    softcap: float | None = None

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        if self.scale != 1.0:
            logits = logits * self.scale
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits


# Config keys of a transformed head output or an extra loss term the chunked loss does not
# reproduce: the plain loss runs (auto), or ``on`` is refused, naming the key.
NOT_REPRODUCED = (
    "output_logit_soft_cap",
    "logits_soft_cap",
    "logits_mup_width_multiplier",
    "output_router_logits",  # MoE: the router's auxiliary loss is added to the model's loss
    "output_auxiliary_logits",
)


def _configs(config: PretrainedConfig) -> list[PretrainedConfig]:
    text = config.get_text_config() if hasattr(config, "get_text_config") else None
    decoder = getattr(config, "decoder", None)
    found = [config, text, decoder if decoder is not None and not isinstance(decoder, (int, bool)) else None]
    return [c for i, c in enumerate(found) if c is not None and all(c is not o for o in found[:i])]


def logit_map(config: PretrainedConfig) -> LogitMap | str:
    """The ``LogitMap`` a model's config says its forward applies after the head, or why the
    chunked loss cannot reproduce that model's loss (one clause)."""
    mapping = LogitMap()
    for c in _configs(config):
        for key in NOT_REPRODUCED:
            if getattr(c, key, None):
                return f"its config sets {key} (the chunked loss does not reproduce it)"
        cap = getattr(c, "final_logit_softcapping", None)
        scale = getattr(c, "logit_scale", None)
        scaling = getattr(c, "logits_scaling", None)
        if cap:
            mapping = replace(mapping, softcap=float(cap))
        if isinstance(scale, (int, float)) and not isinstance(scale, bool) and scale != 1:
            mapping = replace(mapping, scale=mapping.scale * float(scale))
        if isinstance(scaling, (int, float)) and not isinstance(scaling, bool) and scaling not in (0, 1):
            mapping = replace(mapping, scale=mapping.scale / float(scaling))
    return mapping


# ---------------------------------------------------------------------------------------------
# The loss


def _chunk_sum(head: Callable[[torch.Tensor], torch.Tensor], h: torch.Tensor, y: torch.Tensor,
               mapping: LogitMap) -> torch.Tensor:  # fmt: skip
    logits = mapping(head(h).float())  # float32, as transformers' ForCausalLMLoss upcasts
    return F.cross_entropy(logits, y, reduction="sum")


class _EagerChunks(torch.autograd.Function):
    """The chunks' summed cross-entropy, each chunk's gradients taken during the forward."""

    @staticmethod
    def forward(ctx: Any, h: torch.Tensor, y: torch.Tensor, head: Callable[[torch.Tensor], torch.Tensor],
                mapping: LogitMap, rows: int,
                *params: torch.Tensor) -> torch.Tensor:  # fmt: skip
        grad_h = torch.empty_like(h)
        grad_p: list[torch.Tensor | None] = [None] * len(params)
        total = torch.zeros((), dtype=torch.float32, device=h.device)
        needs_h = ctx.needs_input_grad[0]
        with torch.enable_grad():
            for start in range(0, h.shape[0], rows):
                hc = h[start : start + rows].detach().requires_grad_(needs_h)
                loss = _chunk_sum(head, hc, y[start : start + rows], mapping)
                wrt = ([hc] if needs_h else []) + list(params)
                grads = torch.autograd.grad(loss, wrt, allow_unused=True) if wrt else ()
                if needs_h:
                    grad_h[start : start + rows] = grads[0]
                    grads = grads[1:]
                for i, g in enumerate(grads):
                    if g is not None:
                        grad_p[i] = g if grad_p[i] is None else grad_p[i].add_(g)
                total += loss.detach()
        ctx.used = [g is not None for g in grad_p]
        ctx.save_for_backward(grad_h, *[g for g in grad_p if g is not None])
        return total

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        grad_h, *kept = ctx.saved_tensors
        stored = iter(kept)
        params = [next(stored) * grad_out if used else None for used in ctx.used]
        return (grad_h * grad_out.to(grad_h.dtype), None, None, None, None, *params)


def chunked_cross_entropy(
    head: Callable[[torch.Tensor], torch.Tensor],
    hidden: torch.Tensor,
    labels: torch.Tensor,
    *,
    shift: bool,
    rows: int,
    mapping: LogitMap | None = None,
    how: str = "eager",
    params: Sequence[torch.Tensor] | None = None,
) -> torch.Tensor:
    """The mean cross-entropy of ``head(hidden)`` against ``labels`` over the positions whose label
    is not -100 (shifted by one for a causal LM: ``shift``), ``rows`` positions at a time (see the
    module docstring). ``hidden``: ``[..., positions, width]``; ``labels``: ``[..., positions]``.
    ``params``: the trained tensors ``head`` uses (default: a module head's parameters that
    require a gradient; a plain function's, such as a module's bound ``forward``, must be named).
    NaN when no position has a label, as the model's own mean."""
    if hidden.shape[:-1] != labels.shape:
        raise ValueError(
            f"the output head got hidden states of shape {tuple(hidden.shape)} for labels of shape "
            f"{tuple(labels.shape)}: this model's head does not line up with its labels"
        )
    mapping = mapping or LogitMap()
    labels = labels.to(hidden.device)
    if shift:
        labels = F.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:]
    flat_labels = labels.reshape(-1)
    keep = (flat_labels != IGNORE_INDEX).nonzero().squeeze(1)  # the one host sync
    h = hidden.reshape(-1, hidden.shape[-1]).index_select(0, keep)
    y = flat_labels.index_select(0, keep)
    count = int(keep.numel())
    if how == "eager":
        if params is None:
            params = [p for p in getattr(head, "parameters", lambda: [])() if p.requires_grad]
        total = _EagerChunks.apply(h, y, head, mapping, rows, *params)
    elif how == "checkpoint":
        from torch.utils.checkpoint import checkpoint

        total = h[:0].float().sum()  # 0, in the graph
        for start in range(0, count, rows):
            part = (h[start : start + rows], y[start : start + rows])
            total = total + checkpoint(_chunk_sum, head, *part, mapping, use_reentrant=False)
    else:
        raise ValueError(f"how={how!r}: one of {HOWS}")
    return total / count if count else total * math.nan


def shift_right(labels: torch.Tensor, pad_token_id: int, decoder_start_token_id: int) -> torch.Tensor:
    """The decoder inputs an encoder-decoder's forward makes from its labels when given none
    (transformers' ``shift_tokens_right`` of Whisper and ``VisionEncoderDecoderModel``)."""
    shifted = labels.new_zeros(labels.shape)
    shifted[:, 1:] = labels[:, :-1].clone()
    shifted[:, 0] = decoder_start_token_id
    return shifted.masked_fill_(shifted == IGNORE_INDEX, pad_token_id)


# ---------------------------------------------------------------------------------------------
# In the model's training forward


class ChunkedLoss:
    """The chunked loss inside ``model``'s training forward (module hooks; ``attach``/``detach``).

    ``kind``: ``next-token`` (a causal LM: shifted labels) or ``decoder`` (an encoder-decoder:
    labels line up with the decoder positions, whose inputs are made from them here as the
    model's forward would). The head is ``model.get_output_embeddings()`` (through peft's and
    accelerate's wrappers: the module the model calls)."""

    def __init__(
        self, model: torch.nn.Module, kind: str, mapping: LogitMap, rows: int, how: str = "eager"
    ) -> None:
        if kind not in ("next-token", "decoder"):
            raise ValueError(f"kind={kind!r}")
        self.model, self.kind, self.mapping, self.rows, self.how = model, kind, mapping, rows, how
        self.head = model.get_output_embeddings()
        self.labels: torch.Tensor | None = None
        self.shift = kind == "next-token"  # this call's labels still to be shifted
        self.loss: torch.Tensor | None = None
        self.handles: list[RemovableHandle] = []
        # an instance-level forward the head had (accelerate's hooks)
        self._own_forward: Callable[..., torch.Tensor] | None = None

    def attach(self) -> ChunkedLoss:
        self.handles = [
            self.model.register_forward_pre_hook(self._before, with_kwargs=True),
            self.model.register_forward_hook(self._after),
        ]
        return self

    def detach(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []
        self._restore()

    def _before(
        self, module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]
    ) -> tuple[tuple, dict] | None:
        if not (module.training and torch.is_grad_enabled()) or kwargs.get("labels") is None:
            return None  # evaluation, generation: the model as it is
        kwargs = dict(kwargs)
        self.labels = kwargs.pop("labels")
        shifted = kwargs.pop("shift_labels", None)  # a sequence shard's: shifted before the cut
        self.shift = shifted is None and self.kind == "next-token"
        if shifted is not None:
            self.labels = shifted
        if self.kind == "decoder" and kwargs.get("decoder_input_ids") is None:
            config = self.model.config
            kwargs["decoder_input_ids"] = shift_right(
                self.labels, config.pad_token_id, config.decoder_start_token_id
            )
        current = self.head.__dict__.get("forward")
        if current != self._head_call:  # not left over from a forward that raised before its head
            self._own_forward = current
        self.head.forward = self._head_call  # this call only: the instance attribute shadows the class's
        return args, kwargs

    def _head_call(self, hidden: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        """The model's one call of its head: the whole chunked loss, and what it returns instead
        of logits.

        The chunks run the head's ``forward`` (its computation, peft's adapter included), not the
        module: the module's hooks fire once a training forward, for this call, as they do for the
        plain loss. FSDP2's are among them (its group of the head, accelerate's tail of final norm
        and head): run once a chunk, the group's post-forward fired on the first chunk's logits
        and registered its pre-backward hook there; the ``"eager"`` chunk's own backward (inside
        this forward) then fired it, queueing FSDP's end-of-backward callback, which resharded
        the group before the step's backward; the final norm's multiply read its freed weight:
        SIGSEGV (a full fine-tune under FSDP2 on CPU; docs/reliability.md).

        The returned stand-in for the logits is computed from the loss and the loss from it, so
        the gradient reaches it first: whatever the module's hooks registered on it (FSDP2's
        pre-backward all-gather of the head's group) runs before any chunk's backward or
        recomputation needs the head's weights. It is empty: the loss's value and gradients are
        unchanged (its sum is an exact 0)."""
        self._restore()
        assert self.labels is not None
        params = [p for p in self.head.parameters() if p.requires_grad]  # FSDP2: the gathered ones
        loss = chunked_cross_entropy(
            self.head.forward, hidden, self.labels, shift=self.shift, rows=self.rows,
            mapping=self.mapping, how=self.how, params=params,
        )  # fmt: skip
        empty = loss.to(hidden.dtype).reshape([1] * hidden.dim()).expand(*hidden.shape[:-1], 0).clone()
        self.loss = loss + empty.sum()
        return empty  # no logits: what the model does after its head runs on nothing

    def _restore(self) -> None:
        if self._own_forward is not None:
            self.head.forward = self._own_forward
        else:
            self.head.__dict__.pop("forward", None)

    def _after(self, module: torch.nn.Module, args: tuple, output: ModelOutput) -> ModelOutput | None:
        if self.labels is None:
            return None
        loss, self.loss, self.labels = self.loss, None, None
        self._restore()
        if loss is None:
            raise RuntimeError(
                f"{type(module).__name__}'s forward never called its output head "
                f"({type(self.head).__name__}): set model.chunked_loss=off"
            )
        return replace(output, loss=loss)  # a ModelOutput dataclass: its keys in field order
