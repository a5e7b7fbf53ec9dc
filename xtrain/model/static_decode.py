"""The decode steps on a static cache (CUDA's path, ``decoding.DecodeSettings.static``): every step
has the same shapes (a cache of a fixed length, an attention mask as long, one token a row), so a
compiled step (torch.compile ``reduce-overhead``: CUDA graphs) serves every step of every batch of
that size. The batch's context, encoded into the model's own cache by the prompt's forward, is
copied in; the steps write the drawn tokens' keys and values in place (transformers'
``StaticLayer``: its ``cumulative_length`` counts them).
"""

from __future__ import annotations

import weakref
from typing import Any

import torch


class StaticSteps:
    """The decode steps of one batch on a static cache (``transformers.StaticCache``,
    full-attention layers only) and a mask buffer as long; compiled, one cache and one buffer a
    (model, rows, length, dtype), reused batch after batch (CUDA graphs keep their addresses)."""

    _kept: weakref.WeakKeyDictionary[torch.nn.Module, dict[tuple, StaticSteps]] = weakref.WeakKeyDictionary()

    def __init__(self, cache: Any, mask: torch.Tensor, step: Any) -> None:
        self.cache, self.mask, self.step_fn = cache, mask, step
        self.column, self.cache_key = 0, "cache"
        self.model: torch.nn.Module | None = None

    @classmethod
    def start(
        cls, model: torch.nn.Module, dynamic: Any, context: torch.Tensor, cache_key: str, length: int,
        compiled: bool,
    ) -> StaticSteps | None:  # fmt: skip
        """The steps of a batch whose ``context`` [N, T] (its attention mask) sits in the model's own
        ``dynamic`` cache, on a static cache of ``length`` tokens; None where the model's cache is not
        one of plain full-attention layers. ``compiled``: the step under torch.compile, the cache and
        the mask buffer kept for the next batch of the same shape (CUDA graphs replay on them)."""
        try:
            from transformers.cache_utils import StaticCache, StaticLayer
        except ImportError:  # pragma: no cover - transformers 4's static cache has no cumulative length
            return None
        layers = getattr(dynamic, "layers", None)
        if not layers or any(type(layer).__name__ != "DynamicLayer" for layer in layers):
            return None
        keys = layers[0].keys
        n, width = context.shape
        key = (n, length, keys.dtype, keys.device)
        kept = cls._kept.setdefault(model, {}) if compiled else {}
        steps = kept.get(key)
        if steps is None:
            cache = StaticCache(config=model.config, max_cache_len=length)
            plain = all(type(layer) is StaticLayer for layer in cache.layers)
            if not plain or len(cache.layers) != len(layers):
                return None
            heads = [layer.keys.size(1) for layer in layers]
            dims = [layer.keys.size(-1) for layer in layers]
            cache.early_initialization(n, heads, dims, keys.dtype, keys.device)
            mask = torch.zeros(n, length, dtype=torch.long, device=keys.device)
            step = _compiled_step() if compiled else _plain_step
            steps = kept[key] = cls(cache, mask, step)
        steps.cache.reset()
        for static, dynamic in zip(steps.cache.layers, layers, strict=True):
            static.keys[:, :, :width].copy_(dynamic.keys)
            static.values[:, :, :width].copy_(dynamic.values)
            static.cumulative_length.fill_(width)
        steps.mask.zero_()
        steps.mask[:, :width] = context
        steps.column, steps.model, steps.cache_key = width, model, cache_key
        return steps

    def step(self, token: torch.Tensor, live: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        self.mask[:, self.column] = live
        self.column += 1
        if self.step_fn is not _plain_step:  # a new replay: the previous one's outputs are read already
            torch.compiler.cudagraph_mark_step_begin()
        logits = self.step_fn(self.model, self.cache_key, token, positions, self.mask, self.cache)
        return logits.clone()  # out of the graph's memory before the next replay


def _plain_step(
    model: torch.nn.Module, cache_key: str, token: torch.Tensor, positions: torch.Tensor,
    mask: torch.Tensor, cache: Any,
) -> torch.Tensor:  # fmt: skip
    out = model(
        input_ids=token, attention_mask=mask, position_ids=positions, use_cache=True, **{cache_key: cache}
    )
    return out.logits[:, -1, :]


_COMPILED: list[Any] = []


def _compiled_step() -> Any:
    """``_plain_step`` compiled once a process (CUDA graphs: ``reduce-overhead``; fixed shapes)."""
    if not _COMPILED:
        _COMPILED.append(torch.compile(_plain_step, mode="reduce-overhead", dynamic=False))
    return _COMPILED[0]
