"""Characters to tokens: each token's start in a rendered text (``token_starts``: a fast
tokenizer's offsets, a batch of texts in one call of its Rust backend where that gives what the
tokenizer's own call gives; a slow tokenizer's by growing prefixes) and the labels of the tokens
that start inside given character spans (``span_labels``: the assistant's answers)."""

from __future__ import annotations

from bisect import bisect_left
from typing import TYPE_CHECKING, Any

from xtrain.data.collate import IGNORE_INDEX

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def _token_starts(tokenizer: PreTrainedTokenizerBase, text: str) -> tuple[list[int], list[int]]:
    """(ids, the character where each token starts): from the offsets of a fast tokenizer, else by
    tokenising growing prefixes (slow tokenizers have no offsets)."""
    try:
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        return list(enc["input_ids"]), [s for s, _ in enc["offset_mapping"]]
    except (NotImplementedError, ValueError, TypeError):
        ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        starts, k = [], 0
        for p in range(len(text) + 1):  # token k starts where the prefix first holds k+1 tokens
            n = len(tokenizer(text[:p], add_special_tokens=False)["input_ids"])
            while k < min(n, len(ids)):
                starts.append(max(p - 1, 0))
                k += 1
        return ids, starts + [len(text)] * (len(ids) - len(starts))


def token_starts(tokenizer: PreTrainedTokenizerBase, texts: list[str]) -> list[tuple[list[int], list[int]]]:
    """``_token_starts`` of each text, a fast tokenizer's in one call (of its Rust backend where
    that gives what the tokenizer's own call gives: ``_backend_agrees``)."""
    if len(texts) > 1:
        backend = getattr(tokenizer, "_tokenizer", None)
        if backend is not None and _backend_agrees(tokenizer, backend, texts[0]):
            return [
                (e.ids, [s for s, _ in e.offsets])
                for e in backend.encode_batch(texts, add_special_tokens=False)
            ]
        try:
            enc = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
            return [
                (list(ids), [s for s, _ in offsets])
                for ids, offsets in zip(enc["input_ids"], enc["offset_mapping"], strict=True)
            ]
        except (NotImplementedError, ValueError, TypeError):
            pass
    return [_token_starts(tokenizer, text) for text in texts]


_AGREES: dict[int, bool] = {}  # id(tokenizer) -> its backend's encode_batch gives its own ids and offsets


def _backend_agrees(tokenizer: PreTrainedTokenizerBase, backend: Any, text: str) -> bool:
    """A fast tokenizer's backend tokenises ``text`` as the tokenizer's own call does (checked once
    a tokenizer), and holds no truncation or padding a call left set (transformers resets them each
    call; the backend alone would apply them)."""
    if getattr(backend, "truncation", None) is not None or getattr(backend, "padding", None) is not None:
        return False
    if id(tokenizer) not in _AGREES:
        try:
            own = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
            (direct,) = backend.encode_batch([text], add_special_tokens=False)
            _AGREES[id(tokenizer)] = list(own["input_ids"]) == direct.ids and [
                tuple(o) for o in own["offset_mapping"]
            ] == [tuple(o) for o in direct.offsets]
        except Exception:
            _AGREES[id(tokenizer)] = False
    return _AGREES[id(tokenizer)]


def span_labels(ids: list[int], starts: list[int], spans: list[tuple[int, int]]) -> list[int]:
    """``ids`` where the token starts inside one of ``spans``, -100 elsewhere (the tokens of a
    span found by bisection where the starts are in order, as a fast tokenizer's are)."""
    if all(a <= b for a, b in zip(starts, starts[1:], strict=False)):
        labels = [IGNORE_INDEX] * len(ids)
        for a, b in spans:
            i, j = bisect_left(starts, a), bisect_left(starts, b)
            labels[i:j] = ids[i:j]
        return labels
    return [
        t if any(a <= s < b for a, b in spans) else IGNORE_INDEX for t, s in zip(ids, starts, strict=True)
    ]
