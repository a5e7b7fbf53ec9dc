"""Log-probabilities of labelled tokens, the output head run in chunks on the labelled positions
only: what ``log_softmax(head(hidden) / temperature)`` gathered at the labels gives, in float32,
without ever holding the logits of every position. Preference tuning reads each sequence's sum
(``chunked_sequence_logps``), GRPO each token's (``chunked_token_logps``: the policy's, the old
policy's and the reference's log-probs of 8 completions of 512 tokens over Qwen2.5's 152,064
entries would be 2.3 GiB of float32 logits, and as much again for their log-softmax).

Each chunk of ``rows`` positions is checkpointed under autograd (its logits recomputed in the
backward): every sequence's sum, every token's log-prob, gets its own gradient, which the forward
does not know yet. Positions that fit one chunk run as one, not checkpointed: keeping its logits
for the backward holds no more than a chunk, and the head runs once instead of twice.

``sequence_logps_call`` and ``token_logps_call`` put them in place of a model's head for one
forward (``with_head``). The token one does it as ``chunked_loss.ChunkedLoss`` does:
the chunks call the head's own ``forward`` (its module hooks fire once, for the model's call), and
what the head returns instead of logits is an empty tensor computed from the log-probs, which the
returned log-probs depend on, so that the hooks on the head's output (FSDP2's pre-backward
all-gather of the head's weights) run before any chunk is recomputed in the backward.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from xtrain.model.chunked_loss import IGNORE_INDEX, LogitMap

Head = Callable[[torch.Tensor], torch.Tensor]
# (the head module, the hidden states it got) -> (what the call returns, what the head returns)
Compute = Callable[[torch.nn.Module, torch.Tensor], tuple[Any, Any]]
__all__ = [
    "chunked_sequence_logps", "chunked_token_logps", "sequence_logps_call", "token_logps_call", "with_head",
]  # fmt: skip


def _chunk(head: Head, h: torch.Tensor, y: torch.Tensor, mapping: LogitMap,
           temperature: float) -> torch.Tensor:  # fmt: skip
    logits = mapping(head(h).float())
    return -F.cross_entropy(logits / temperature if temperature != 1.0 else logits, y, reduction="none")


def _labelled(
    head: Head, hidden: torch.Tensor, labels: torch.Tensor, rows: int, mapping: LogitMap | None,
    temperature: float, shifted: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """([K] float32 log-probs of the K labelled tokens, [K] the flat position of the hidden state
    that predicts each): a causal LM's position t predicts label t + 1 (-100 skipped; ``shifted``:
    the labels are shifted already, a sequence shard's)."""
    from torch.utils.checkpoint import checkpoint

    mapping = mapping or LogitMap()
    labels = labels.to(hidden.device)
    flat = (labels if shifted else F.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:]).reshape(-1)
    keep = (flat != IGNORE_INDEX).nonzero().squeeze(1)  # the one host sync
    h = hidden.reshape(-1, hidden.shape[-1]).index_select(0, keep)
    y = flat.index_select(0, keep)
    parts = [h[:0].float().sum(-1)]  # empty, in the graph
    recompute = torch.is_grad_enabled() and y.numel() > rows  # one chunk: its logits kept, not redone
    for start in range(0, y.numel(), rows):
        chunk = (h[start : start + rows], y[start : start + rows])
        if recompute:
            parts.append(checkpoint(_chunk, head, *chunk, mapping, temperature, use_reentrant=False))
        else:
            parts.append(_chunk(head, *chunk, mapping, temperature))
    return torch.cat(parts), keep


