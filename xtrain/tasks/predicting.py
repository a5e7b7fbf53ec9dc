"""What the tasks' ``predict`` hooks share: input files, one-line unreadable inputs, batches onto
the model; for ``xtrain predict --data FILE`` the file loaded as training loads it, conversations
split into a prompt and its reference, left-padded prompt batches and the per-row scores.
Library code: returns data, prints nothing."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from xtrain.data.rows.formats import text_names
from xtrain.data.sources import load_source
from xtrain.errors import XtrainError
from xtrain.tasks.contract import Example

if TYPE_CHECKING:
    import numpy as np
    from datasets import Dataset
    from PIL.Image import Image
    from torch.nn import Module
    from transformers import PreTrainedTokenizerBase

    from xtrain.config.schema import TrainConfig
    from xtrain.data.rows.chat import Conversation
    from xtrain.tasks.contract import Loaded, PredictRequest, Task

    T = TypeVar("T")

# the key of ``Loaded.parts`` that holds the run's ``data.max_image_pixels`` (``image_limit``)
IMAGE_LIMIT = "max_image_pixels"
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp", ".gif")
AUDIO_EXTENSIONS = (".wav", ".flac", ".ogg", ".oga", ".opus", ".mp3")  # what soundfile reads


def media_files(
    inputs: list[str], extensions: tuple[str, ...] = IMAGE_EXTENSIONS, what: str = "images"
) -> list[Path]:
    """Files as given; folders expanded to their images (or clips: ``extensions``), sorted by name."""
    out: list[Path] = []
    for item in inputs:
        p = Path(item).expanduser()
        if p.is_dir():
            out += sorted(f for f in p.iterdir() if f.suffix.lower() in extensions)
        elif p.is_file():
            out.append(p)
        else:
            raise XtrainError(f"input {item} not found", f"pass files or folders of {what}")
    if not out:
        raise XtrainError(f"no {what} found in the inputs", f"{what} end in {', '.join(extensions)}")
    return out


def read_input(path: Path, what: str, read: Callable[[], T]) -> T:
    """``read()`` of one input file; a file it cannot read is one line naming that file (the
    readers' own wording is about rows of a data set)."""
    try:
        return read()
    except XtrainError as e:
        reason = e.message.split("): ", 1)[1] if "): " in e.message else "not found"
        raise XtrainError(
            f"input {path} is not a readable {what}: {reason}",
            "fix or replace that file, or leave it out of the inputs",
        ) from None


def to_model(batch: dict[str, Any], model: Module) -> dict[str, Any]:
    """Tensors onto the model's device; floating ones (pixels, audio features) in its dtype."""
    import torch

    dtype = getattr(model, "dtype", None)
    return {
        k: v.to(model.device, dtype=dtype if v.is_floating_point() and dtype else None)
        if torch.is_tensor(v)
        else v
        for k, v in batch.items()
    }


def refuse_prompts(loaded: Loaded, task: Task, request: PredictRequest) -> None:
    """A ``task`` that reads files (images, audio: ``task.predicts.takes``) got
    ``--prompt``/``--question`` or ``--system``."""
    source, takes = loaded.source, task.predicts.takes
    if request.prompts:
        raise XtrainError(
            f"{source} is a {task.name} model: it reads {takes}, not --prompt/--question",
            f"pass {takes} instead",
        )
    if request.system is not None:
        raise XtrainError(
            "--system is for vision-language models and causal-lm runs trained on chat conversations",
            "leave it out for this model",
        )


def file_examples(files: list[Path]) -> list[Example]:
    """Input files as ``Example``s whose feed is the file itself (``open_images``/``read_clips``
    read it, a bad one named as the input it is)."""
    return [Example(i, {"input": str(f)}, f) for i, f in enumerate(files)]


def file_rows(examples: list[Example], outputs: list[dict[str, str]]) -> list[dict[str, str]]:
    """The printed rows of input files: the input, the ``output`` (+ its probability): the shape
    every mode of ``xtrain predict`` writes."""
    rows = []
    for e, o in zip(examples, outputs, strict=True):
        rows.append({**e.shown, "output": o["output"], **{k: v for k, v in o.items() if k != "output"}})
    return rows


def image_limit(loaded: Loaded) -> int | None:
    """The pixels an image's header may declare (``data.max_image_pixels``): the run's own, which
    ``xtrain.predict.load_predictor`` puts in the loaded parts (``IMAGE_LIMIT``), so predict
    refuses the images training would; Pillow's default where nothing says it."""
    from xtrain.data.rows.images import MAX_PIXELS

    return loaded.parts.get(IMAGE_LIMIT, MAX_PIXELS)


def open_images(examples: list[Example], max_pixels: int | None) -> list[Image]:
    """The RGB images of a batch: a data file's cells (a bad one names its row and file) or
    input files (a bad one names the file); one declaring more than ``max_pixels`` is refused
    undecoded (``image_limit``)."""
    from xtrain.data.rows.images import open_image

    out = []
    for e in examples:
        feed = e.feed
        if isinstance(feed, MediaCell):
            out.append(open_image(feed.value(), feed.folder, feed.row, feed.source, max_pixels))
        else:
            read = lambda f=feed: open_image(str(f), None, 0, "", max_pixels)  # noqa: E731
            out.append(read_input(feed, "image", read))
    return out


def read_clips(examples: list[Example], rate: int, seconds: float | None) -> list[np.ndarray]:
    """The clips of a batch, mono at ``rate`` Hz and cut to ``seconds`` (the model hears no more):
    a data file's cells or input files, as ``open_images``."""
    from xtrain.data.rows.audio import read_audio

    out = []
    for e in examples:
        feed = e.feed
        if isinstance(feed, MediaCell):
            out.append(read_audio(feed.value(), feed.folder, feed.row, feed.source, rate, seconds))
        else:
            read = lambda f=feed: read_audio(str(f), None, 0, "", rate, seconds)  # noqa: E731
            out.append(read_input(feed, "audio file", read))
    return out


def generate_texts(
    loaded: Loaded, batch: dict[str, Any], request: PredictRequest, **generate: Any
) -> list[dict[str, str]]:
    """One ``generate`` call of an encoder-decoder model on ``batch``, greedy or beam search as
    the request says: ``{"output": text}`` per row."""
    import torch

    settings = {"max_new_tokens": request.max_new_tokens, "num_beams": request.num_beams, **generate}
    with torch.no_grad():
        ids = loaded.model.generate(**to_model(batch, loaded.model), **settings)
    return [{"output": t.strip()} for t in loaded.tokenizer.batch_decode(ids, skip_special_tokens=True)]


# ---------------------------------------------------------------------------------------------
# ``xtrain predict --data FILE``: a data file's rows, read by the run's own readers


def load_file(cfg: TrainConfig, media: str | None = None) -> tuple[Dataset, str, Path | None]:
    """(the rows of the ``--data`` file, its name for messages, the folder its relative
    ``media`` ("image", "audio") paths are relative to, as training decides it; None without
    media): read by the loader training uses (``cfg.data.eval`` is the file; a saved data set's
    eval split is the one read)."""
    from xtrain.tasks import common

    source = cfg.data.eval
    ds = load_source(source, cfg.data.format, role="eval", key="--data", text=text_names(cfg.data))
    return ds, source, common.media_dirs(cfg, media)[1] if media else None


def split_conversation(
    cell: Any,
    row: int,
    source: str,
    images: Any = None,
    allow_images: bool = False,
    images_field: str = "images",
) -> tuple[Conversation, str | None]:
    """One conversation cell -> (its turns before the last assistant answer, checked by
    ``chat_data.parse_conversation`` as training checks them; that answer, the row's reference).
    A conversation that ends in a user turn is a prompt without a reference: the parser, which
    wants an answer to learn from, checks it with a stand-in answer that is then dropped."""
    from xtrain.data.rows import chat as chat_data

    answered = isinstance(cell, list) and bool(cell) and isinstance(cell[-1], dict)
    answered = answered and cell[-1].get("role") == "assistant"
    probe = cell if answered or not isinstance(cell, list) else [*cell, {"role": "assistant", "content": "-"}]
    conv = chat_data.parse_conversation(probe, row, source, images, allow_images, images_field)
    last = max(i for i, t in enumerate(conv.messages) if t["role"] == "assistant")
    content = conv.messages[last]["content"]
    answer = content if isinstance(content, str) else "".join(p.get("text", "") for p in content)
    prompt = chat_data.Conversation(conv.messages[:last], conv.images)
    return prompt, answer.strip() if answered else None


def last_user_text(messages: list[dict[str, Any]]) -> str:
    """The text of the last user turn (string content or text parts): what a results line shows."""
    for turn in reversed(messages):
        if turn["role"] == "user":
            content = turn["content"]
            return content if isinstance(content, str) else "".join(p.get("text", "") for p in content)
    return ""


@dataclass
class MediaCell:
    """The image or audio cell of row ``row`` of a data file, read only when its batch runs."""

    ds: Dataset
    column: str
    row: int
    folder: Path | None
    source: str

    def value(self) -> Any:
        return self.ds[self.row][self.column]


def media_examples(
    ds: Dataset, column: str, folder: Path | None, source: str, refs: list[str | None], feature: str = "Image"
) -> list[Example]:
    """One ``Example`` per row of a media column (``feature``: a datasets Image or Audio column is
    switched to undecoded cells): shown as its path (or "embedded ... bytes"), fed as its cell."""
    from xtrain.data.rows.images import describe, undecoded

    ds = undecoded(ds, column, feature)
    what = "image" if feature == "Image" else "audio"
    shown: list[str] = []
    for batch in ds.select_columns([column]).iter(batch_size=256):  # paths, not every cell's bytes at once
        shown += [describe(v, folder, what) for v in batch[column]]
    cells = [MediaCell(ds, column, i, folder, source) for i in range(len(ds))]
    return [Example(i, {"input": shown[i]}, cells[i], refs[i]) for i in range(len(ds))]


def references(ds: Dataset, column: str | None, source: str, key: str) -> list[str | None]:
    """The optional reference column (``key`` names it in the refusal when it holds no text):
    its values as text, None for rows without one; all None when the file has no such column."""
    from xtrain.data.tokenize import require_columns

    if column is None or column not in ds.column_names:
        return [None] * len(ds)
    require_columns(ds, {key: column}, source)
    return [None if v is None or not str(v).strip() else str(v).strip() for v in ds[column]]


def left_pad(rows: list[dict[str, Any]], pad: int) -> dict[str, Any]:
    """Per-token tensors (each ``[1, n]``) left-padded to one length and stacked: ``input_ids``
    with ``pad``, the others (attention mask, token types) with 0; so every prompt ends in the
    same column and ``generate`` continues each one from its own last token."""
    import torch

    width = max(r["input_ids"].shape[1] for r in rows)
    out: dict[str, Any] = {}
    for key in rows[0]:
        fill = pad if key == "input_ids" else 0
        first = rows[0][key]
        stacked = torch.full((len(rows), width), fill, dtype=first.dtype)
        for i, r in enumerate(rows):
            n = r[key].shape[1]
            stacked[i, width - n :] = r[key][0]
        out[key] = stacked
    return out


def pad_id(tokenizer: PreTrainedTokenizerBase) -> int:
    """The id prompts are padded with: the pad token, else eos (llama-style tokenizers have none)."""
    for found in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if found is not None:
            return int(found)
    return 0


# Scores of outputs against references: per row (one pair) and over a file (every pair).


def exact_match(refs: list[str], outputs: list[str]) -> dict[str, float]:
    """Normalised exact match (the evaluation's: case, punctuation and spacing ignored)."""
    from xtrain.tasks.generation import exact_match as share

    return {"exact_match": share(refs, outputs)}


def error_rates(refs: list[str], outputs: list[str]) -> dict[str, float]:
    """CER and WER of the text as written (image-to-text's evaluation)."""
    from xtrain.tasks.generation import text_metrics

    return text_metrics(refs, outputs)


def normalized_error_rates(refs: list[str], outputs: list[str]) -> dict[str, float]:
    """CER and WER of ``normalize_text`` of both sides (speech-to-text's evaluation)."""
    from xtrain.tasks.generation import normalize_text, text_metrics

    return text_metrics([normalize_text(r) for r in refs], [normalize_text(o) for o in outputs])


def accuracy(refs: list[str], outputs: list[str]) -> dict[str, float]:
    """The share of labels equal to their reference."""
    pairs = list(zip(refs, outputs, strict=True))
    return {"accuracy": sum(r == o for r, o in pairs) / len(pairs)} if pairs else {}


def in_batches(
    answer: Callable[[Loaded, list[Example], PredictRequest], list[dict[str, str]]],
    loaded: Loaded,
    examples: list[Example],
    request: PredictRequest,
    progress: Callable[[int, int], None] | None = None,
) -> list[dict[str, str]]:
    """``answer(loaded, batch, request)`` over ``examples``, ``request.batch_size`` at a time;
    ``progress(done, total)`` after each batch."""
    size, outputs = max(1, request.batch_size), []
    for start in range(0, len(examples), size):
        outputs += answer(loaded, examples[start : start + size], request)
        if progress is not None:
            progress(len(outputs), len(examples))
    return outputs
