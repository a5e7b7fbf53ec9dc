"""Image-text examples for ``image-to-text``: lazy image reading, RGB conversion, batching.

Images are never decoded up front. The image column stays undecoded (``datasets.Image(decode=False)``
for an Image feature, a path string for CSV/JSON), and ``ImageTextRows[i]`` opens row ``i`` only
when the DataLoader asks for it. (``set_transform`` would decode lazily too, but it is called
without row numbers, and an unreadable image must be reported with its file and row.)

Everything here is a top-level class holding plain data, so it pickles into spawned DataLoader
workers (Windows, macOS).
"""

from __future__ import annotations

import contextlib
import io
import math
import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xtrain.config.schema import DataConfig
from xtrain.data.collate import IGNORE_INDEX
from xtrain.data.labels import label_key
from xtrain.errors import RowError, XtrainError, shown

if TYPE_CHECKING:
    import torch
    from datasets import Dataset
    from PIL.Image import Image
    from transformers import PreTrainedTokenizerBase
    from transformers.image_processing_utils import BaseImageProcessor

_HINT = "fix or remove that row; images must be files Pillow can open (PNG, JPEG, TIFF, BMP, WebP, ...)"
# data.max_image_pixels' default (the schema decides it), for readers given no limit (predict of a
# run that saved none)
MAX_PIXELS = DataConfig.max_image_pixels
_BOMB_HINT = (
    "a decompression bomb, or a huge image: remove that row, or raise data.max_image_pixels "
    "(null: no limit) if the image is real"
)


class UnreadableImage(RowError):
    """A missing or undecodable image: one line with the file and the row (``RowError``)."""

    HINT = _HINT
    OTHER_HINTS = (_BOMB_HINT,)


def to_rgb(image: Image) -> Image:
    """Any PIL image as 8-bit RGB: grayscale, palette, CMYK, 16-bit and float images converted;
    transparency composited onto white (transparent text images would otherwise turn black)."""
    from PIL import Image

    if image.mode == "RGB":
        return image
    if image.mode in ("I", "I;16", "I;16B", "I;16L", "I;16N", "F"):
        import numpy as np

        array = np.asarray(image, dtype=np.float64)
        top = float(array.max()) if array.size else 0.0
        # 16-bit data (values above 255) is scaled down; float images in [0, 1] are scaled up.
        scale = 255.0 / 65535.0 if top > 255 else (255.0 if image.mode == "F" and top <= 1.0 else 1.0)
        array = np.clip(array * scale, 0, 255).astype(np.uint8)
        return Image.fromarray(array, mode="L").convert("RGB")
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        page = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(page, rgba).convert("RGB")
    return image.convert("RGB")


def describe(value: Any, base_dir: Path | None, media: str = "image") -> str:
    """An image or audio cell in a message: its path, else "embedded ``media`` bytes"."""
    if isinstance(value, str):
        return str(resolve_path(value, base_dir))
    if isinstance(value, dict):
        return str(value.get("path") or f"embedded {media} bytes")
    return type(value).__name__


def resolve_path(path: str, base_dir: Path | None) -> Path:
    """A relative image or audio path is relative to ``base_dir``: the data file's folder, or
    ``data.image_root`` / ``data.audio_root`` (``common.media_dirs`` decides); absolute stays."""
    p = Path(path).expanduser()
    return p if p.is_absolute() or base_dir is None else base_dir / p


@contextlib.contextmanager
def pixel_limit(max_pixels: int | None) -> Iterator[None]:
    """Pillow's own decompression-bomb check with ``max_pixels`` as its limit, strict: an image
    whose header declares more pixels raises ``DecompressionBombError`` before its data is
    decoded (Pillow itself only warns up to twice its limit, and decodes). Set per call and put
    back: a DataLoader worker process gets the limit with the rows (pickled), not from a global."""
    from PIL import Image

    saved = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = max_pixels
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            yield
    finally:
        Image.MAX_IMAGE_PIXELS = saved


