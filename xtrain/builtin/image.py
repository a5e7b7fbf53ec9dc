"""Built-in image-to-text assets, made offline and deterministically (``xtrain.builtin`` calls these).

- ``builtin:tiny-trocr``: a TrOCR-shaped ``VisionEncoderDecoderModel`` (a 2-layer ViT encoder over
  32x128 line images + a 2-layer TrOCR decoder) with a character-level tokenizer (printable
  ASCII) and a ViT image processor, saved like a hub checkpoint.
- ``builtin:ocr-lines``: synthetic printed text lines (words and numbers) rendered with PIL's
  default font as 32x128 PNGs, listed in ``train.jsonl`` / ``eval.jsonl`` with paths relative to
  the file (``{"image": "train/00000.png", "text": "red cat 42"}``): the same layout as a user's
  own CSV/JSONL of image paths, read through the same code.

The weights are random: the quickstart shows the loop learning to read, not a pretrained OCR.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import TYPE_CHECKING

from xtrain.builtin.text import fast_tokenizer

if TYPE_CHECKING:
    import torch
    from PIL import Image, ImageFont
    from transformers import PreTrainedTokenizerFast

    Font = ImageFont.ImageFont | ImageFont.FreeTypeFont

MODELS = ("tiny-trocr",)
DATASETS = ("ocr-lines",)

IMAGE_HEIGHT, IMAGE_WIDTH = 32, 120
CELL = 6  # the bitmap font's character width: one encoder patch per character cell
CHARSET = [chr(c) for c in range(32, 127)]  # printable ASCII: any line of plain text encodes
SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<unk>"]
TRAIN_LINES, EVAL_LINES = 3000, 200

_WORDS = [
    "red", "blue", "green", "black", "white", "pink", "brown", "gold",
    "cat", "dog", "bird", "fish", "frog", "duck", "bear", "fox",
    "park", "road", "hill", "lake", "farm", "shop", "town", "city",
    "tom", "mia", "sam", "ben", "anna", "max", "leo", "ella",
    "box", "hat", "cake", "book", "boat", "cup", "kite", "ball",
    "one", "two", "six", "ten", "big", "old", "new", "hot",
]  # fmt: skip


# --------------------------------------------------------------------------------------------
# Data


def _font() -> Font:
    """PIL's built-in bitmap font: monospaced (6x11 pixels a character), the same on every
    platform, no font files needed. Monospace keeps the tiny model's job small: the k-th
    character always sits near the same columns, so reading is learnt in CPU minutes."""
    from PIL import ImageFont

    legacy = getattr(ImageFont, "load_default_imagefont", None)  # Pillow >= 10.1
    return legacy() if legacy is not None else ImageFont.load_default()


def line_texts(n: int, seed: int) -> list[str]:
    """``n`` short lines of one to three words or numbers (at most 16 characters)."""
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        parts = [
            str(rng.randint(0, 999)) if rng.random() < 0.25 else rng.choice(_WORDS)
            for _ in range(rng.randint(1, 3))
        ]
        text = " ".join(parts)
        if len(text) <= 16:
            out.append(text)
    return out


def render_line(text: str, rng: random.Random, font: Font | None = None) -> Image.Image:
    """A grayscale 32x128 image of ``text``: dark ink on a light page, small random offsets."""
    from PIL import Image, ImageDraw

    font = font if font is not None else _font()
    page = 255 - rng.randint(0, 40)
    image = Image.new("L", (IMAGE_WIDTH, IMAGE_HEIGHT), page)
    draw = ImageDraw.Draw(image)
    left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
    # Left-aligned like a scanned line: the k-th character fills the k-th 6-pixel cell.
    x = -left
    y = (IMAGE_HEIGHT - (bottom - top)) // 2 - top + rng.randint(-2, 2)
    draw.text((x, y), text, font=font, fill=rng.randint(0, 70))
    return image


def build_ocr_lines(folder: Path, version: int) -> None:
    """``train.jsonl`` + ``train/*.png`` and ``eval.jsonl`` + ``eval/*.png`` in ``folder``."""
    font = _font()
    for split, n, seed in (("train", TRAIN_LINES, 1000), ("eval", EVAL_LINES, 2000)):
        (folder / split).mkdir()
        rng = random.Random(seed + version)
        rows = []
        for i, text in enumerate(line_texts(n, seed + version)):
            name = f"{split}/{i:05d}.png"
            render_line(text, rng, font).save(folder / name, format="PNG")
            rows.append({"image": name, "text": text})
        with open(folder / f"{split}.jsonl", "w", encoding="utf-8", newline="\n") as f:
            for row in rows:
                f.write(json.dumps(row, sort_keys=True) + "\n")


# --------------------------------------------------------------------------------------------
# Tokenizer and model


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character; ``</s>`` closes every label; decoding joins characters as they are."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + CHARSET)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A $B </s>", special_tokens=[("</s>", vocab["</s>"])]
    )
    return fast_tokenizer(
        tok,
        64,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
    )


def _sinusoids(length: int, dim: int) -> torch.Tensor:
    import math

    import torch

    position = torch.arange(length, dtype=torch.float32)[:, None]
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(100.0) / dim))
    out = torch.zeros(length, dim)
    out[:, 0::2] = torch.sin(position * freq)
    out[:, 1::2] = torch.cos(position * freq)
    return out


def build_tiny_trocr(folder: Path) -> None:
    import torch
    from transformers import (
        TrOCRConfig,
        VisionEncoderDecoderConfig,
        VisionEncoderDecoderModel,
        ViTConfig,
        ViTImageProcessor,
    )

    tokenizer = build_char_tokenizer()
    hidden = 128
    encoder = ViTConfig(
        hidden_size=hidden,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=2 * hidden,
        image_size=(IMAGE_HEIGHT, IMAGE_WIDTH),
        patch_size=(IMAGE_HEIGHT, CELL),  # one patch per character cell: 20 patches a line
        num_channels=3,
        initializer_range=0.1,
    )
    decoder = TrOCRConfig(
        vocab_size=len(tokenizer),
        d_model=hidden,
        decoder_layers=2,
        decoder_attention_heads=4,
        decoder_ffn_dim=2 * hidden,
        max_position_embeddings=64,
        cross_attention_hidden_size=hidden,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.bos_token_id,
        tie_word_embeddings=False,
        # Larger than the usual 0.02: cross-attention starts peaked instead of uniform, so the
        # decoder learns where to look within minutes (its q/k gradients are ~0 when uniform).
        init_std=0.1,
    )
    config = VisionEncoderDecoderConfig.from_encoder_decoder_configs(encoder, decoder)
    config.decoder_start_token_id = tokenizer.bos_token_id
    config.pad_token_id = tokenizer.pad_token_id
    config.eos_token_id = tokenizer.eos_token_id
    with torch.random.fork_rng(devices=[]):  # fixed weights; the caller's RNG stays untouched
        torch.manual_seed(1234)
        model = VisionEncoderDecoderModel(config=config)
        # The same sinusoidal table for patch positions and decoder positions (learned from
        # there): the decoder's cross-attention starts out knowing that character k sits in
        # patch k, and reading is learnt in CPU minutes instead of hours.
        patches = model.encoder.embeddings.position_embeddings  # [1, 1 + patches, hidden]
        steps = model.decoder.model.decoder.embed_positions.weight  # [2 + positions, hidden]
        with torch.no_grad():
            patches[0, 1:].copy_(0.3 * _sinusoids(patches.shape[1] - 1, hidden))
            steps[2:].copy_(0.3 * _sinusoids(steps.shape[0] - 2, hidden))  # TrOCR's offset of 2
    model.generation_config.decoder_start_token_id = tokenizer.bos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    ViTImageProcessor(
        size={"height": IMAGE_HEIGHT, "width": IMAGE_WIDTH},
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
    ).save_pretrained(folder)
