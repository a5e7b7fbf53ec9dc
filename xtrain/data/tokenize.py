"""Text rows to token ids: the column checks (``require_columns``), causal-lm's and seq-cls's
tokenising (``tokenize_causal_lm``, ``tokenize_seq_cls``: ``encoded.Encoding`` functions, run once
and cached by ``encoded.encode``) and the tokenizer's part of the cache key
(``tokenizer_fingerprint``)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from xtrain.data.collate import IGNORE_INDEX
from xtrain.data.labels import label_key, value_kind
from xtrain.errors import XtrainError

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import PreTrainedTokenizerBase

# Bump when the tokenising functions below change what they produce (invalidates the cache).
TOKENIZE_VERSION = 3


# Columns that are checked for presence only: labels (ints or names), images and audio (paths,
# or datasets' Image/Audio feature dicts).
NOT_TEXT_COLUMNS = ("data.label_column", "data.image_column", "data.audio_column")


def require_columns(ds: Dataset, columns: dict[str, str | None], source: str) -> None:
    """Each configured column (``{"data.text_column": "text", ...}``) must exist in ``ds``."""
    have = list(ds.column_names)
    for key, col in columns.items():
        if col is not None and col not in have:
            raise XtrainError(
                f"column '{col}' not in {source} (columns: {', '.join(have)})",
                f"set {key} to one of them",
            )
        # text columns must hold text: numbers or lists would fail inside the tokenizer with a traceback
        if col is not None and key not in NOT_TEXT_COLUMNS:
            what = _not_text(ds, col)
            if what is not None:
                raise XtrainError(
                    f"column '{col}' of {source} holds {what}, not text", f"point {key} at a text column"
                )


def _not_text(ds: Dataset, col: str) -> str | None:
    """What a column holds when it is not text (``int64 values``, ``lists``, ``a list in row 3``);
    None for text. datasets types a JSON column that mixes kinds (``"a"`` and ``["a"]``) as Json."""
    features = getattr(ds, "features", None) or {}
    feature = features.get(col)
    if feature is None:
        return None
    dtype = getattr(feature, "dtype", None)
    if dtype is not None:
        return None if dtype in ("string", "large_string", "null") else f"{dtype} values"
    if type(feature).__name__ in ("List", "LargeList", "Sequence"):
        return "lists"
    if isinstance(feature, dict):  # a struct (JSON objects): its rows may not even convert to Python
        return "objects"
    for i, value in enumerate(ds[col]):  # Json and other features: the first value that is no text
        if value is not None and not isinstance(value, str):
            return f"a{'n' if value_kind(value)[0] in 'aeiou' else ''} {value_kind(value)} in row {i}"
    return None


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerBase) -> str:
    """A hash of everything in the tokenizer that changes its output (stable across processes).
    sha256 of canonical JSON: datasets' Hasher over the parsed JSON took seconds for 100k+
    vocabularies, at every start and resume (benchmarks/fingerprint.py)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        body: Any = json.loads(backend.to_str())
        # Truncation/padding are call-time state that the tokenizer remembers from its last call.
        body.pop("truncation", None)
        body.pop("padding", None)
    else:  # a tokenizer without a tokenizers backend: its vocabulary and settings
        body = sorted(tokenizer.get_vocab().items())
    specials = sorted((str(k), str(v)) for k, v in tokenizer.special_tokens_map.items())
    payload = [type(tokenizer).__name__, body, specials, getattr(tokenizer, "add_bos_token", None)]
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode("utf-8")).hexdigest()


def _has_target(labels: Sequence[int]) -> bool:
    # The model shifts labels by one: position 0 never counts.
    return any(t != IGNORE_INDEX for t in labels[1:])


def tokenize_causal_lm(
    batch: dict[str, list[Any]],
    tokenizer: PreTrainedTokenizerBase,
    text_column: str,
    prompt_column: str | None,
    response_column: str | None,
    max_length: int,
    packing: str,
) -> dict[str, list[list[int]]]:
    """Text -> input_ids/labels (+ eos). Prompt/response: labels -100 on the prompt.
    ``packing``: off (and on: ``packing.pack`` packs the result): one row per example, cut to
    max_length; concatenate: the examples of this map batch concatenated and cut into max_length
    blocks."""
    eos = tokenizer.eos_token_id
    tail = [eos] if eos is not None else []
    ids_list: list[list[int]] = []
    labels_list: list[list[int]] = []
    if prompt_column is not None and response_column is not None:
        prompts = [p if p is not None else "" for p in batch[prompt_column]]
        responses = [r if r is not None else "" for r in batch[response_column]]
        p_ids = tokenizer(prompts, add_special_tokens=True)["input_ids"]
        r_ids = tokenizer(responses, add_special_tokens=False)["input_ids"]
        for p, r in zip(p_ids, r_ids, strict=True):
            ids_list.append(list(p) + list(r) + tail)
            labels_list.append([IGNORE_INDEX] * len(p) + list(r) + tail)
    else:
        texts = [t if t is not None else "" for t in batch[text_column]]
        for ids in tokenizer(texts, add_special_tokens=True)["input_ids"]:
            ids = list(ids)
            if tail and (not ids or ids[-1] != eos):
                ids = ids + tail
            ids_list.append(ids)
            labels_list.append(list(ids))

    if packing == "concatenate":
        flat_ids = [t for ids in ids_list for t in ids]
        flat_labels = [t for labels in labels_list for t in labels]
        out_ids = [flat_ids[i : i + max_length] for i in range(0, len(flat_ids), max_length)]
        out_labels = [flat_labels[i : i + max_length] for i in range(0, len(flat_labels), max_length)]
    else:
        out_ids = [ids[:max_length] for ids in ids_list]
        out_labels = [labels[:max_length] for labels in labels_list]
    keep = [i for i, labels in enumerate(out_labels) if _has_target(labels)]
    rows = [{"input_ids": out_ids[i], "labels": out_labels[i]} for i in keep]
    return {
        "input_ids": [r["input_ids"] for r in rows],
        "attention_mask": [[1] * len(r["input_ids"]) for r in rows],
        "labels": [r["labels"] for r in rows],
    }


def tokenize_seq_cls(
    batch: dict[str, list[Any]],
    tokenizer: PreTrainedTokenizerBase,
    text_column: str,
    text_pair_column: str | None,
    label_column: str,
    label_to_id: dict[str, int] | None,
    max_length: int,
) -> dict[str, list[Any]]:
    """Text (+ pair) -> input_ids/attention_mask(/token_type_ids), label -> class id."""
    texts = [t if t is not None else "" for t in batch[text_column]]
    pairs = None
    if text_pair_column is not None:
        pairs = [t if t is not None else "" for t in batch[text_pair_column]]
    enc = tokenizer(texts, pairs, truncation=True, max_length=max_length)
    out = {k: list(v) for k, v in enc.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
    if label_to_id is None:
        out["labels"] = [int(v) for v in batch[label_column]]
    else:
        out["labels"] = [label_to_id[label_key(v)] for v in batch[label_column]]
    return out
