"""xtrain's own decode loop over a causal LM and its KV cache: prompts encoded once, each prompt's
cache shared by its ``group`` completions (expanded in the cache, as beam search expands it), each
completion sampled from its own seeded generator, and the sampled token fed back (draw, then
force: no vocabulary-wide ``-inf`` tensor a row a token, as a logits processor under ``generate``
needs).

- ``Decoder``: one batch's state. ``prefill(ids, mask, group)`` encodes left-padded prompts and
  expands the cache; ``decode(max_new_tokens, sampling, seeds)`` samples (or picks greedily) until
  every row stopped; ``extend(ids, mask)`` appends tokens to every row's context (a multi-turn
  episode's tool results: the next ``decode`` continues after them, nothing encoded twice);
  ``keep(rows)`` drops rows (finished episodes). ``sequence()`` is everything each row has seen.
- ``generate``: ``prefill`` + ``decode`` in one call (GRPO's rollout, ``xtrain predict``'s
  sampling).

Rows never interact: a row's completion depends only on its prompt, its seed and the model, not on
the other rows of its batch, the batch's padding or the process count. Positions count each row's
real tokens (left padding, holes after a finished row: mask 0, never in any row's context).

The model is called as a forward (``model(input_ids, attention_mask, position_ids, cache,
use_cache=True)``), so whatever wraps its forward applies: accelerate's autocast, peft's LoRA
adapters (on, unmerged), FSDP2's and DeepSpeed ZeRO-3's all-gathers. With the weights sharded over
several processes every forward is a collective: ``synced`` keeps each rank stepping until every
rank's rows stopped (``generate``'s ``synced_gpus``).

On CUDA (``DecodeSettings``, decided once by ``decode_settings``) the steps after the prompt run on
a static cache of a fixed length, and where torch.compile can work a compiled step (CUDA graphs):
every step then has the same shapes, so one graph serves every step of every batch of that size
(``static_decode``).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from xtrain.model.static_decode import StaticSteps

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = [
    "CacheCall", "Completions", "DecodeSettings", "Decoder", "Sampling", "completion_mask",
    "decode_settings", "draws", "generate", "pick",
]  # fmt: skip


@dataclass(frozen=True)
class Sampling:
    """Sampling at ``temperature`` within ``top_p`` (None in place of a ``Sampling``: greedy)."""

    temperature: float = 1.0
    top_p: float = 1.0


@dataclass(frozen=True)
class DecodeSettings:
    """How the steps after the prompt run: on the cache the model makes (``static=False``), or on a
    static cache of ``max_length`` tokens (the longest prompt + completion a batch can have), its
    step compiled (``compiled``)."""

    static: bool = False
    compiled: bool = False
    max_length: int | None = None


def decode_settings(
    device_type: str, sharded: bool, quantized: bool, compile_blocker: str | None, max_length: int
) -> DecodeSettings:
    """The rule: CUDA decodes on a static cache of ``max_length`` (one shape every step), compiled
    where torch.compile can run (``compile_blocker`` None) on weights whole on this process and not
    quantized (bitsandbytes' kernels are not traced); sharded weights keep the model's cache (each
    step is a collective, nothing to capture). CPU and MPS keep the model's own cache."""
    if device_type != "cuda" or sharded:
        return DecodeSettings()
    compiled = compile_blocker is None and not quantized
    return DecodeSettings(static=True, compiled=compiled, max_length=max_length)


def draws(seeds: Sequence[int], count: int, device: torch.device | str) -> torch.Tensor:
    """[N, count] uniforms in [0, 1): row i's ``count`` draws from a generator seeded by
    ``seeds[i]`` (drawn before the steps: one call a row, not one a row a token)."""
    out = [torch.rand(count, generator=torch.Generator(device=device).manual_seed(int(s)), device=device)
           for s in seeds]  # fmt: skip
    return torch.stack(out) if out else torch.empty(0, count, device=device)


def pick(logits: torch.Tensor, sampling: Sampling | None, u: torch.Tensor | None) -> torch.Tensor:
    """[N] next tokens from [N, V] logits: the most likely (``sampling`` None), else each row's
    token at its uniform ``u`` [N] on the cumulative distribution at ``sampling``'s temperature
    within its top-p (inverse transform sampling: one batched search, each row's own draw)."""
    if sampling is None:
        return logits.argmax(dim=-1)
    assert u is not None and u.shape == logits.shape[:1]
    probs = torch.softmax(logits.float() / sampling.temperature, dim=-1)
    order = None
    if sampling.top_p < 1.0:  # in the sorted order, where top-p's set is a prefix
        probs, order = probs.sort(dim=-1, descending=True)
        kept = (probs.cumsum(dim=-1) - probs) < sampling.top_p  # mass ranked above below top_p
        probs = probs * kept
    cdf = probs.cumsum(dim=-1)
    # u < 1: the target lies below the total, so the token found has mass (cdf rises at it)
    token = torch.searchsorted(cdf, (u.to(cdf) * cdf[:, -1]).unsqueeze(1), right=True)
    token = token.clamp(max=cdf.size(-1) - 1)
    if order is not None:
        token = torch.minimum(token, kept.sum(-1, keepdim=True) - 1)
        token = order.gather(1, token)
    return token.squeeze(1)


@dataclass
class Completions:
    """A batch's completions: token ids, which tokens count (up to and with the first stop token),
    and which ran to the limit without one (truncated)."""

    ids: torch.Tensor  # [N, L] (padding after the stop token)
    mask: torch.Tensor  # [N, L] 1 for the completion's tokens
    truncated: torch.Tensor  # [N] bool


def completion_mask(ids: torch.Tensor, stop: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """([N, L] mask through the first stop token, [N] no stop token) of generated ``ids``."""
    is_end = torch.isin(ids, torch.tensor(list(stop), device=ids.device))
    has_end = is_end.any(dim=1)
    first = torch.where(
        has_end, is_end.int().argmax(dim=1), torch.full_like(has_end, ids.size(1), dtype=torch.long)
    )
    positions = torch.arange(ids.size(1), device=ids.device).unsqueeze(0)
    return (positions <= first.unsqueeze(1)).long(), ~has_end


@dataclass(frozen=True)
class CacheCall:
    """How this model's forward takes its cache (transformers 5: ``cache``; 4: ``past_key_values``)
    and whether it computes the last position's logits alone (``logits_to_keep``)."""

    cache_key: str
    keep_last: bool

    @classmethod
    def of(cls, model: torch.nn.Module) -> CacheCall:
        base = model
        while hasattr(base, "get_base_model"):  # peft's wrapper: the model it adapts
            base = base.get_base_model()
        params = inspect.signature(type(base).forward).parameters
        return cls("cache" if "cache" in params else "past_key_values", "logits_to_keep" in params)


def _all_done(done: torch.Tensor, synced: bool) -> bool:
    """Every row of this process stopped, and with ``synced`` every process's (one all-reduce)."""
    if not synced:
        return bool(done.all())
    import torch.distributed as dist

    flag = done.all().to(torch.int32).reshape(1)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


class Decoder:
    """One batch's decoding: the model's cache, every row's context so far (``sequence``), the
    positions its next token takes, and the logits its next token is drawn from (module
    docstring)."""

    def __init__(
        self,
        model: torch.nn.Module,
        pad_id: int,
        stop: Sequence[int],
        synced: bool = False,
        settings: DecodeSettings | None = None,
    ) -> None:
        self.model, self.pad_id, self.stop, self.synced = model, pad_id, list(stop), synced
        self.settings = settings or DecodeSettings()
        self.call = CacheCall.of(model)
        self.cache: Any = None
        self.ids = self.mask = self.logits = self.pending = self._pending_mask = torch.empty(0)
        self.next_position = torch.empty(0)  # [N] the position of each row's next token
        self._dynamic: Any = None  # the model's own cache while the static one holds the context

    # -- the context ------------------------------------------------------------------------------
    def _forward(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The model on ``ids`` after the cached context: [N, V] logits of each row's last column."""
        kwargs: dict[str, Any] = {"logits_to_keep": 1} if self.call.keep_last else {}
        out = self.model(
            input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
            **{self.call.cache_key: self.cache}, **kwargs,
        )  # fmt: skip
        found = getattr(out, "cache", None)
        self.cache = found if found is not None else out.past_key_values
        return out.logits[:, -1, :]

    def prefill(self, ids: torch.Tensor, mask: torch.Tensor, group: int = 1) -> None:
        """Left-padded prompts ``ids`` [B, P] encoded once; ``group`` rows each from here on (row
        ``b * group + k``: prompt b's k-th completion), their cache expanded, not recomputed."""
        self.cache, self._dynamic = None, None
        mask = mask.to(ids.device)
        positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
        with torch.no_grad():
            logits = self._forward(ids, mask, positions)
        if group > 1:
            if all(hasattr(layer, "batch_repeat_interleave") for layer in getattr(self.cache, "layers", [])):
                self.cache.batch_repeat_interleave(group)
            else:  # a cache that cannot be expanded (linear attention layers): every row encoded
                self.prefill(ids.repeat_interleave(group, 0), mask.repeat_interleave(group, 0))
                return
            logits = logits.repeat_interleave(group, 0)
            ids, mask, positions = (t.repeat_interleave(group, 0) for t in (ids, mask, positions))
        self.ids, self.mask, self.logits = ids, mask.long(), logits
        self.next_position = positions[:, -1] + 1
        self.pending = ids.new_empty(ids.size(0), 0)

    def extend(self, ids: torch.Tensor, mask: torch.Tensor) -> None:
        """``ids`` [N, K] appended to every row's context (left-padded: each row's new tokens end in
        the last column; mask 0 leaves a hole), the tokens the last ``decode`` drew first."""
        self._own_cache()
        mask = mask.to(ids.device).long()
        ids, mask = torch.cat([self.pending, ids], 1), torch.cat([self.pending_mask, mask], 1)
        positions = self.next_position.unsqueeze(1) + mask.cumsum(-1) - 1
        self.mask = torch.cat([self.mask, mask], 1)
        with torch.no_grad():
            self.logits = self._forward(ids, self.mask, positions.clamp(min=0))
        self.ids = torch.cat([self.ids, ids], 1)
        self.next_position = self.next_position + mask.sum(-1)
        self.pending = ids.new_empty(ids.size(0), 0)

    @property
    def pending_mask(self) -> torch.Tensor:
        return self._pending_mask if self.pending.size(1) else self.pending.long()

    def keep(self, rows: torch.Tensor) -> None:
        """Only ``rows`` (indices) from here on: the others' cache and context dropped."""
        self._own_cache()
        rows = rows.to(self.ids.device)
        self.cache.batch_select_indices(rows)
        for name in ("ids", "mask", "logits", "next_position", "pending"):
            setattr(self, name, getattr(self, name)[rows])
        if self.pending.size(1):
            self._pending_mask = self._pending_mask[rows]

    def _own_cache(self) -> None:
        """After decoding on the (shared, reused) static cache: the context back in the model's own
        cache, so that this batch can go on without holding the static one."""
        if self._dynamic is None:
            return
        width = self.ids.size(1)
        for own, static in zip(self._dynamic.layers, self.cache.layers, strict=True):
            own.keys, own.values = static.keys[:, :, :width].clone(), static.values[:, :, :width].clone()
        self.cache, self._dynamic = self._dynamic, None

    def sequence(self) -> tuple[torch.Tensor, torch.Tensor]:
        """([N, T] every row's context: its prompt, completions and extensions, [N, T] which are
        tokens (0: left padding, holes after a finished completion))."""
        if not self.pending.size(1):
            return self.ids, self.mask
        return torch.cat([self.ids, self.pending], 1), torch.cat([self.mask, self._pending_mask], 1)

    # -- the completions --------------------------------------------------------------------------
    def decode(
        self, max_new_tokens: int, sampling: Sampling | None = None, seeds: Sequence[int] | None = None
    ) -> Completions:
        """Up to ``max_new_tokens`` a row, drawn at ``sampling`` with the uniforms of generators
        seeded by ``seeds`` (one a row: ``draws``), greedy without; a row stops at its first stop
        token. The last token drawn is not encoded until ``extend`` (nothing reads its cache
        before)."""
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={max_new_tokens}: at least one token")
        if self.pending.size(1):  # the last decode's final tokens: into the context first
            self.extend(self.pending[:, :0], self.pending[:, :0])
        n, device = self.logits.size(0), self.logits.device
        uniforms = None
        if sampling is not None:
            if seeds is None or len(seeds) != n:
                raise ValueError(f"sampling {n} rows needs {n} seeds, got {len(seeds or [])}")
            uniforms = draws(seeds, max_new_tokens, device)
        stop = torch.tensor(self.stop, device=device)
        done = torch.zeros(n, dtype=torch.bool, device=device)
        static = self._static(max_new_tokens) if self.settings.static else None
        drawn: list[torch.Tensor] = []
        alive: list[torch.Tensor] = []
        logits = self.logits
        with torch.no_grad():
            for t in range(max_new_tokens):
                token = pick(logits, sampling, None if uniforms is None else uniforms[:, t])
                live = ~done
                token = torch.where(live, token, torch.full_like(token, self.pad_id))
                drawn.append(token)
                alive.append(live.long())
                done = done | torch.isin(token, stop)
                if t == max_new_tokens - 1 or _all_done(done, self.synced):
                    break
                positions = self.next_position.unsqueeze(1)
                self.next_position = self.next_position + live.long()
                if static is not None:
                    logits = static.step(token.unsqueeze(1), live.long(), positions)
                else:
                    self.mask = torch.cat([self.mask, live.long().unsqueeze(1)], 1)
                    self.ids = torch.cat([self.ids, token.unsqueeze(1)], 1)
                    logits = self._forward(token.unsqueeze(1), self.mask, positions)
        ids = torch.stack(drawn, 1)
        if static is not None:  # the context as the dynamic path keeps it
            self.ids = torch.cat([self.ids, ids[:, :-1]], 1)
            self.mask = torch.cat([self.mask, torch.stack(alive[:-1], 1)], 1) if len(alive) > 1 else self.mask
            self._dynamic, self.cache = self.cache, static.cache
        self.logits = logits
        self.pending, self._pending_mask = ids[:, -1:], alive[-1].unsqueeze(1)
        mask, truncated = completion_mask(ids, self.stop)
        return Completions(ids.masked_fill(mask == 0, self.pad_id), mask, truncated)

    def _static(self, max_new_tokens: int) -> StaticSteps | None:
        """The static cache of ``settings.max_length`` with this batch's context copied in, or None
        where the model's cache is not one of plain full-attention layers (or too short)."""
        length = self.settings.max_length or 0
        if self.pending.size(1) or self.mask.size(1) + max_new_tokens > length:
            return None
        return StaticSteps.start(self.model, self.cache, self.mask, self.call.cache_key, length,
                                 self.settings.compiled)  # fmt: skip


def generate(
    model: torch.nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    *,
    max_new_tokens: int,
    pad_id: int,
    stop: Sequence[int],
    group: int = 1,
    sampling: Sampling | None = None,
    seeds: Sequence[int] | None = None,
    synced: bool = False,
    settings: DecodeSettings | None = None,
) -> Completions:
    """``group`` completions of each left-padded prompt (rows ``b * group + k``), each prompt
    encoded once: sampled at ``sampling`` with the draws of generators seeded by ``seeds`` (one a
    completion), greedy without. See ``Decoder``."""
    decoder = Decoder(model, pad_id, stop, synced=synced, settings=settings)
    decoder.prefill(prompt_ids, prompt_mask, group)
    return decoder.decode(max_new_tokens, sampling, seeds)
