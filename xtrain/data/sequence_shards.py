"""A collated micro-batch cut into sequence shards (``parallel.sequence``): after the task's own
collator, so the rows are encoded, padded and packed as they always are, and every process of a
sequence-parallel group, reading the same rows from the data order, keeps its own slice.

What has to be decided on the whole sequence is decided here, before the cut:

- the labels are shifted (position t predicts token t + 1), so the last token of a shard predicts
  the first of the next one; the batch carries them as ``shift_labels`` (transformers' name for
  labels already shifted: ``ForCausalLMLoss`` reads it, and so do xtrain's chunked loss and
  log-probs) and as ``labels``, and a row's first label is never lost;
- the positions are global: ``position_ids`` as the model would number them (0, 1, ... per row;
  a packed row's restart per example), then cut, so rotary embeddings see each token's own place;
- the sequences attention must keep apart: a packed row's examples and a row's left padding, each
  a segment (``Shards.segments``: where the positions restart), read by the sequence-parallel
  attention (xtrain/model/sequence_parallel.py) over the whole sequence. A right-padded row is one
  causal segment: its padding comes after its tokens, which never attend to it.

The length is padded up to a multiple of N (padding ids, -100 labels), each process keeps
``length / N`` consecutive positions, and the model gets an all-ones ``attention_mask`` (so
transformers builds no padding mask for the shard: attention reads ``Shards``) and
``use_cache=False``. Everything here is plain data: it pickles into DataLoader workers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from xtrain.data.collate import IGNORE_INDEX

KEY = "sequence_shards"  # the model's keyword argument that carries ``Shards`` down to attention
# keys of [rows, positions] tensors cut into shards; the rest (a row's numbers) pass as they are
PER_POSITION = ("input_ids", "labels", "attention_mask", "position_ids", "token_type_ids")


@dataclass(frozen=True)
class Shards:
    """How a micro-batch's sequences are split: ``size`` shards of ``length / size`` positions,
    this process holding shard ``index``; ``segments`` per row, the lengths of the spans attention
    keeps apart (None: each row one causal sequence); ``tokens``: the real tokens of this shard."""

    size: int
    index: int
    length: int
    segments: tuple[tuple[int, ...], ...] | None = None
    tokens: int = 0

    @property
    def local(self) -> int:
        return self.length // self.size

    def __getitem__(self, rows: slice) -> Shards:
        """Some rows of the batch (the preference task's halves)."""
        if self.segments is None:
            return self
        return replace(self, segments=self.segments[rows])


def segments_of(positions: torch.Tensor) -> tuple[tuple[int, ...], ...] | None:
    """Per row, the lengths of its runs of consecutive positions (a new one where a position does
    not follow the one before); None when every row is one run from 0 (nothing to keep apart)."""
    starts = torch.ones_like(positions, dtype=torch.bool)
    starts[:, 1:] = positions[:, 1:] != positions[:, :-1] + 1
    if not bool(starts[:, 1:].any()) and bool((positions[:, 0] == 0).all()):
        return None
    rows = []
    for row in starts:
        at = row.nonzero().squeeze(1).tolist() + [len(row)]
        rows.append(tuple(b - a for a, b in zip(at, at[1:], strict=False)))
    return tuple(rows)


def _positions(batch: dict[str, Any], rows: int, length: int) -> torch.Tensor:
    """The model's own positions: a packed batch's, a left-padded row's counted from its first
    token (pads at 0, each its own segment), else 0, 1, ... per row."""
    given = batch.get("position_ids")
    if given is not None:
        return given.expand(rows, -1).clone()
    mask = batch.get("attention_mask")
    plain = torch.arange(length).expand(rows, -1).clone()
    if mask is None or not bool((mask[:, :1] == 0).any()):
        return plain  # right padding: continues the row's numbering, after its tokens
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def shard_batch(batch: dict[str, Any], size: int, index: int) -> dict[str, Any]:
    """Shard ``index`` of ``size`` of a collated batch (see the module docstring)."""
    ids = batch["input_ids"]
    rows, length = ids.shape
    padded = -(-length // size) * size
    extra = padded - length
    positions = _positions(batch, rows, length)
    if extra:  # the tail: positions that continue the last run, nothing trained
        tail = positions[:, -1:] + torch.arange(1, extra + 1)
        positions = torch.cat([positions, tail], dim=1)
    out: dict[str, Any] = {}
    labels = batch.get("labels")
    if labels is not None and labels.dim() == 2:
        shifted = torch.full((rows, padded), IGNORE_INDEX, dtype=labels.dtype)
        shifted[:, : length - 1] = labels[:, 1:]
        out["labels"] = out["shift_labels"] = shifted
    pad_id = _pad_id(batch)
    out["input_ids"] = torch.cat([ids, torch.full((rows, extra), pad_id, dtype=ids.dtype)], dim=1)
    out["position_ids"] = positions
    mask = batch.get("attention_mask")
    real = mask.bool() if mask is not None else torch.ones(rows, length, dtype=torch.bool)
    real = torch.cat([real, torch.zeros(rows, extra, dtype=torch.bool)], dim=1)
    local = padded // size
    cut = slice(index * local, (index + 1) * local)
    for key, value in batch.items():
        if key in out or key == "attention_mask":
            continue
        if key in PER_POSITION and torch.is_tensor(value) and value.dim() == 2 and value.shape[1] == length:
            value = torch.cat([value, value.new_zeros(rows, extra)], dim=1)
        out[key] = value
    sharded = {k: v[:, cut] if _per_position(k, v, padded) else v for k, v in out.items()}
    sharded["attention_mask"] = torch.ones(rows, local, dtype=torch.long)
    sharded["use_cache"] = False
    sharded[KEY] = Shards(size, index, padded, segments_of(positions), int(real[:, cut].sum()))
    return sharded


def _per_position(key: str, value: Any, length: int) -> bool:
    return key in (*PER_POSITION, "shift_labels") and torch.is_tensor(value) and value.shape[-1] == length


def _pad_id(batch: dict[str, Any]) -> int:
    """A padding id for the tail: the batch's own (an id where the mask is 0), else 0. Its
    positions train nothing and no real token attends to them."""
    mask = batch.get("attention_mask")
    if mask is not None and bool((mask == 0).any()):
        return int(batch["input_ids"][mask == 0][0])
    return 0


class ShardCollator:
    """The task's collator, then this process's shard of every sequence (``shard_batch``)."""

    cut = staticmethod(shard_batch)  # (entry_shards.py's collator: its own cut)

    def __init__(self, collate: Callable[[Sequence[Any]], dict[str, Any]], size: int, index: int) -> None:
        self.collate, self.size, self.index = collate, size, index

    def __call__(self, features: Sequence[Any]) -> dict[str, Any]:
        batch = self.collate(features)
        if not torch.is_tensor(batch.get("input_ids")) or batch["input_ids"].dim() != 2:
            raise ValueError("sequence parallelism cuts [rows, positions] input_ids; this batch has none")
        return self.cut(batch, self.size, self.index)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.collate!r}, shard {self.index} of {self.size})"


