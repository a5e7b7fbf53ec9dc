"""Image + text conversations for ``vision-language``: rows read lazily, batched by the processor.

Every row is checked and rendered up front (``chat_data``: roles, an assistant turn, image files
present, the assistant-only labels on the template's text with one placeholder token per image),
so a bad row stops the run before the first step. Images are opened only when the DataLoader asks
for the row. The collator runs the checkpoint's processor on each conversation (it expands each
image placeholder into the image's tokens) and carries the labels over to the expanded ids.

Eval rows also carry the prompt of their last assistant turn: the collator adds it left-padded
under ``gen_*`` keys, with the answer's tokens under ``answer_labels``, for ``GenerationEval``.

Everything here is a top-level class holding plain data, so it pickles into spawned DataLoader
workers (Windows, macOS).
"""

from __future__ import annotations

import difflib
import math
from pathlib import Path
from typing import Any

from xtrain.train.collate import IGNORE_INDEX
from xtrain.train.tasks.chat_data import BadConversation, Encoded
from xtrain.train.tasks.image_data import open_image

GEN_PREFIX = "gen_"  # prompt-only copies of the per-token inputs, for generation
ANSWER_KEY = "answer_labels"  # the last assistant answer's tokens (references for exact match)


class VisionChatRows:
    """``[i]`` -> the rendered conversation of row ``i`` with its images opened (RGB)."""

    def __init__(
        self,
        encoded: list[Encoded],
        images: list[list[Any]],
        rows: list[int],
        base_dir: Path | None,
        source: str,
        with_prompts: bool = False,
    ) -> None:
        self.encoded = encoded
        self.images = images
        self.rows = rows  # the row numbers in the data file (rows dropped up front are skipped)
        self.base_dir = base_dir
        self.source = source
        self.with_prompts = with_prompts

    def __len__(self) -> int:
        return len(self.encoded)

    def __getitem__(self, i: int) -> dict[str, Any]:
        i = int(i)
        enc, row = self.encoded[i], self.rows[i]
        item = {
            "text": enc.text,
            "input_ids": enc.input_ids,
            "labels": enc.labels,
            "images": [open_image(ref, self.base_dir, row, self.source) for ref in self.images[i]],
            "row": row,
            "source": self.source,
        }
        if self.with_prompts:
            item["prompt"] = enc.prompt
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


def process_text(processor: Any, text: str, images: list[Any]) -> dict[str, Any]:
    """One rendered conversation (or prompt) and its images -> the processor's tensors (batch of
    one), each image placeholder expanded into the image's tokens; the template already holds
    every special token, so the tokenizer adds none."""
    out = processor(text=[text], images=images or None, add_special_tokens=False, return_tensors="pt")
    return dict(out)


class VisionChatCollator:
    """Rows -> the processor's tensors (``input_ids``, ``attention_mask``, ``pixel_values``,
    ``image_grid_thw``, ...) padded to one length, with ``labels``; eval rows also get ``gen_*``
    (the prompt, left-padded) and ``answer_labels``."""

    def __init__(self, processor: Any, max_length: int, pad_to_multiple_of: int | None = None) -> None:
        self.processor = processor
        self.max_length = max_length
        self.pad_to_multiple_of = pad_to_multiple_of

    @property
    def tokenizer(self) -> Any:
        return self.processor.tokenizer

    def _process(self, text: str, images: list[Any]) -> dict[str, Any]:
        return process_text(self.processor, text, images)

    def _image_token(self) -> int | None:
        token = getattr(self.processor, "image_token_id", None)
        if token is None and getattr(self.processor, "image_token", None):
            token = self.tokenizer.convert_tokens_to_ids(self.processor.image_token)
        return token

    def _one(self, f: dict[str, Any]) -> tuple[dict[str, Any], list[int]]:
        out = self._process(f["text"], f["images"])
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
        return out, ids

    def _length(self, n: int) -> int:
        if self.pad_to_multiple_of:
            return math.ceil(n / self.pad_to_multiple_of) * self.pad_to_multiple_of
        return n

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        import torch

        if not features:
            raise ValueError("empty batch")
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        outs = [self._one(f)[0] for f in features]
        batch = _pad(outs, self._length(max(len(o["labels"]) for o in outs)), pad, left=False)
        batch["labels"] = torch.full_like(batch["input_ids"], IGNORE_INDEX)
        for i, o in enumerate(outs):
            batch["labels"][i, : len(o["labels"])] = torch.as_tensor(o["labels"], dtype=torch.long)
        if all("prompt" in f for f in features):
            prompts = [self._process(f["prompt"], f["images"]) for f in features]
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


def _per_token(value: Any, length: int) -> bool:
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
