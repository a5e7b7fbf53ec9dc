"""Sequence-parallel attention through transformers' attention-function registry: every model
family whose attention layers call ``ALL_ATTENTION_FUNCTIONS`` (transformers' ``AttentionInterface``;
``config._attn_implementation`` names the function) runs with its sequences split across the
processes of a group, with no code of its own (docs/long-context.md).

``register(inner)`` puts ``sequence_attention`` in the registry in place of the implementation the
plan chose, under its own name (sdpa, flash_attention_2: every check transformers keys on that
name, such as which flash kernel to load, holds), or for eager, which the models call outside the
registry, under ``EAGER`` with eager's mask function (``use`` switches the model's configs to it).
A forward whose keyword arguments carry ``Shards`` (xtrain/data/sequence_shards.py: a sharded
training batch) takes the sequence-parallel path; any other (evaluation, generation, another model
in the process: whole sequences) runs the implementation exactly as before.

Ulysses (``ulysses``): each process has its shard's queries, keys and values for every head,
``[batch, heads, L, head size]``. One all-to-all (``shard_exchange.all_to_all``, whose backward is the
reverse all-to-all) gives it every shard's positions for ``heads / N`` of the heads, ``[batch, heads / N,
N x L, head size]``: the whole sequence. The implementation runs on it, one call per segment
``Shards`` names (a packed row's examples, a left-padded row's tokens; causal inside each), or one
call for rows that are each one causal sequence; flash attention gets the segments as restarting
positions of one flat row (its variable-length kernel keeps them apart). A second all-to-all gives
the output back by sequence shard, every head. The query heads of a rank's key/value heads land on
the same rank (both split in order into N equal parts), so grouped-query attention is unchanged.
Ring mode is xtrain/model/ring_attention.py's; the exchanges (all-to-all, and their host-staged
form where the process group cannot move device tensors: gloo with CUDA tensors) are
xtrain/model/shard_exchange.py's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from xtrain.config.schema import TrainConfig
from xtrain.data.sequence_shards import KEY, Shards
from xtrain.model import ring_attention
from xtrain.model.shard_exchange import AttentionFn, Exchange, all_to_all, exchange

PREFIX = "xtrain_sequence_parallel_"  # the registered names of the implementations it wraps


def heads_from_sequence(x: torch.Tensor, ex: Exchange) -> torch.Tensor:
    """[B, H, L, D] (every head, this shard's L positions) -> [B, H / N, N x L, D] (this rank's
    heads, every position)."""
    b, h, length, d = x.shape
    n = ex.size
    parts = x.reshape(b, n, h // n, length, d).transpose(0, 1).contiguous()  # [N, B, H/N, L, D]
    got = all_to_all(parts, ex)  # part i: shard i's positions of this rank's heads
    return got.permute(1, 2, 0, 3, 4).reshape(b, h // n, n * length, d)


def sequence_from_heads(y: torch.Tensor, ex: Exchange) -> torch.Tensor:
    """[B, N x L, H / N, D] (attention's output layout) -> [B, L, H, D]: this shard's positions,
    every head."""
    b, total, h, d = y.shape
    n = ex.size
    parts = y.reshape(b, n, total // n, h, d).transpose(0, 1).contiguous()  # [N, B, L, H/N, D]
    got = all_to_all(parts, ex)  # part i: rank i's heads of this shard's positions
    return got.permute(1, 2, 0, 3, 4).reshape(b, total // n, n * h, d)


# ---------------------------------------------------------------------------------------------
# Attention over whole sequences, kept apart by segment


def causal_mask(length: int, window: int | None, device: torch.device) -> torch.Tensor:
    """[length, length] bool, True where a query (row) attends to a key (column): causal, and
    within ``window`` positions when the layer has a sliding window."""
    q = torch.arange(length, device=device)[:, None]
    k = torch.arange(length, device=device)[None, :]
    keep = k <= q
    if window is not None:
        keep &= q - k < window
    return keep


def _run(inner: AttentionFn, kind: str, module: torch.nn.Module, q: torch.Tensor, k: torch.Tensor,
         v: torch.Tensor, window: int | None, kwargs: dict[str, Any]) -> torch.Tensor:  # fmt: skip
    """``inner`` over one causal sequence (every row of ``q`` one, from position 0): the mask it
    needs, or none where its causal path is exact (sdpa without a window: its ``is_causal``)."""
    length = q.shape[2]
    mask: torch.Tensor | None = None
    if kind == "eager" or (window is not None and window < length):
        keep = causal_mask(length, window, q.device)[None, None]
        if kind == "eager":
            mask = torch.zeros(keep.shape, dtype=q.dtype, device=q.device)
            mask = mask.masked_fill(~keep, torch.finfo(q.dtype).min)
        else:
            mask = keep
    out, _ = inner(module, q, k, v, mask, **kwargs)
    return out


def whole_sequence_attention(
    inner: AttentionFn, kind: str, module: torch.nn.Module, q: torch.Tensor, k: torch.Tensor,
    v: torch.Tensor, shards: Shards, kwargs: dict[str, Any],
) -> torch.Tensor:  # fmt: skip
    """``inner`` over whole sequences ``q``/``k``/``v`` [B, heads, T, D], each row's segments kept
    apart (``Shards.segments``; causal inside each) -> [B, T, heads, D]."""
    window = kwargs.pop("sliding_window", None)
    if kind == "flash":
        if shards.segments is None:  # rows of one causal sequence each: the batched kernel
            out, _ = inner(module, q, k, v, None, sliding_window=window, **kwargs)
            return out
        # every row's segments as one flat row whose positions restart at each: transformers'
        # flash path takes its variable-length kernel from them (one row only: _is_packed_sequence)
        b, t = q.shape[0], q.shape[2]
        flat = [x.transpose(0, 1).reshape(1, x.shape[1], b * t, x.shape[3]) for x in (q, k, v)]
        positions = segment_positions(shards, b, q.device).reshape(1, b * t)
        out, _ = inner(module, *flat, None, position_ids=positions, sliding_window=window, **kwargs)
        return out.reshape(b, t, *out.shape[2:])
    if shards.segments is None:
        return _run(inner, kind, module, q, k, v, window, kwargs)
    rows = []
    for row, lengths in enumerate(shards.segments):
        parts, start = [], 0
        for n in lengths:
            span = slice(start, start + n)
            one = (t[row : row + 1, :, span] for t in (q, k, v))
            parts.append(_run(inner, kind, module, *one, window, kwargs))
            start += n
        rows.append(torch.cat(parts, dim=1))
    return torch.cat(rows, dim=0)


def segment_positions(shards: Shards, rows: int, device: torch.device) -> torch.Tensor:
    """[rows, T] positions that restart at each segment (what flash attention's variable-length
    path reads the segments from); 0, 1, ... for rows of one sequence each."""
    if shards.segments is None:
        return torch.arange(shards.length, device=device).expand(rows, -1)
    return torch.stack(
        [torch.cat([torch.arange(n, device=device) for n in lengths]) for lengths in shards.segments]
    )


def kind_of(inner_name: str) -> str:
    return "flash" if "flash" in inner_name else "eager" if inner_name == "eager" else "sdpa"


# keyword arguments that describe the shard's own positions: the whole sequence's are built here
_LOCAL = ("position_ids", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "is_causal")


def ulysses(
    inner: AttentionFn, kind: str, module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
    value: torch.Tensor, shards: Shards, ex: Exchange, kwargs: dict[str, Any],
) -> torch.Tensor:  # fmt: skip
    """Ulysses on this shard's [B, heads, L, D] -> its output [B, L, heads, D]."""
    q, k, v = (heads_from_sequence(t, ex) for t in (query, key, value))
    return sequence_from_heads(whole_sequence_attention(inner, kind, module, q, k, v, shards, kwargs), ex)


def sequence_attention(inner: AttentionFn, inner_name: str) -> AttentionFn:
    """The function registered in ``inner``'s place: for a sharded batch the mode this process
    runs (``Exchange.mode``: Ulysses here, ring in ring_attention.py), else ``inner`` as it is."""
    kind = kind_of(inner_name)

    def attention(
        module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
        attention_mask: torch.Tensor | None, **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:  # fmt: skip
        shards = kwargs.pop(KEY, None)
        if shards is None:
            return inner(module, query, key, value, attention_mask, **kwargs)
        ex = exchange()
        for name in _LOCAL:
            kwargs.pop(name, None)
        if ex.mode == "ring" or query.shape[1] % ex.size or key.shape[1] % ex.size:
            # (another model than the one the mode was chosen for, whose heads do not divide: a
            # distillation teacher's)
            return ring_attention.ring(module, query, key, value, shards, ex, kwargs), None
        return ulysses(inner, kind, module, query, key, value, shards, ex, kwargs), None

    attention.wrapped = inner  # type: ignore[attr-defined]
    return attention


# ---------------------------------------------------------------------------------------------
# The registry

EAGER = PREFIX + "eager"  # eager is not in the registry: models call their own function for it


def register(inner: str) -> str:
    """Put the sequence-parallel attention in the registry around ``inner`` (sdpa,
    flash_attention_2/3: in its own entry, once a process, so every check transformers keys on the
    name, such as which flash kernel to load, holds; eager: under ``EAGER``, with eager's mask
    function) and return the name the model must run under."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface

    if inner == "eager":
        AttentionInterface.register(EAGER, sequence_attention(model_eager, "eager"))
        AttentionMaskInterface.register(EAGER, ALL_MASK_ATTENTION_FUNCTIONS["eager"])
        return EAGER
    found = ALL_ATTENTION_FUNCTIONS[inner]
    if not hasattr(found, "wrapped"):  # (a second run in this process finds it wrapped)
        AttentionInterface.register(inner, sequence_attention(found, inner))
    return inner


def model_eager(module: torch.nn.Module, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, Any]:
    """The eager attention of ``module``'s own modeling file (transformers keeps eager outside the
    registry, one ``eager_attention_forward`` a family: Gemma's soft-capping lives there)."""
    import sys

    own = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    if own is None:
        raise RuntimeError(f"{type(module).__module__} has no eager_attention_forward")
    return own(module, *args, **kwargs)


def use(model: torch.nn.Module, inner: str, name: str) -> int:
    """Switch ``model`` (a transformers model, or peft's around one) from ``inner`` to the
    registered ``name`` where they differ (eager): every config of its modules that names
    ``inner``. Returns how many."""
    if name == inner:
        return 0
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    seen: set[int] = set()
    for module in base.modules():
        config = getattr(module, "config", None)
        if config is None or id(config) in seen or getattr(config, "_attn_implementation", None) != inner:
            continue
        seen.add(id(config))
        config._attn_implementation_internal = name
    return len(seen)


def _configs(model: torch.nn.Module) -> list[Any]:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    found: dict[int, Any] = {}
    for module in base.modules():
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "_attn_implementation"):
            found.setdefault(id(config), config)
    return list(found.values())


@contextlib.contextmanager
def whole_attention(model: torch.nn.Module) -> Iterator[None]:
    """``model`` on its own attention implementation while open: generation (GRPO's rollout,
    distillation's samples) runs whole sequences on every process of a group, on the model's own
    names (transformers keys its generation and masks on "eager"). A forward without ``Shards``
    runs the inner implementation anyway; this undoes ``use``'s renaming (eager) for the while."""
    renamed = [c for c in _configs(model) if c._attn_implementation == EAGER]
    for config in renamed:
        config._attn_implementation_internal = "eager"
    try:
        yield
    finally:
        for config in renamed:
            config._attn_implementation_internal = EAGER


def also_split(model: torch.nn.Module) -> None:
    """A second model of the run (a distillation teacher) on the sequence-parallel attention too,
    so that its forward on a shard attends over the whole sequence (Ulysses where its heads divide,
    else ring: ``sequence_attention``). Its family must call the attention registry: one line."""
    from xtrain.planning.sequence import check_family

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = base.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    inner = str(text._attn_implementation)
    if inner.startswith(PREFIX):
        return  # (switched already)
    check_family(f"{type(base).__name__} (the teacher)", model_facts(type(base), config).registry, inner)
    use(model, inner, register(inner))


# ---------------------------------------------------------------------------------------------
# What the plan needs to know of a model


@dataclass(frozen=True)
class ModelFacts:
    """The class's name, whether its attention calls the registry (None: not known), its heads."""

    name: str
    registry: bool | None
    heads: int
    kv_heads: int
    model_type: str | None = None  # config.model_type (a vision-language family's cut: check_entry)


def model_facts(cls: type | None, config: Any) -> ModelFacts:
    """``ModelFacts`` of a model of class ``cls`` (None: custom code, not known) with ``config``
    (its text config's heads, for a composite model)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = int(getattr(text, "num_attention_heads", 0) or 0)
    kv = getattr(text, "num_key_value_heads", None)
    registry = bool(getattr(cls, "_supports_attention_backend", False)) if cls is not None else None
    name = cls.__name__ if cls is not None else "the model"
    return ModelFacts(name, registry, heads, int(kv or heads), getattr(config, "model_type", None))


def offline_facts(cfg: TrainConfig, model_class: str | None) -> ModelFacts | str:
    """``ModelFacts`` of the config's model from its config where it already is (the dry run;
    never a download), else why not. ``model_class``: the task's transformers class."""
    import transformers

    from xtrain.model.attention import built_class
    from xtrain.model.configs import read_config_offline

    config = read_config_offline(cfg)
    if isinstance(config, str):
        return config
    auto = getattr(transformers, model_class, None) if model_class else None
    cls = built_class(auto, config, cfg.model.trust_remote_code) if auto is not None else None
    return model_facts(cls, config)
