"""The rows vision-language reads (docs/vision-language.md#data), each format mapped onto one
``chat_data.Conversation`` (messages with image parts, the images in the order they are placed):

- ``messages``: ``{role, content}`` turns, content text or parts; ``<image>`` placeholders in
  string turns (LLaMA-Factory) take the row's ``data.images_column`` in order;
- ``sharegpt``: ``conversations`` of ``{from, value}`` turns (LLaVA, LLaMA-Factory), the same
  placeholders; LLaVA's own files name one image in ``data.image_column``;
- ``prompt_response``: flat rows, an image, a question and an answer column, as one user turn
  (the images, then the question) and the answer.

Turns spelt otherwise read through ``row_formats.turn_keys`` (``data.role_tag`` & co.). The
per-row reader is ``vision_conversation(data config, format, row, index, file)``, the format
decided once from the columns by ``vision_format``; ``rows`` reads, checks and renders a whole
data set for the task. Nothing heavy at import (``chat_data`` and the image stack are imported
inside).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from xtrain.data.rows import chat as chat_data
from xtrain.data.rows import formats as row_formats
from xtrain.data.rows.chat import IMAGE_PLACEHOLDER
from xtrain.data.rows.images import resolve_path, undecoded
from xtrain.data.rows.vision_chat import VisionChatRows
from xtrain.errors import XtrainError

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import PreTrainedTokenizerBase

    from xtrain.config.schema import DataConfig, TrainConfig
    from xtrain.data.encoded import Encoding
    from xtrain.data.rows.chat import Conversation

# prompt_response: an image, a question and an answer column
VISION_FORMATS = ("auto", "messages", "sharegpt", "prompt_response")
QUESTION_COLUMNS = ("question", "prompt")  # looked for when data.prompt_column is not set
ANSWER_COLUMNS = ("answer", "response")


def flat_columns(d: DataConfig, columns: list[str]) -> tuple[str, str | None, str | None]:
    """(image, question, answer) columns of flat vision rows: ``data.image_column``,
    ``data.prompt_column`` (else ``question`` or ``prompt``), ``data.response_column`` (else
    ``answer`` or ``response``); None where none is there."""
    question = d.prompt_column or next((c for c in QUESTION_COLUMNS if c in columns), None)
    answer = d.response_column or next((c for c in ANSWER_COLUMNS if c in columns), None)
    return d.image_column, question, answer


def vision_format(d: DataConfig, columns: list[str], source: str) -> str:
    """``data.row_format`` for vision-language, or for ``auto`` what the columns hold: messages
    (``data.messages_column``), sharegpt (``conversations``), or an image with a question and an
    answer (``prompt_response``); else one line naming the columns."""
    if d.row_format != "auto":
        return d.row_format
    _, question, answer = flat_columns(d, columns)
    if d.prompt_column is None and d.messages_column in columns:
        return "messages"
    if d.prompt_column is None and row_formats.SHAREGPT_COLUMN in columns:
        return "sharegpt"
    if question in columns and answer in columns:
        return "prompt_response"
    raise XtrainError(
        f"cannot tell what the rows of {source} hold (columns: {', '.join(columns)})",
        f"vision-language reads conversations ('{d.messages_column}' or '{row_formats.SHAREGPT_COLUMN}'), "
        f"or '{d.image_column}' + question + answer columns: set data.messages_column, or "
        "data.prompt_column and data.response_column (docs/vision-language.md#data)",
    )


def images_field(d: DataConfig, fmt: str, columns: list[str]) -> str:
    """The column of a vision row's images: ``data.image_column`` for flat rows; for
    conversations ``data.images_column``, or ``data.image_column`` where only that is there
    (LLaVA's own files: one ``image`` path beside ``conversations``)."""
    if fmt == "prompt_response" or (d.images_column not in columns and d.image_column in columns):
        return d.image_column
    return d.images_column


def vision_columns(d: DataConfig, fmt: str, columns: list[str], source: str) -> list[str]:
    """The columns vision rows of ``fmt`` read, the ones they need checked present (one line)."""
    if fmt != "prompt_response":
        needed = [row_formats.chat_column(d, fmt, columns)]
        keys = ["data.messages_column"]
    else:
        image, question, answer = flat_columns(d, columns)
        needed = [image, question or QUESTION_COLUMNS[0], answer or ANSWER_COLUMNS[0]]
        keys = ["data.image_column", "data.prompt_column", "data.response_column"]
    for column, key in zip(needed, keys, strict=True):
        if column not in columns:
            raise XtrainError(
                f"column '{column}' not in {source} for row_format {fmt} (columns: {', '.join(columns)})",
                f"set {key} to one of them (docs/vision-language.md#data)",
            )
    field = images_field(d, fmt, columns)
    return list(dict.fromkeys([*needed, *([field] if field in columns else [])]))


def vision_conversation(
    d: DataConfig, fmt: str, row: dict[str, Any], index: int, source: str
) -> Conversation:
    """Row ``index`` of ``source`` read as ``fmt`` (``vision_format`` of its columns): the
    checked ``chat_data.Conversation`` (its images in placeholder order), or a ``RowError``
    naming the file, the row and the field."""
    messages, images, field = vision_turns(d, fmt, row, index, source)
    return chat_data.parse_conversation(messages, index, source, images, images_field=field)


def vision_turns(
    d: DataConfig, fmt: str, row: dict[str, Any], index: int, source: str
) -> tuple[Any, Any, str]:
    """Row ``index`` of ``source`` as (its ``messages`` cell, its image list cell, the field
    that list came from), for ``chat_data.parse_conversation``. A flat row becomes one user turn
    (its question; the images first unless the question places them with ``<image>``) and the
    answer."""
    if fmt != "prompt_response":
        field = images_field(d, fmt, list(row))
        return row_formats.chat_turns(d, fmt, row, index, source), row.get(field), field
    where = f"row {index} of {source}"
    image, question_column, answer_column = flat_columns(d, list(row))
    images = row.get(image)
    count = len(images) if isinstance(images, (list, tuple)) else int(images is not None and images != "")
    if not count:  # an image, a question and an answer: never trained text-only by a blank cell
        raise row_formats.BadRow(f"{where}: field '{image}' is empty")
    # the question may be empty (captions: the image is the prompt)
    question = row_formats.text_field(row, question_column or QUESTION_COLUMNS[0], where, False) or ""
    answer = row_formats.text_field(row, answer_column or ANSWER_COLUMNS[0], where, True)
    assert answer is not None
    if IMAGE_PLACEHOLDER not in question:
        question = IMAGE_PLACEHOLDER * count + question
    return [{"role": "user", "content": question}, {"role": "assistant", "content": answer}], images, image


def rows(
    ds: Dataset,
    cfg: TrainConfig,
    name: str,
    folder: Path | None,
    render: chat_data.Render | None,
    tokenizer: PreTrainedTokenizerBase,
    with_prompts: bool,
    role: str = "train",
) -> VisionChatRows:
    """The task's rows of ``ds``: every row read in its format (``vision_conversation``),
    checked and rendered (one line naming the first bad row), its images found; encoded once
    (``encoded.encode``: cached, in parallel on a first run), the images read from the data row
    when a batch needs them. ``render`` None (the data check without a processor): checked, not
    rendered (no rows)."""
    from xtrain.data.encoded import encode

    d = cfg.data
    fmt = vision_format(d, list(ds.column_names), name)
    names = vision_columns(d, fmt, list(ds.column_names), name)
    ds = undecoded(ds, images_field(d, fmt, list(ds.column_names))).select_columns(names)
    refs = ImageRefs(ds, d, fmt, name)
    if render is None:
        for row in range(len(ds)):
            _found(vision_conversation(d, fmt, dict(ds[row]), row, name), folder, f"row {row} of {name}")
        return VisionChatRows(None, refs, folder, name)
    encoded = encode(ds, encoding(d, fmt, name, folder, render, tokenizer), f"encoding {role}")
    if len(encoded) == 0:
        raise XtrainError(
            f"no conversation of {name} has an assistant answer within data.max_length={d.max_length}",
            "raise data.max_length",
        )
    return VisionChatRows(
        encoded, refs, folder, name, with_prompts=with_prompts, max_pixels=d.max_image_pixels
    )


def _found(conv: Conversation, folder: Path | None, where: str) -> Conversation:
    for ref in conv.images:
        if isinstance(ref, str) and not resolve_path(ref, folder).is_file():
            raise chat_data.BadConversation(f"image {resolve_path(ref, folder)} ({where}) not found")
    return conv


# Bump when the encoded rows change what they hold (every cached encoding of them is redone).
VERSION = 1
SETTINGS = ("messages_column", "images_column", "image_column", "role_tag", "content_tag", "user_tag",
            "assistant_tag", "system_tag", "prompt_column", "response_column", "max_length")  # fmt: skip


def encoding(
    d: DataConfig,
    fmt: str,
    name: str,
    folder: Path | None,
    render: chat_data.Render,
    tokenizer: PreTrainedTokenizerBase,
) -> Encoding:
    """The rows of ``name`` as text, input_ids, labels, the last answer's prompt and the row's
    number, a map batch at a time (``columns``)."""
    import datasets

    from xtrain.data.encoded import Encoding
    from xtrain.data.rows.render import template_of
    from xtrain.data.tokenize import tokenizer_fingerprint

    settings = {n: getattr(d, n) for n in SETTINGS}
    key = (
        "vision chat rows",
        VERSION,
        fmt,
        settings,
        str(folder),
        template_of(render),
        tokenizer_fingerprint(tokenizer),
    )
    ids, text = datasets.List(datasets.Value("int32")), datasets.Value("string")
    features = datasets.Features(
        {"text": text, "input_ids": ids, "labels": ids, "prompt": text, "row": datasets.Value("int64")}
    )
    kwargs = {"d": d, "fmt": fmt, "name": name, "folder": folder, "render": render, "tokenizer": tokenizer}
    return Encoding("vision chat rows", columns, kwargs, key, features, processes=d.encode_processes)


def columns(
    batch: dict[str, list[Any]],
    indices: list[int],
    d: DataConfig,
    fmt: str,
    name: str,
    folder: Path | None,
    render: chat_data.Render,
    tokenizer: PreTrainedTokenizerBase,
) -> dict[str, list[Any]]:
    """A map batch of rows checked (images found) and rendered; a row whose answers all lie past
    ``data.max_length`` left out (the causal-lm rule). Top-level: it runs in the encoding processes."""
    out: dict[str, list[Any]] = {"text": [], "input_ids": [], "labels": [], "prompt": [], "row": []}
    for k, index in enumerate(indices):
        where = f"row {index} of {name}"
        conv = _found(
            vision_conversation(d, fmt, {n: batch[n][k] for n in batch}, index, name), folder, where
        )
        enc = chat_data.encode(render, tokenizer, conv, where)
        if all(t == -100 for t in enc.labels[: d.max_length][1:]):
            continue
        for key, value in (("text", enc.text), ("input_ids", enc.input_ids), ("labels", enc.labels),
                           ("prompt", enc.prompt), ("row", index)):  # fmt: skip
            out[key].append(value)
    return out


class ImageRefs:
    """``refs(row)``: the image references of data row ``row`` in placeholder order, read from the
    (memory-mapped) data set when a batch needs them. Top-level: it pickles into DataLoader workers."""

    def __init__(self, ds: Dataset, d: DataConfig, fmt: str, name: str) -> None:
        self.ds, self.d, self.fmt, self.name = ds, d, fmt, name

    def __call__(self, row: int) -> list[Any]:
        return vision_conversation(self.d, self.fmt, dict(self.ds[int(row)]), int(row), self.name).images
