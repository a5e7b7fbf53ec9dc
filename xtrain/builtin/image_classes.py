"""Built-in image classification assets, made offline and deterministically (``xtrain.builtin`` calls these).

- ``builtin:tiny-vit``: a ``ViTForImageClassification`` shaped like a hub checkpoint (32x32 RGB
  input, 8-pixel patches: 16 patches and a CLS token, hidden 64, 2 layers, 4 heads) with a
  ``ViTImageProcessor`` saved next to it, so ``AutoImageProcessor`` and
  ``AutoModelForImageClassification`` load the folder like ``google/vit-base-patch16-224``. Like
  an ImageNet checkpoint, its head has other classes than the data (10 generic ones): a fine-tune
  loads it with ``num_labels``/``id2label`` and ``ignore_mismatched_sizes=True``, which gives a
  new head, as with a real checkpoint.
- ``builtin:color-shapes``: 32x32 PNG images of one filled shape (circle, square, triangle,
  cross) in a random colour, size and position on a noisy light background, listed in
  ``train.jsonl`` / ``eval.jsonl`` with paths relative to the file
  (``{"image": "train/00000.png", "label": "circle"}``): the same layout as a user's own
  CSV/JSONL of image paths and label names, read through the same code.

The weights are random: the quickstart shows the loop learning to classify, not a pretrained ViT.
"""

from __future__ import annotations

import colorsys
import json
import random
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from PIL import Image

MODELS = ("tiny-vit",)
DATASETS = ("color-shapes",)

IMAGE_SIZE = 32  # pixels a side
PATCH = 8  # 4x4 patches + CLS: 17 tokens an image
CLASSES = ("circle", "square", "triangle", "cross")
TRAIN_IMAGES, EVAL_IMAGES = 2000, 200
# The untrained checkpoint's own head: other classes than the data's, as with an ImageNet checkpoint.
BASE_LABELS = 10


# --------------------------------------------------------------------------------------------
# Data


def _shape_colour(rng: random.Random) -> tuple[int, int, int]:
    """A saturated, mid-dark colour of any hue: it stands out from the light background."""
    r, g, b = colorsys.hsv_to_rgb(rng.random(), rng.uniform(0.55, 1.0), rng.uniform(0.3, 0.8))
    return round(r * 255), round(g * 255), round(b * 255)


def _outline(shape: str, cx: float, cy: float, r: float) -> list[tuple[float, float]]:
    if shape == "square":
        s = r * 0.85  # about the circle's area
        return [(cx - s, cy - s), (cx + s, cy - s), (cx + s, cy + s), (cx - s, cy + s)]
    if shape == "triangle":
        return [(cx, cy - r), (cx + r, cy + r * 0.8), (cx - r, cy + r * 0.8)]
    w = r * 0.35  # cross: a plus sign, arms ~0.7 r thick
    return [
        (cx - w, cy - r), (cx + w, cy - r), (cx + w, cy - w), (cx + r, cy - w),
        (cx + r, cy + w), (cx + w, cy + w), (cx + w, cy + r), (cx - w, cy + r),
        (cx - w, cy + w), (cx - r, cy + w), (cx - r, cy - w), (cx - w, cy - w),
    ]  # fmt: skip


def draw_shape(shape: str, rng: random.Random) -> Image.Image:
    """A 32x32 RGB image: one filled ``shape`` in a random colour, size and position, on a light
    background of a random tint with per-pixel noise (over the shape too)."""
    import numpy as np
    from PIL import Image, ImageDraw

    page = tuple(rng.randint(185, 255) for _ in range(3))
    image = Image.new("RGB", (IMAGE_SIZE, IMAGE_SIZE), page)
    draw = ImageDraw.Draw(image)
    r = rng.uniform(7.0, 12.0)
    cx = rng.uniform(r + 1, IMAGE_SIZE - 1 - r)
    cy = rng.uniform(r + 1, IMAGE_SIZE - 1 - r)
    fill = _shape_colour(rng)
    if shape == "circle":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fill)
    else:
        draw.polygon(_outline(shape, cx, cy, r), fill=fill)
    # Noise from the same seeded stream (randbytes: the same bytes on every platform).
    noise = np.frombuffer(rng.randbytes(IMAGE_SIZE * IMAGE_SIZE * 3), dtype=np.uint8)
    noise = noise.reshape(IMAGE_SIZE, IMAGE_SIZE, 3).astype(np.int16) % 41 - 20  # -20..20
    pixels = np.clip(np.asarray(image, dtype=np.int16) + noise, 0, 255).astype(np.uint8)
    return Image.fromarray(pixels, "RGB")


