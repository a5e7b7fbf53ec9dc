"""The sequence cut at a text decoder's entry (``parallel.sequence`` for vision-language rows):
the model runs its vision tower, merges the image features into the token embeddings and
computes its positions on the whole row, on every process of the group; the cut happens where
the text decoder starts, so each process runs the language model (the long part: its
activations grow with the row) on its 1/N of the positions.

Two forward pre-hooks (``EntryCut``):

- on the model (the transformers model under peft's and accelerate's wrappers): it takes
  ``Shards`` (``sequence_shards``) out of the keyword arguments, so nothing before the decoder
  sees them (the vision tower's attention goes through the same attention registry and must
  run whole), and keeps them for the forward; its forward hook forgets them;
- on the text decoder (``model.language_model`` of Qwen2-VL): this shard's positions of
  ``inputs_embeds`` and ``position_ids`` (every leading dimension: Qwen2-VL's [3, rows, T]
  M-RoPE, or [4, rows, T] with the text positions first), global positions as the model computed
  them on the whole row, or 0, 1, ... over the whole row where the model left them to the
  decoder; an all-ones ``attention_mask`` of the shard (attention reads ``Shards``, as for
  text rows), no cache, and ``Shards`` handed on to the attention layers.

The decoder computes its causal mask and rotary embeddings from what it gets: the shard's global
positions. The labels were shifted and cut before the model (xtrain/data/entry_shards.py), so
the model's loss (``shift_labels``) or the chunked loss reads this shard's own.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from xtrain.data.sequence_shards import KEY, Shards

# per-position keyword arguments of a decoder's forward, besides the embeddings and positions: cut
PER_POSITION = ("cache_position", "token_type_ids")


def cut_inputs(kwargs: dict[str, Any], shards: Shards) -> dict[str, Any]:
    """A text decoder's keyword arguments for the whole rows -> this shard's (module docstring)."""
    embeds = kwargs.get("inputs_embeds")
    if not torch.is_tensor(embeds) or embeds.shape[1] != shards.length:
        found = "none" if not torch.is_tensor(embeds) else f"{embeds.shape[1]} positions"
        raise RuntimeError(
            f"sequence parallelism cuts the text decoder's inputs_embeds of {shards.length} positions, "
            f"and it got {found}"
        )
    rows, length = embeds.shape[:2]
    local = shards.local
    cut = slice(shards.index * local, (shards.index + 1) * local)
    out = dict(kwargs)
    out["inputs_embeds"] = embeds[:, cut]
    positions = kwargs.get("position_ids")
    if positions is None:  # the decoder would count from 0 on the shard: count over the whole row
        positions = torch.arange(length, device=embeds.device).expand(rows, -1)
    out["position_ids"] = positions[..., cut]
    for key in PER_POSITION:
        value = kwargs.get(key)
        if torch.is_tensor(value) and value.shape[-1] == length:
            out[key] = value[..., cut]
    out["attention_mask"] = torch.ones(rows, local, dtype=torch.long, device=embeds.device)
    out["use_cache"] = False
    out[KEY] = shards
    return out


class EntryCut:
    """The hooks that cut the sequences of ``model`` (as the loop calls it: peft's wrapper
    included, whose base may be called through ``forward`` itself, without hooks) at the entry of
    ``decoder`` (the module docstring). ``attach`` / ``detach``."""

    def __init__(self, model: torch.nn.Module, decoder: torch.nn.Module) -> None:
        self.model, self.decoder = model, decoder
        self.shards: Shards | None = None
        self.handles: list[RemovableHandle] = []

    def attach(self) -> EntryCut:
        self.handles = [
            self.model.register_forward_pre_hook(self._take, with_kwargs=True),
            self.model.register_forward_hook(self._forget, always_call=True),
            self.decoder.register_forward_pre_hook(self._cut, with_kwargs=True),
        ]
        return self

    def detach(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles, self.shards = [], None

    def _take(
        self, module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]
    ) -> tuple[tuple, dict] | None:
        if kwargs.get(KEY) is None:
            return None
        kwargs = dict(kwargs)
        self.shards = kwargs.pop(KEY)
        return args, kwargs

    def _forget(self, module: torch.nn.Module, args: tuple, output: Any) -> None:
        self.shards = None

    def _cut(self, module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict] | None:
        if self.shards is None:
            return None  # whole rows: evaluation, generation
        if args:
            raise RuntimeError(
                f"sequence parallelism cuts {type(module).__name__}'s keyword inputs, and it was called "
                "with positional ones"
            )
        return args, cut_inputs(kwargs, self.shards)
