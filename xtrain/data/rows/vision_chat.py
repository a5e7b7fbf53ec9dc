"""Image + text conversations for ``vision-language``: rows read lazily, batched by the processor.

Every row is checked and rendered up front, once (``chat_data``: roles, an assistant turn, image
files present, the assistant-only labels on the template's text with one placeholder token per
image; cached by ``encoded.encode``), so a bad row stops the run before the first step. Images are
opened only when the DataLoader asks for the row. The collator runs the checkpoint's processor once
per batch, on all its conversations and images (it expands each image placeholder into the image's
tokens), cuts each conversation's tokens back out of the padded result and carries its labels over
to its expanded ids: the same tensors as one processor call per conversation, without paying the
processor's fixed cost per call (merging its keyword arguments, one image-processor and tokenizer
call each) for every row.

Eval rows also carry the prompt of their last assistant turn: the collator adds it left-padded
under ``gen_*`` keys, with the answer's tokens under ``answer_labels``, for ``GenerationEval``.

Everything here is a top-level class holding plain data, so it pickles into spawned DataLoader
workers (Windows, macOS).
"""

from __future__ import annotations

import difflib
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xtrain.data.collate import IGNORE_INDEX
from xtrain.data.rows.chat import BadConversation
from xtrain.data.rows.images import MAX_PIXELS, image_size, open_image

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch
    from datasets import Dataset
    from PIL.Image import Image
    from transformers import PreTrainedTokenizerBase, ProcessorMixin

GEN_PREFIX = "gen_"  # prompt-only copies of the per-token inputs, for generation
ANSWER_KEY = "answer_labels"  # the last assistant answer's tokens (references for exact match)


class VisionChatRows:
    """``[i]`` -> the rendered conversation of kept row ``i`` with its images opened (RGB): the
    encoded rows (text, ids, labels, the last answer's prompt and the data row's number, memory-
    mapped: ``vision_rows.rows``), the images named by the data row (``refs``) opened only now."""

    def __init__(
        self,
        encoded: Dataset | None,
        refs: Callable[[int], list[Any]],
        base_dir: Path | None,
        source: str,
        with_prompts: bool = False,
        max_pixels: int | None = MAX_PIXELS,
    ) -> None:
        self.max_pixels = max_pixels  # data.max_image_pixels
        self.encoded = encoded  # None: checked, not rendered (the data check without a processor)
        self.refs = refs
        self.base_dir = base_dir
        self.source = source
        self.with_prompts = with_prompts

    def __len__(self) -> int:
        return len(self.encoded) if self.encoded is not None else 0

    @property
    def rows(self) -> list[int]:
        """The data rows kept (rows whose answers all lie past data.max_length are left out)."""
        return list(self.encoded["row"]) if self.encoded is not None else []

    @property
    def images(self) -> list[list[Any]]:
        """Each kept row's image references (the data check's: a few rows)."""
        return [self.refs(row) for row in self.rows]

    def __getitem__(self, i: int) -> dict[str, Any]:
        assert self.encoded is not None
        enc = self.encoded[int(i)]
        row = enc["row"]
        item = {
            "text": enc["text"],
            "input_ids": enc["input_ids"],
            "labels": enc["labels"],
            "images": [
                open_image(ref, self.base_dir, row, self.source, self.max_pixels) for ref in self.refs(row)
            ],
            "row": row,
            "source": self.source,
        }
        if self.with_prompts:
            item["prompt"] = enc["prompt"]
        return item


def carry_labels(short: list[int], labels: list[int], long: list[int], image_token: int | None) -> list[int]:
    """Labels of ``short`` (the template's ids, one placeholder per image) carried over to ``long``
    (the processor's ids, each placeholder expanded into the image's tokens). The placeholder
    runs are skipped in one walk; other expansions are aligned with difflib."""
    out = [IGNORE_INDEX] * len(long)
    i = j = 0
    while i < len(short) and j < len(long) and short[i] == long[j]:
        out[j] = labels[i]
        if short[i] == image_token:
            while (
                j + 1 < len(long)
                and long[j + 1] == image_token
                and (i + 1 >= len(short) or short[i + 1] != image_token)
            ):
                j += 1
        i, j = i + 1, j + 1
    if i == len(short) and j == len(long):
        return out
    out = [IGNORE_INDEX] * len(long)  # not a plain repetition (e.g. Idefics3's tiles): align
    matcher = difflib.SequenceMatcher(None, short, long, autojunk=False)
    for a, b, size in matcher.get_matching_blocks():
        out[b : b + size] = labels[a : a + size]
    return out


