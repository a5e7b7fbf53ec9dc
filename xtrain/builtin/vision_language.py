"""Built-in vision-language assets, made offline and deterministically (``xtrain.builtin`` calls these).

- ``builtin:tiny-qwen2-vl``: a ``Qwen2VLForConditionalGeneration`` shaped like Qwen2-VL (a 2-block
  vision tower with 14-pixel patches and a 2x2 merger, a 2-layer Qwen2 language model, hidden 64)
  with a byte-level BPE tokenizer holding Qwen2-VL's special tokens (``<|im_start|>``,
  ``<|im_end|>``, ``<|vision_start|>``, ``<|image_pad|>``, ...), Qwen2-VL's own chat template, and
  a ``Qwen2VLProcessor`` saved next to them, so ``AutoProcessor`` loads it from the folder
  like a hub checkpoint. A 56x56 image becomes 4x4 patches, merged into 4 image tokens.
- ``builtin:shapes-vqa``: 56x56 PNG images of one coloured shape (circle, square, triangle,
  diamond in six colours, random size and position) with one question each ("what colour is the
  square?", "what shape is this?") and a one-word answer, as ``messages`` conversations in
  ``train.jsonl`` / ``eval.jsonl`` with image paths relative to the file: the same layout as a
  user's own chat data, read through the same code.
- ``builtin:shapes-preference``: preference pairs on the same kind of images (TRL's vision DPO
  shape: an image part and a question in the prompt): the chosen answer a whole sentence that
  answers right ("the square is red."), the rejected one a curt, wrong word ("blue."), for
  vision-preference.

The weights are random: the quickstart shows the loop learning to answer, not a pretrained VLM.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xtrain.builtin.text import byte_level_bpe, fast_tokenizer, story_examples

if TYPE_CHECKING:
    from collections.abc import Callable

    from PIL import Image
    from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

IMAGE_SIZE = 56  # pixels a side: 4x4 patches of 14, merged 2x2 into 4 image tokens
PATCH, MERGE, TEMPORAL = 14, 2, 2
TRAIN_ROWS, EVAL_ROWS = 2000, 200
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "green": (30, 170, 40),
    "blue": (30, 60, 220),
    "yellow": (235, 210, 20),
    "purple": (140, 40, 180),
    "orange": (245, 130, 20),
}
SHAPES = ("circle", "square", "triangle", "diamond")
SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
]  # fmt: skip
SYSTEM_PROMPT = "You are a helpful assistant."
# Qwen2-VL-Instruct's chat template, as published with the checkpoints.
CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
    "{{ message['content'] }}<|im_end|>\n{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture "
    "{{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}Video "
    "{{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


# --------------------------------------------------------------------------------------------
# Data


def _polygon(shape: str, cx: float, cy: float, r: float) -> list[tuple[float, float]]:
    if shape == "square":
        return [(cx - r, cy - r), (cx + r, cy - r), (cx + r, cy + r), (cx - r, cy + r)]
    if shape == "triangle":
        return [(cx, cy - r), (cx + r, cy + r * 0.8), (cx - r, cy + r * 0.8)]
    return [(cx, cy - r), (cx + r, cy), (cx, cy + r), (cx - r, cy)]  # diamond


def draw_shape(shape: str, colour: str, rng: random.Random) -> Image.Image:
    """A 56x56 RGB image: one filled shape on a light, slightly tinted background."""
    from PIL import Image, ImageDraw

    page = tuple(255 - rng.randint(0, 30) for _ in range(3))
    image = Image.new("RGB", (IMAGE_SIZE, IMAGE_SIZE), page)
    draw = ImageDraw.Draw(image)
    r = rng.uniform(14, 22)
    cx = IMAGE_SIZE / 2 + rng.uniform(-4, 4)
    cy = IMAGE_SIZE / 2 + rng.uniform(-4, 4)
    fill = tuple(max(0, min(255, c + rng.randint(-15, 15))) for c in COLOURS[colour])
    if shape == "circle":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fill)
    else:
        draw.polygon(_polygon(shape, cx, cy, r), fill=fill)
    return image


QUESTIONS = {
    "colour": ["what colour is the {shape}?", "what colour is this shape?", "which colour is it?"],
    "shape": ["what shape is this?", "what shape is the {colour} one?", "name the shape."],
}


def conversation(image: str, shape: str, colour: str, rng: random.Random) -> dict[str, Any]:
    """One ``messages`` row: the image and a question from the user, a one-word answer."""
    kind = rng.choice(("colour", "shape"))
    question = rng.choice(QUESTIONS[kind]).format(shape=shape, colour=colour)
    answer = colour if kind == "colour" else shape
    return {
        "messages": [
            {
                "role": "user",
                "content": [{"type": "image", "image": image}, {"type": "text", "text": question}],
            },
            {"role": "assistant", "content": answer},
        ]
    }


def build_shapes_vqa(folder: Path, version: int) -> None:
    """``train.jsonl`` + ``train/*.png`` and ``eval.jsonl`` + ``eval/*.png`` in ``folder``."""
    _write_splits(folder, version, (("train", TRAIN_ROWS, 1000), ("eval", EVAL_ROWS, 2000)), conversation)


def _write_splits(
    folder: Path,
    version: int,
    splits: tuple[tuple[str, int, int], ...],
    row: Callable[[str, str, str, random.Random], dict[str, Any]],
) -> None:
    """Each ``(split, rows, seed)``: ``split/*.png`` images of random shapes and ``split.jsonl``,
    a ``row(image, shape, colour, rng)`` each."""
    for split, n, seed in splits:
        (folder / split).mkdir()
        rng = random.Random(seed + version)
        with open(folder / f"{split}.jsonl", "w", encoding="utf-8", newline="\n") as f:
            for i in range(n):
                shape, colour = rng.choice(SHAPES), rng.choice(list(COLOURS))
                name = f"{split}/{i:05d}.png"
                draw_shape(shape, colour, rng).save(folder / name, format="PNG")
                f.write(json.dumps(row(name, shape, colour, rng), sort_keys=True) + "\n")


PREFERENCE_TRAIN_ROWS, PREFERENCE_EVAL_ROWS = 320, 80


def preference_pair(image: str, shape: str, colour: str, rng: random.Random) -> dict[str, Any]:
    """One ``{prompt, chosen, rejected}`` row: the image and a question, a whole right sentence
    chosen over a curt wrong word (one style preferred throughout: DPO learns it from ~0.5)."""
    kind = rng.choice(("colour", "shape"))
    question = rng.choice(QUESTIONS[kind]).format(shape=shape, colour=colour)
    if kind == "colour":
        chosen = f"the {shape} is {colour}."
        rejected = rng.choice([c for c in COLOURS if c != colour]) + "."
    else:
        chosen = f"it is a {colour} {shape}."
        rejected = rng.choice([s for s in SHAPES if s != shape]) + "."
    content = [{"type": "image", "image": image}, {"type": "text", "text": question}]
    return {"prompt": [{"role": "user", "content": content}], "chosen": chosen, "rejected": rejected}


def build_shapes_preference(folder: Path, version: int) -> None:
    """``train.jsonl`` + ``train/*.png`` and ``eval.jsonl`` + ``eval/*.png`` of preference pairs."""
    splits = (("train", PREFERENCE_TRAIN_ROWS, 3000), ("eval", PREFERENCE_EVAL_ROWS, 4000))
    _write_splits(folder, version, splits, preference_pair)


# --------------------------------------------------------------------------------------------
# Tokenizer, processor and model


def _corpus() -> list[str]:
    texts = [SYSTEM_PROMPT, "user", "assistant", "system", *SHAPES, *COLOURS] * 20  # whole-word merges
    for kind in QUESTIONS.values():
        for q in kind:
            texts += [q.format(shape=s, colour=c) for s in SHAPES for c in COLOURS]
    texts += [r["text"] for r in story_examples(500, 7)]  # some general text
    return texts


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level BPE (any text encodes) trained in-process, with Qwen2-VL's special tokens."""
    tok = byte_level_bpe(_corpus(), 600, SPECIAL_TOKENS)

    return fast_tokenizer(
        tok,
        1024,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
    )


def save_processor(tokenizer: PreTrainedTokenizerBase, folder: Path) -> None:
    """The files of a ``Qwen2VLProcessor`` as a hub checkpoint has them: the image processor's
    ``preprocessor_config.json``, the tokenizer with ``chat_template.jinja``, and
    ``processor_config.json`` naming the processor class. (Written piece by piece: building a
    ``Qwen2VLProcessor`` object needs torchvision for its video half, which xtrain does not.)"""
    from transformers import Qwen2VLImageProcessorPil

    pixels = IMAGE_SIZE * IMAGE_SIZE
    Qwen2VLImageProcessorPil(
        patch_size=PATCH,
        merge_size=MERGE,
        temporal_patch_size=TEMPORAL,
        min_pixels=pixels,
        max_pixels=4 * pixels,
    ).save_pretrained(folder)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    (folder / "processor_config.json").write_text(
        json.dumps({"processor_class": "Qwen2VLProcessor"}, indent=2) + "\n", encoding="utf-8"
    )


def build_tiny_qwen2_vl(folder: Path) -> None:
    import torch
    from transformers import GenerationConfig, Qwen2VLConfig, Qwen2VLForConditionalGeneration

    tokenizer = build_tokenizer()
    ids = tokenizer.convert_tokens_to_ids
    hidden, heads = 64, 4
    head_dim = hidden // heads
    # M-RoPE splits each head's rotary half (8) into temporal/height/width sections.
    section = [head_dim // 2 - 2 * (head_dim // 6), head_dim // 6, head_dim // 6]
    config = Qwen2VLConfig(
        text_config={
            "vocab_size": len(tokenizer),
            "hidden_size": hidden,
            "intermediate_size": 2 * hidden,
            "num_hidden_layers": 2,
            "num_attention_heads": heads,
            "num_key_value_heads": 2,
            "max_position_embeddings": 1024,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": section},
            "initializer_range": 0.1,  # logits large enough for LoRA alone to make confident predictions
            "bos_token_id": None,
            "eos_token_id": ids("<|im_end|>"),
            "pad_token_id": tokenizer.pad_token_id,
            "tie_word_embeddings": False,
        },
        vision_config={
            "depth": 2,
            "embed_dim": hidden,
            "hidden_size": hidden,  # the merger's output: the language model's width
            "num_heads": heads,
            "mlp_ratio": 2,
            "patch_size": PATCH,
            "spatial_merge_size": MERGE,
            "temporal_patch_size": TEMPORAL,
            "initializer_range": 0.1,
        },
        image_token_id=ids("<|image_pad|>"),
        video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"),
        vision_end_token_id=ids("<|vision_end|>"),
        tie_word_embeddings=False,
    )
    with torch.random.fork_rng(devices=[]):  # fixed weights; the caller's RNG stays untouched
        torch.manual_seed(1234)
        model = Qwen2VLForConditionalGeneration(config)
    model.generation_config = GenerationConfig(
        eos_token_id=[ids("<|im_end|>"), ids("<|endoftext|>")],
        pad_token_id=tokenizer.pad_token_id,
        do_sample=False,
    )
    model.save_pretrained(folder, safe_serialization=True)
    save_processor(tokenizer, folder)


def tokens_per_image(height: int = IMAGE_SIZE, width: int = IMAGE_SIZE) -> int:
    """Image tokens the built-in processor makes of a ``height`` x ``width`` image (no resize)."""
    return math.ceil(height / PATCH) * math.ceil(width / PATCH) // (MERGE * MERGE)