def open_image(
    value: Any, base_dir: Path | None, row: int, source: str, max_pixels: int | None = MAX_PIXELS
) -> Image:
    """The RGB PIL image of one cell of the image column: a path string, an undecoded Image
    feature cell (``{"bytes", "path"}``) or an already decoded PIL image. A file whose header
    declares more than ``max_pixels`` pixels (``data.max_image_pixels``) is refused undecoded."""
    from PIL import Image, UnidentifiedImageError

    what = describe(value, base_dir)
    try:
        with pixel_limit(max_pixels):
            if isinstance(value, str):
                image = Image.open(resolve_path(value, base_dir))
            elif isinstance(value, dict) and value.get("bytes"):
                image = Image.open(io.BytesIO(value["bytes"]))
            elif isinstance(value, dict) and value.get("path"):
                image = Image.open(resolve_path(value["path"], base_dir))
            elif hasattr(value, "convert"):
                image = value
            else:
                raise UnreadableImage(f"row {row} of {source} has no image (value: {shown(value)})")
            image.load()  # decode now: a truncated file fails here, inside this row's error
        return to_rgb(image)
    except XtrainError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        declared = re.search(r"\((\d+) pixels\)", str(e))
        raise UnreadableImage(
            f"cannot read image {what} (row {row} of {source}): it declares "
            f"{declared.group(1) if declared else 'more'} pixels, above data.max_image_pixels={max_pixels}",
            _BOMB_HINT,
        ) from None
    except FileNotFoundError:
        raise UnreadableImage(f"image {what} (row {row} of {source}) not found") from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as e:
        reason = (str(e).splitlines() or [type(e).__name__])[0][:160]
        raise UnreadableImage(f"cannot read image {what} (row {row} of {source}): {reason}") from None


def check_image_files(ds: Dataset, image_column: str, base_dir: Path | None, source: str) -> None:
    """Missing files are found before training starts (a ``stat`` per path, nothing decoded)."""
    feature = ds.features.get(image_column)
    if getattr(feature, "dtype", None) not in ("string", "large_string"):  # CSV/parquet: large_string
        return  # an Image feature: bytes are embedded or paths were checked when it was built
    for row, value in enumerate(ds[image_column]):
        if value is None or not str(value).strip():
            raise UnreadableImage(f"row {row} of {source} has an empty {image_column} cell")
        if not resolve_path(value, base_dir).is_file():
            raise UnreadableImage(f"image {resolve_path(value, base_dir)} (row {row} of {source}) not found")