def process_text(processor: ProcessorMixin, text: str, images: list[Image]) -> dict[str, torch.Tensor]:
    """One rendered conversation (or prompt) and its images -> the processor's tensors (batch of
    one), each image placeholder expanded into the image's tokens; the template already holds
    every special token, so the tokenizer adds none."""
    out = processor(text=[text], images=images or None, add_special_tokens=False, return_tensors="pt")
    return dict(out)


def process_texts(
    processor: ProcessorMixin, texts: list[str], images: list[list[Image]]
) -> tuple[list[dict[str, torch.Tensor]], dict[str, torch.Tensor]]:
    """Rendered conversations (or prompts) and each one's images -> one processor call for all
    of them. Returns each text's per-token tensors (``input_ids``, ``attention_mask``, ...: its
    own tokens, a batch of one, as ``process_text`` gives them) and the batch's other tensors
    (``pixel_values``, ``image_grid_thw``, ...: every text's images in order, as concatenating
    ``process_text``'s would give). The images go in as one list per text (empty for a text
    without images), which processors that pair images with texts (Idefics3) need. Where the
    processor's result has no attention mask (nothing tells its padding from its tokens), it is
    called again, once per text."""
    import torch

    if len(texts) > 1:
        nested = [list(row) for row in images]
        out = dict(processor(text=list(texts), images=nested if any(nested) else None, padding=True,
                             add_special_tokens=False, return_tensors="pt"))  # fmt: skip
        ids, mask = out["input_ids"], out.get("attention_mask")
        if mask is not None:
            per_token = [k for k, v in out.items() if torch.is_tensor(v) and v.shape == ids.shape]
            keep = mask.bool()  # each text's own tokens, whichever side the tokenizer padded
            rows = [{k: out[k][i][keep[i]].unsqueeze(0) for k in per_token} for i in range(len(texts))]
            return rows, {k: v for k, v in out.items() if k not in per_token and torch.is_tensor(v)}
    outs = [process_text(processor, text, list(row)) for text, row in zip(texts, images, strict=True)]
    per_token = [k for k, v in outs[0].items() if _per_token(v, outs[0]["input_ids"].shape[1])]
    rows = [{k: o[k] for k in per_token} for o in outs]
    shared: dict[str, Any] = {}
    for key in [k for k, v in outs[0].items() if k not in per_token and torch.is_tensor(v)]:
        shared[key] = torch.cat([o[key] for o in outs if o.get(key) is not None], dim=0)
    return rows, shared