def shape_labels(n: int, seed: int) -> list[str]:
    """``n`` labels, each class equally often (up to one), in a shuffled order."""
    rng = random.Random(seed)
    labels = [CLASSES[i % len(CLASSES)] for i in range(n)]
    rng.shuffle(labels)
    return labels


def build_color_shapes(folder: Path, version: int) -> None:
    """``train.jsonl`` + ``train/*.png`` and ``eval.jsonl`` + ``eval/*.png`` in ``folder``."""
    for split, n, seed in (("train", TRAIN_IMAGES, 1000), ("eval", EVAL_IMAGES, 2000)):
        (folder / split).mkdir()
        rng = random.Random(seed + version)
        with open(folder / f"{split}.jsonl", "w", encoding="utf-8", newline="\n") as f:
            for i, label in enumerate(shape_labels(n, seed + version)):
                name = f"{split}/{i:05d}.png"
                draw_shape(label, rng).save(folder / name, format="PNG")
                f.write(json.dumps({"image": name, "label": label}, sort_keys=True) + "\n")


# --------------------------------------------------------------------------------------------
# Model


def dct_basis(size: int) -> torch.Tensor:
    """The ``size`` x ``size`` 2D DCT-II basis, orthonormal: ``[size * size, size, size]``, lowest
    frequencies first."""
    import math

    import torch

    n = torch.arange(size, dtype=torch.float32)
    waves = [torch.cos(math.pi * (2 * n + 1) * k / (2 * size)) for k in range(size)]
    pairs = sorted(((u, v) for u in range(size) for v in range(size)), key=lambda uv: (sum(uv), uv))
    basis = torch.stack([waves[u][:, None] * waves[v][None, :] for u, v in pairs])
    return basis / basis.flatten(1).norm(dim=1)[:, None, None]


def build_tiny_vit(folder: Path) -> None:
    import math

    import torch
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

    hidden = 64
    config = ViTConfig(
        hidden_size=hidden,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=2 * hidden,
        image_size=IMAGE_SIZE,
        patch_size=PATCH,
        num_channels=3,
        # Larger than the usual 0.02: attention starts peaked instead of uniform and the
        # activations are far from zero, so LoRA on q/k/v alone reshapes them within minutes.
        initializer_range=0.1,
        num_labels=BASE_LABELS,
        id2label={i: f"class_{i}" for i in range(BASE_LABELS)},
        label2id={f"class_{i}": i for i in range(BASE_LABELS)},
    )
    with torch.random.fork_rng(devices=[]):  # fixed weights; the caller's RNG stays untouched
        torch.manual_seed(1234)
        model = ViTForImageClassification(config)
        # The patch embedding starts as the 2D DCT of each patch's brightness (64 filters for
        # 8x8 patches: one a hidden unit), the frequency/edge filters a pretrained ViT's first
        # layer learns: edges and corners are visible to the blocks above whatever the colour,
        # and LoRA (which leaves this layer fixed) learns the shapes in a minute on a CPU.
        projection = model.vit.embeddings.patch_embeddings.projection  # Conv2d(3, hidden, PATCH)
        filters = dct_basis(PATCH)[:hidden]  # [hidden, PATCH, PATCH]
        with torch.no_grad():
            projection.weight.copy_(filters[:, None].expand(-1, 3, -1, -1) / math.sqrt(3))
            projection.bias.zero_()
    model.save_pretrained(folder, safe_serialization=True)
    ViTImageProcessor(
        do_resize=True,
        size={"height": IMAGE_SIZE, "width": IMAGE_SIZE},
        do_rescale=True,
        do_normalize=True,
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
    ).save_pretrained(folder)