def align_left(mask: torch.Tensor, *rows: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Each of ``rows`` ([rows, positions], ``mask`` first) moved so that its row's real tokens
    (``mask`` 1: a left-padded prompt and its completion, contiguous) start at position 0, the
    padding after them: the same positions for every real token (counted from the row's first),
    and rows of one causal sequence each, which attention runs batched (a left pad would be a
    segment of its own: ``segments_of``)."""
    length = mask.size(1)
    lead = (mask.cumsum(-1) == 0).sum(-1, keepdim=True)  # each row's left padding
    at = (torch.arange(length, device=mask.device) + lead) % length
    return tuple(x.gather(1, at) for x in (mask, *rows))


def cut_completed(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor, size: int, index: int
) -> dict[str, Any]:
    """Shard ``index`` of ``size`` of sequences a task's step completed (GRPO's rollout,
    distillation's samples: left-padded prompts, right-padded completions), ``labels`` the tokens
    that train (-100 elsewhere): aligned left (``align_left``), then ``shard_batch`` (labels
    shifted first: ``shift_labels``). On the device the tensors are on."""
    mask, ids, labels = align_left(attention_mask, input_ids, labels)
    device = ids.device
    batch = {"input_ids": ids.cpu(), "attention_mask": mask.cpu(), "labels": labels.cpu()}
    out = shard_batch(batch, size, index)
    return {k: v.to(device) if torch.is_tensor(v) else v for k, v in out.items()}