class VisionChatCollator:
    """Rows -> the processor's tensors (``input_ids``, ``attention_mask``, ``pixel_values``,
    ``image_grid_thw``, ...) padded to one length, with ``labels``; eval rows also get ``gen_*``
    (the prompt, left-padded) and ``answer_labels``."""

    def __init__(
        self, processor: ProcessorMixin, max_length: int, pad_to_multiple_of: int | None = None
    ) -> None:
        self.processor = processor
        self.max_length = max_length
        self.pad_to_multiple_of = pad_to_multiple_of

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        return self.processor.tokenizer

    def _process(
        self, texts: list[str], images: list[list[Image]]
    ) -> tuple[list[dict[str, torch.Tensor]], dict[str, torch.Tensor]]:
        return process_texts(self.processor, texts, images)

    def _image_token(self) -> int | None:
        token = getattr(self.processor, "image_token_id", None)
        if token is None and getattr(self.processor, "image_token", None):
            token = self.tokenizer.convert_tokens_to_ids(self.processor.image_token)
        return token

    def _one(self, f: dict[str, Any], out: dict[str, Any]) -> dict[str, Any]:
        """Row ``f``'s per-token tensors ``out`` cut to ``max_length`` (refused where that cuts
        an image or every answer), with its labels."""
        ids = out["input_ids"][0].tolist()
        labels = carry_labels(f["input_ids"], f["labels"], ids, self._image_token())
        if len(ids) > self.max_length:
            where = f"row {f['row']} of {f['source']}"
            image = self._image_token()
            last_image = max((k for k, t in enumerate(ids) if t == image), default=-1)
            if last_image >= self.max_length:
                raise BadConversation(
                    f"{where} is {len(ids)} tokens with its images, above data.max_length="
                    f"{self.max_length}, and cutting it would cut an image",
                    "raise data.max_length, or lower data.max_pixels to make fewer image tokens",
                )
            labels = labels[: self.max_length]
            if all(x == IGNORE_INDEX for x in labels[1:]):
                raise BadConversation(
                    f"{where} is {len(ids)} tokens: data.max_length={self.max_length} cuts off "
                    "every assistant answer",
                    "raise data.max_length, or shorten that conversation",
                )
            for key, value in out.items():
                if _per_token(value, len(ids)):
                    out[key] = value[:, : self.max_length]
        out["labels"] = labels
        return out

    def _length(self, n: int) -> int:
        if self.pad_to_multiple_of:
            return math.ceil(n / self.pad_to_multiple_of) * self.pad_to_multiple_of
        return n

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        import torch

        if not features:
            raise ValueError("empty batch")
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        images = [f["images"] for f in features]
        rows, shared = self._process([f["text"] for f in features], images)
        outs = [self._one(f, out) for f, out in zip(features, rows, strict=True)]
        batch = _pad(outs, self._length(max(len(o["labels"]) for o in outs)), pad, left=False)
        batch.update(shared)  # pixel values, image grids: every row's images, in order
        batch["labels"] = torch.full_like(batch["input_ids"], IGNORE_INDEX)
        for i, o in enumerate(outs):
            batch["labels"][i, : len(o["labels"])] = torch.as_tensor(o["labels"], dtype=torch.long)
        if all("prompt" in f for f in features):
            prompts, _ = self._process([f["prompt"] for f in features], images)  # the images: as above
            gen = _pad(prompts, self._length(max(p["input_ids"].shape[1] for p in prompts)), pad, left=True)
            for key in list(gen):
                if key in batch and batch[key].shape == batch["input_ids"].shape:
                    batch[GEN_PREFIX + key] = gen[key]
            # the answer: the labels after the prompt (the last assistant turn and its end token)
            answers = []
            for o, p in zip(outs, prompts, strict=True):
                answers.append(o["labels"][p["input_ids"].shape[1] :])
            width = max(1, max(len(a) for a in answers))
            batch[ANSWER_KEY] = torch.full((len(answers), width), IGNORE_INDEX, dtype=torch.long)
            for i, a in enumerate(answers):
                batch[ANSWER_KEY][i, : len(a)] = torch.as_tensor(a, dtype=torch.long)
        return batch

    def __repr__(self) -> str:
        return f"VisionChatCollator(max_length={self.max_length})"


def _per_token(value: object, length: int) -> bool:
    import torch

    return torch.is_tensor(value) and value.ndim == 2 and value.shape[0] == 1 and value.shape[1] == length


def _pad(outs: list[dict[str, Any]], length: int, pad: int, left: bool) -> dict[str, Any]:
    """Per-token tensors padded to ``length`` (``input_ids`` with ``pad``, others with 0) and
    stacked; everything else (pixel values, grids) concatenated along the first axis."""
    import torch

    batch: dict[str, Any] = {}
    keys = [k for k in outs[0] if k != "labels"]
    for o in outs[1:]:
        keys += [k for k in o if k not in keys and k != "labels"]
    for key in keys:
        values = [o.get(key) for o in outs]
        first = next(v for v in values if v is not None)
        if all(
            v is not None and _per_token(v, o["input_ids"].shape[1])
            for v, o in zip(values, outs, strict=True)
        ):
            fill = pad if key == "input_ids" else 0
            out = torch.full((len(values), length), fill, dtype=first.dtype)
            for i, v in enumerate(values):
                n = v.shape[1]
                if left:
                    out[i, length - n :] = v[0]
                else:
                    out[i, :n] = v[0]
            batch[key] = out
        elif torch.is_tensor(first):
            batch[key] = torch.cat([v for v in values if v is not None], dim=0)
    return batch


def expanded_lengths(processor: ProcessorMixin, rows: VisionChatRows) -> tuple[list[int], bool]:
    """Each row's token count with its images expanded as the processor expands them, from the
    images' sizes (their headers: nothing decoded) through the processor's own count of image
    tokens per size (``_get_num_multimodal_tokens``, what serving engines call); (the template's
    counts, one token per image, False) where the processor does not tell."""
    plain = [len(ids) for ids in rows.encoded["input_ids"]] if rows.encoded is not None else []
    count = getattr(processor, "_get_num_multimodal_tokens", None)
    if count is None:
        return plain, False
    out = []
    try:
        for n, refs in zip(plain, rows.images, strict=True):
            sizes = [image_size(ref, rows.base_dir) for ref in refs]
            tokens = count(image_sizes=sizes).num_image_tokens if sizes else []
            out.append(n + sum(t - 1 for t in tokens))
    except Exception:  # an unreadable header fails with its one line when the row is read
        return plain, False
    return out, True