def chunked_sequence_logps(
    head: Head, hidden: torch.Tensor, labels: torch.Tensor, *, rows: int, mapping: LogitMap | None = None,
    shifted: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """(each sequence's summed log-probability of its labelled tokens, their count), a causal LM's
    ``hidden`` [N, T, width] against ``labels`` [N, T] shifted by one (``shifted``: already),
    -100 skipped (preference losses weigh every sequence differently)."""
    values, keep = _labelled(head, hidden, labels, rows, mapping, 1.0, shifted)
    n, t = labels.shape
    sequence = torch.div(keep, t, rounding_mode="floor")
    sums = torch.zeros(n, dtype=torch.float32, device=hidden.device).index_add(0, sequence, values)
    return sums, torch.bincount(sequence, minlength=n)


def chunked_token_logps(
    head: Head, hidden: torch.Tensor, labels: torch.Tensor, *, rows: int, mapping: LogitMap | None = None,
    temperature: float = 1.0, shifted: bool = False,
) -> torch.Tensor:  # fmt: skip
    """[N, T] float32: at each labelled position t of ``labels`` [N, T] the log-probability of
    ``labels[n, t]`` given the positions before it (a causal LM's ``hidden[n, t - 1]``, [N, T,
    width]), the logits divided by ``temperature``; 0 where the label is -100. ``shifted``: the
    labels are shifted already (a sequence shard's), each at the position that predicts it."""
    values, keep = _labelled(head, hidden, labels, rows, mapping, temperature, shifted)
    n, t = labels.shape
    at = torch.zeros(n * t, dtype=torch.float32, device=hidden.device).index_add(0, keep, values)
    if shifted:
        return at.view(n, t)
    return F.pad(at.view(n, t), (1, 0))[:, :t]  # the log-prob of token t, predicted at t - 1, at t


def with_head(model: torch.nn.Module, inputs: dict[str, Any], compute: Compute) -> Any:
    """``model(**inputs)`` with its output head (``get_output_embeddings()`` of ``model`` or of the
    module it wraps) replaced for this call: ``compute(head, hidden)`` -> (what this returns, what
    the head returns to the model instead of logits); the head's own forward restored first."""
    from accelerate.utils import extract_model_from_parallel

    inner = extract_model_from_parallel(model)  # DDP's or FSDP's wrapper: the model it calls
    head = inner.get_output_embeddings()
    own = head.__dict__.get("forward")  # an instance-level forward the head had (accelerate's hooks)
    found: list[Any] = []

    def restore() -> None:
        if own is not None:
            head.forward = own
        else:
            head.__dict__.pop("forward", None)

    def head_call(hidden: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        restore()
        result, returned = compute(head, hidden)
        found.append(result)
        return returned

    head.forward = head_call  # this call only: the instance attribute shadows the class's
    try:
        model(**{"use_cache": False, **inputs})
    finally:
        restore()
    if not found:
        raise RuntimeError(
            f"{type(inner).__name__}'s forward never called its output head: set model.chunked_loss=off"
        )
    return found[0]


def sequence_logps_call(
    model: torch.nn.Module, inputs: dict[str, Any], labels: torch.Tensor, rows: int,
    mapping: LogitMap | None = None, shifted: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """``model(**inputs)`` with ``chunked_sequence_logps`` of ``labels`` in place of its head's
    logits (the chunks call the head module): the per-sequence sums and counts."""

    def compute(head: torch.nn.Module, hidden: torch.Tensor) -> tuple[Any, torch.Tensor]:
        found = chunked_sequence_logps(head, hidden, labels, rows=rows, mapping=mapping, shifted=shifted)
        return found, hidden[..., :0]

    return with_head(model, inputs, compute)


def token_logps_call(
    model: torch.nn.Module, inputs: dict[str, Any], labels: torch.Tensor, rows: int,
    mapping: LogitMap | None = None, temperature: float = 1.0, shifted: bool = False,
) -> torch.Tensor:  # fmt: skip
    """``model(**inputs)`` with ``chunked_token_logps`` of ``labels`` in place of its head's logits:
    [N, T] log-probs (module docstring: the head's own forward, the stand-in for its output)."""

    def compute(head: torch.nn.Module, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logps = chunked_token_logps(head.forward, hidden, labels, rows=rows, mapping=mapping,
                                    temperature=temperature, shifted=shifted)  # fmt: skip
        stand_in = logps.sum().to(hidden.dtype).reshape([1] * hidden.dim()).expand(*hidden.shape[:-1], 0)
        stand_in = stand_in.clone()
        return logps + stand_in.sum(), stand_in  # an exact 0 the backward reaches through the head's output

    return with_head(model, inputs, compute)