class ImageRows:
    """A map-style data set over ``ds`` whose ``[i]`` holds the RGB PIL image of the image
    column, read from disk (or bytes) only then, and what ``target(row)`` makes of the row."""

    def __init__(
        self,
        ds: Dataset,
        image_column: str,
        base_dir: Path | None,
        source: str,
        *,
        max_pixels: int | None = MAX_PIXELS,
    ) -> None:
        self.ds = undecoded(ds, image_column)
        self.image_column = image_column
        self.base_dir = base_dir
        self.source = source
        self.max_pixels = max_pixels  # data.max_image_pixels

    def __len__(self) -> int:
        return len(self.ds)

    def target(self, row: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def __getitem__(self, i: int) -> dict[str, Any]:
        row = self.ds[int(i)]
        image = open_image(row[self.image_column], self.base_dir, int(i), self.source, self.max_pixels)
        return {"image": image, **self.target(row)}


class ImageTextRows(ImageRows):
    """``[i]`` -> ``{"image": RGB PIL image, "text": str}`` (image-to-text)."""

    def __init__(
        self,
        ds: Dataset,
        image_column: str,
        text_column: str,
        base_dir: Path | None,
        source: str,
        *,
        max_pixels: int | None = MAX_PIXELS,
    ) -> None:
        super().__init__(ds, image_column, base_dir, source, max_pixels=max_pixels)
        self.text_column = text_column

    def target(self, row: dict[str, Any]) -> dict[str, Any]:
        text = row[self.text_column]
        return {"text": "" if text is None else str(text)}


def undecoded(ds: Dataset, column: str, feature: str = "Image") -> Dataset:
    """A datasets ``Image`` (or ``Audio``) feature column, or a list of them (a conversation's
    images), switched to undecoded cells (a metadata change: no data is rewritten)."""
    import datasets

    kind = getattr(datasets, feature)
    if column not in ds.column_names:
        return ds
    found = ds.features[column]
    if isinstance(found, kind):
        return ds.cast_column(column, kind(decode=False)) if found.decode else ds
    inner = getattr(found, "feature", None)
    if isinstance(found, (datasets.List, datasets.Sequence)) and isinstance(inner, kind) and inner.decode:
        return ds.cast_column(column, datasets.List(kind(decode=False)))
    return ds


def text_labels(
    tokenizer: PreTrainedTokenizerBase, texts: list[str], max_length: int, drop_first: int | None = None
) -> list[list[int]]:
    """Decoder labels of ``texts``: the tokenizer's ids (without a leading ``drop_first`` token),
    ending in eos, truncated to ``max_length`` (still ending in eos)."""
    eos = tokenizer.eos_token_id
    out = []
    for ids in tokenizer(texts, add_special_tokens=True)["input_ids"]:
        ids = list(ids)
        if drop_first is not None and ids and ids[0] == drop_first:
            ids = ids[1:]
        if eos is not None and (not ids or ids[-1] != eos):
            ids.append(eos)  # generation stops at eos only if it learned to write it
        if len(ids) > max_length:  # truncated, still ending in eos
            ids = ids[: max_length - 1] + [eos] if eos is not None else ids[:max_length]
        out.append(ids)
    return out


def padded_labels(ids: list[list[int]], pad_to_multiple_of: int | None = None) -> torch.Tensor:
    """One LongTensor of label rows, padded with -100 (to a multiple of ``pad_to_multiple_of``)."""
    import torch

    length = max(len(x) for x in ids)
    if pad_to_multiple_of:
        length = math.ceil(length / pad_to_multiple_of) * pad_to_multiple_of
    labels = torch.full((len(ids), length), IGNORE_INDEX, dtype=torch.long)
    for i, x in enumerate(ids):
        labels[i, : len(x)] = torch.as_tensor(x, dtype=torch.long)
    return labels


class ImageTextCollator:
    """A list of ``{"image", "text"}`` -> ``pixel_values`` (the image processor) and ``labels``
    (the tokenizer, truncated to ``max_length``, ending in eos, padded with -100)."""

    def __init__(
        self,
        image_processor: BaseImageProcessor,
        tokenizer: PreTrainedTokenizerBase,
        max_length: int,
        pad_to_multiple_of: int | None = None,
    ) -> None:
        self.image_processor = image_processor
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.pad_to_multiple_of = pad_to_multiple_of

    def labels(self, texts: list[str]) -> list[list[int]]:
        return text_labels(self.tokenizer, texts, self.max_length)

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        if not features:
            raise ValueError("empty batch")
        images = [f["image"] for f in features]
        pixel_values = self.image_processor(images=images, return_tensors="pt")["pixel_values"]
        labels = padded_labels(self.labels([f["text"] for f in features]), self.pad_to_multiple_of)
        return {"pixel_values": pixel_values, "labels": labels}

    def __repr__(self) -> str:
        return f"ImageTextCollator(max_length={self.max_length})"


class ImageLabelRows(ImageRows):
    """``[i]`` -> ``{"image": RGB PIL image, "label": int}`` (image-classification);
    ``label_to_id`` maps label names (None: integer labels as they are)."""

    def __init__(
        self,
        ds: Dataset,
        columns: tuple[str, str],
        label_to_id: dict[str, int] | None,
        base_dir: Path | None,
        source: str,
        *,
        max_pixels: int | None = MAX_PIXELS,
    ) -> None:
        super().__init__(ds, columns[0], base_dir, source, max_pixels=max_pixels)
        self.label_column = columns[1]
        self.label_to_id = label_to_id

    def target(self, row: dict[str, Any]) -> dict[str, Any]:
        label = row[self.label_column]
        return {"label": self.label_to_id[label_key(label)] if self.label_to_id is not None else int(label)}


class ImageLabelCollator:
    """A list of ``{"image", "label"}`` -> ``pixel_values`` (the image processor) and ``labels``."""

    def __init__(self, image_processor: BaseImageProcessor) -> None:
        self.image_processor = image_processor

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        import torch

        if not features:
            raise ValueError("empty batch")
        pixel_values = self.image_processor(images=[f["image"] for f in features], return_tensors="pt")
        labels = torch.tensor([f["label"] for f in features], dtype=torch.long)
        return {"pixel_values": pixel_values["pixel_values"], "labels": labels}

    def __repr__(self) -> str:
        return "ImageLabelCollator()"


def image_size(ref: Any, folder: Path | None) -> tuple[int, int]:
    """(height, width) of an image cell from its header (PIL opens lazily: nothing decoded)."""
    import io

    from PIL import Image

    from xtrain.data.rows.images import resolve_path

    if hasattr(ref, "size"):
        width, height = ref.size
        return height, width
    if isinstance(ref, dict) and ref.get("bytes"):
        opened = Image.open(io.BytesIO(ref["bytes"]))
    else:
        opened = Image.open(resolve_path(ref if isinstance(ref, str) else ref["path"], folder))
    with opened as image:
        width, height = image.size
    return height, width
