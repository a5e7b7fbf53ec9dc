"""Preference pairs with images (``vision-preference``: DPO on a vision-language model).

A row is a preference row (``xtrain.data.rows.preference``: TRL's ``{images, prompt, chosen,
rejected}`` with image parts in the prompt's turns, LLaMA-Factory's sharegpt shape
``{conversations, chosen, rejected, images}`` with ``<image>`` placeholders) whose images are
listed in ``data.images_column`` (``images``). Both answers are rendered after the same prompt by
the processor's chat template, the last answer's tokens labelled (``chat_data.encode``), and the
images opened once per row when the DataLoader asks for it; the collator runs the processor on the
B chosen then the B rejected conversations of a micro-batch at once (``VisionChatCollator``: the
image tokens expanded, the labels carried over), so one forward scores both answers.

``preference.precompute_reference``: ``VisionPreferenceRows.keys()`` are plain rows (both answers'
token ids and labels, and the SHA-256 of each image's decoded RGB pixels, as the model gets them),
the rows ``preference_precompute`` fingerprints and attaches the reference's numbers to; a row
then carries ``ref_first``/``ref_second`` and the collator makes them [B] tensors.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from xtrain.data.rows import chat as chat_data
from xtrain.data.rows.images import open_image, resolve_path, undecoded
from xtrain.data.rows.preference import BadPreferenceRow, read_row
from xtrain.data.rows.vision_chat import VisionChatCollator

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import PreTrainedTokenizerBase


class VisionPreferenceRows:
    """``[i]`` -> ``{"chosen": ..., "rejected": ...}``: row ``i``'s two rendered conversations
    (as ``VisionChatRows`` gives one), sharing its images, opened here (RGB)."""

    def __init__(
        self,
        pairs: list[tuple[chat_data.Encoded, chat_data.Encoded]],
        images: list[list[Any]],
        base_dir: Path | None,
        source: str,
        max_pixels: int | None,
    ) -> None:
        self.pairs, self.images, self.base_dir = pairs, images, base_dir
        self.source, self.max_pixels = source, max_pixels
        self.refs: list[dict[str, Any]] | None = None  # keys(), once asked for (precomputed reference)

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, i: int) -> dict[str, Any]:
        i = int(i)
        images = [open_image(ref, self.base_dir, i, self.source, self.max_pixels) for ref in self.images[i]]
        out = {}
        for part, enc in zip(("chosen", "rejected"), self.pairs[i], strict=True):
            out[part] = {"text": enc.text, "input_ids": enc.input_ids, "labels": enc.labels,
                         "images": images, "row": i, "source": self.source}  # fmt: skip
        if self.refs is not None and "ref_first" in self.refs[i]:
            out["ref_first"], out["ref_second"] = self.refs[i]["ref_first"], self.refs[i]["ref_second"]
        return out

    def keys(self, split: str) -> list[dict[str, Any]]:
        """One plain row per pair: ``split``, ``index``, both answers' ids and labels and its images' pixel
        digests (what the reference's numbers depend on); the same list on every call, so numbers
        attached to its rows (``ref_first``/``ref_second``) reach ``[i]``."""
        if self.refs is None:
            self.refs = []
            for i, (chosen, rejected) in enumerate(self.pairs):
                digests = [self._digest(ref, i) for ref in self.images[i]]
                answers = {"chosen": [chosen.input_ids, chosen.labels],
                           "rejected": [rejected.input_ids, rejected.labels]}  # fmt: skip
                self.refs.append({"split": split, "index": i, **answers, "images": digests})
        return self.refs

    def _digest(self, ref: Any, i: int) -> str:
        import hashlib

        image = open_image(ref, self.base_dir, i, self.source, self.max_pixels)  # RGB, as trained
        return hashlib.sha256(f"{image.size}".encode() + image.tobytes()).hexdigest()


def vision_pairs(
    ds: Dataset,
    images_column: str,
    name: str,
    folder: Path | None,
    render: chat_data.Render,
    tokenizer: PreTrainedTokenizerBase,
    max_pixels: int | None,
) -> VisionPreferenceRows:
    """Every row of ``ds`` read, checked (answers present and different, images found, a pair)
    and both answers rendered after its prompt."""
    ds = undecoded(ds, images_column) if images_column in ds.column_names else ds
    pairs, refs = [], []
    for row in range(len(ds)):
        raw = dict(ds[row])
        where = f"row {row} of {name}"
        pref = read_row(raw, row, name)
        if pref.rejected is None:
            raise BadPreferenceRow(f"{where}: vision preference rows are pairs (chosen, rejected), not KTO's")
        prompt = pref.prompt
        turns = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        encoded = []
        for answer in (pref.chosen, pref.rejected):
            messages = [*turns, {"role": "assistant", "content": answer}]
            images = raw.get(images_column)
            conv = chat_data.parse_conversation(messages, row, name, images, images_field=images_column)
            encoded.append(chat_data.encode(render, tokenizer, conv, where, last_only=True))
        for ref in conv.images:
            if isinstance(ref, str) and not resolve_path(ref, folder).is_file():
                raise chat_data.BadConversation(f"image {resolve_path(ref, folder)} ({where}) not found")
        pairs.append((encoded[0], encoded[1]))
        refs.append(conv.images)
    return VisionPreferenceRows(pairs, refs, folder, name, max_pixels)


class VisionPreferenceCollator(VisionChatCollator):
    """B pairs -> the processor's tensors of 2B conversations: the B chosen, then the B rejected."""

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        import torch

        batch = super().__call__([f["chosen"] for f in features] + [f["rejected"] for f in features])
        for key in ("ref_first", "ref_second"):  # the precomputed reference's numbers, [B]
            if key in features[0]:
                batch[key] = torch.tensor([f[key] for f in features], dtype=torch.float32)
        return batch

    def __repr__(self) -> str:
        return f"VisionPreferenceCollator(max_length={self.max_length})"


class KeyedCollator:
    """The collator of ``VisionPreferenceRows.keys()`` rows (the precomputed reference's pass):
    each key's pair read from its split's rows, then collated as training collates it."""

    def __init__(self, splits: dict[str, VisionPreferenceRows], collator: VisionPreferenceCollator) -> None:
        self.splits, self.collator = splits, collator

    def __call__(self, keys: list[dict[str, Any]]) -> dict[str, Any]:
        return self.collator([self.splits[k["split"]][k["index"]] for k in keys])
