"""Built-in tiny models, tokenizers and data sets, made offline and deterministically.

Everything here is *written to a folder* and then loaded through the same code path as a real
checkpoint or data file (``from_pretrained``, ``load_dataset("json", ...)``), so the quickstart
exercises exactly what a user's own model and data go through.

Names (used as ``model.name_or_path`` / ``data.train`` / ``data.eval``):

- ``builtin:tiny-llama``: a 2-layer llama-style causal LM (hidden 64, 4 heads).
- ``builtin:tiny-bert``: a 2-layer BERT encoder for sequence classification (hidden 64, 4 heads).
- ``builtin:sentiment``: synthetic labelled sentences (``text``, ``label`` = positive/negative).
- ``builtin:tiny-stories``: synthetic short stories (``text``) for causal LM.
- ``builtin:tiny-trocr`` / ``builtin:ocr-lines``: a tiny OCR model and rendered text lines for
  image-to-text (``xtrain.builtin.image``).
- ``builtin:tiny-whisper`` / ``builtin:spoken-words``: a tiny Whisper model and synthetic
  tone-sequence "speech" for speech-to-text (``xtrain.builtin.audio``).
- ``builtin:tiny-qwen2-vl`` / ``builtin:shapes-vqa``: a tiny Qwen2-VL model with its processor and
  questions about coloured shapes for vision-language (``xtrain.builtin.vision_language``).
- ``builtin:tiny-vit`` / ``builtin:color-shapes``: a tiny ViT image classifier with its image
  processor and images of coloured shapes labelled by shape, for image classification
  (``xtrain.builtin.image_classes``).

The folders live under ``$XTRAIN_CACHE/builtin`` (default ``~/.cache/xtrain/builtin``). A build
goes to a temporary folder that is renamed into place only when complete, so processes that
race to build the same asset are safe: one rename wins, the others use the winner's folder.
"""

from __future__ import annotations

import difflib
import json
import os
import random
import shutil
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from xtrain.errors import XtrainError

PREFIX = "builtin:"
# Bump when a generator changes: stale folders are rebuilt instead of silently reused.
VERSION = 3
MARKER = "xtrain_builtin.json"

MODELS = ("tiny-llama", "tiny-bert", "tiny-trocr", "tiny-whisper", "tiny-qwen2-vl", "tiny-vit")
DATASETS = ("sentiment", "tiny-stories", "ocr-lines", "spoken-words", "shapes-vqa", "color-shapes")
IMAGE_ASSETS = ("tiny-trocr", "ocr-lines")  # built by xtrain.builtin.image
IMAGE_CLASS_ASSETS = ("tiny-vit", "color-shapes")  # built by xtrain.builtin.image_classes
AUDIO_ASSETS = ("tiny-whisper", "spoken-words")  # built by xtrain.builtin.audio
VL_ASSETS = ("tiny-qwen2-vl", "shapes-vqa")  # built by xtrain.builtin.vision_language

SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<unk>", "<mask>"]


def is_builtin(name: str | None) -> bool:
    return isinstance(name, str) and name.startswith(PREFIX)


def strip_prefix(name: str) -> str:
    return name[len(PREFIX) :] if name.startswith(PREFIX) else name


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """``cache_dir`` if given, else ``$XTRAIN_CACHE/builtin``, else ``~/.cache/xtrain/builtin``."""
    if cache_dir is not None:
        return Path(cache_dir)
    base = os.environ.get("XTRAIN_CACHE")
    return (Path(base) if base else Path.home() / ".cache" / "xtrain") / "builtin"


def _check_name(name: str, known: tuple[str, ...], kind: str) -> str:
    short = strip_prefix(name)
    if short not in known:
        close = difflib.get_close_matches(short, known, n=1)
        hint = f"did you mean 'builtin:{close[0]}'?" if close else None
        names = ", ".join(f"builtin:{k}" for k in known)
        raise XtrainError(f"unknown built-in {kind} '{name}' (built-in {kind}s: {names})", hint)
    return short


# --------------------------------------------------------------------------------------------
# Atomic folder builds


def _is_complete(folder: Path) -> bool:
    try:
        marker = json.loads((folder / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return marker.get("version") == VERSION


def _build_atomically(final: Path, build: Callable[[Path], None], name: str) -> Path:
    """Run ``build(tmp)`` into a fresh temporary folder next to ``final``, then rename it in."""
    if _is_complete(final):
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".tmp-{final.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        build(tmp)
        (tmp / MARKER).write_text(json.dumps({"name": name, "version": VERSION}), encoding="utf-8")
        if final.exists() and not _is_complete(final):
            # A stale version (or a leftover from an old crash): move it aside, then replace it.
            stale = final.parent / f".stale-{final.name}-{uuid.uuid4().hex[:8]}"
            try:
                os.rename(final, stale)
                shutil.rmtree(stale, ignore_errors=True)
            except OSError:
                pass  # another process moved it first
        try:
            os.rename(tmp, final)
        except OSError:
            # Another process renamed its build into place first; use that one.
            if not _is_complete(final):
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


# --------------------------------------------------------------------------------------------
# Data: deterministic generators


_SUBJECTS = [
    "the movie", "this film", "the food", "the service", "the book", "the hotel", "our trip",
    "the concert", "the game", "this phone", "the show", "the class", "the museum", "the coffee",
    "the album", "the room", "the staff", "the ending", "the park", "this song",
]  # fmt: skip
_POSITIVE = [
    "great", "wonderful", "excellent", "amazing", "lovely", "fantastic", "delightful", "superb",
    "brilliant", "enjoyable", "charming", "perfect", "pleasant", "beautiful", "fun", "good",
]  # fmt: skip
_NEGATIVE = [
    "terrible", "awful", "boring", "horrible", "dreadful", "disappointing", "poor", "dull", "bad",
    "annoying", "mediocre", "painful", "ugly", "rude", "bland", "sad",
]  # fmt: skip
_ADVERBS = ["really", "very", "quite", "truly", "so", "rather", "pretty", "absolutely"]
_FILLERS = [
    "we went there on a tuesday", "it was raining outside", "my friend came along",
    "i had heard a lot about it", "we stayed for two hours", "it was my first time",
    "the tickets were cheap", "we arrived a bit late", "it was a long week",
]  # fmt: skip
_SENTIMENT_TEMPLATES = [
    "{s} was {a}.",
    "i thought {s} was {v} {a}.",
    "honestly, {s} was {a}.",
    "{f}, and {s} was {a}.",
    "{s} felt {v} {a} to me.",
    "we found {s} {a}.",
    "everyone agreed that {s} was {a}.",
    "{s} was {a} and {a2}.",
    "{f}. {s} was {v} {a}.",
    "in the end {s} was {a}.",
]


def sentiment_examples(n: int, seed: int) -> list[dict[str, str]]:
    """Short reviews whose label follows the sentiment words they contain."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        label = rng.choice(["positive", "negative"])
        words = _POSITIVE if label == "positive" else _NEGATIVE
        a, a2 = rng.sample(words, 2)
        text = rng.choice(_SENTIMENT_TEMPLATES).format(
            s=rng.choice(_SUBJECTS), a=a, a2=a2, v=rng.choice(_ADVERBS), f=rng.choice(_FILLERS)
        )
        out.append({"text": text, "label": label})
    return out


_NAMES = ["tom", "lily", "sam", "mia", "ben", "anna", "max", "sue", "leo", "ella"]
_ANIMALS = ["cat", "dog", "bird", "fish", "rabbit", "frog", "duck", "bear"]
_COLORS = ["red", "blue", "green", "yellow", "brown", "white", "black", "pink"]
_PLACES = ["park", "garden", "forest", "river", "house", "school", "beach", "hill"]
_THINGS = ["ball", "kite", "box", "hat", "cake", "book", "boat", "cup"]
_FEELINGS = ["happy", "glad", "sleepy", "hungry", "proud", "excited"]


def story_examples(n: int, seed: int) -> list[dict[str, str]]:
    """Tiny stories with a fixed plot and varying names, so a small LM can learn them fast."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        name, animal, color = rng.choice(_NAMES), rng.choice(_ANIMALS), rng.choice(_COLORS)
        place, thing, feel = rng.choice(_PLACES), rng.choice(_THINGS), rng.choice(_FEELINGS)
        friend = rng.choice([x for x in _NAMES if x != name])
        text = (
            f"once upon a time there was a {color} {animal} named {name}. "
            f"{name} liked to play in the {place}. "
            f"one day {name} found a {thing} in the {place}. "
            f"{name} gave the {thing} to {friend}. "
            f"{friend} was very {feel}, and they were friends forever."
        )
        out.append({"text": text})
    return out


# name -> (generator, train size, eval size)
_DATA_SPECS: dict[str, tuple[Callable[[int, int], list[dict[str, str]]], int, int]] = {
    "sentiment": (sentiment_examples, 4000, 500),
    "tiny-stories": (story_examples, 2000, 200),
}


def _write_jsonl(path: Path, rows: list[dict[str, str]]) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for row in rows:
            f.write(json.dumps(row, sort_keys=True) + "\n")


def ensure_builtin_data(name: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """Write a built-in data set once; returns its folder holding ``train.jsonl`` and ``eval.jsonl``."""
    short = _check_name(name, DATASETS, "data set")
    if short in IMAGE_ASSETS:
        from xtrain.builtin import image as builtin_image

        final = cache_root(cache_dir) / "data" / short
        return _build_atomically(
            final, lambda tmp: builtin_image.build_ocr_lines(tmp, VERSION), PREFIX + short
        )
    if short in AUDIO_ASSETS:
        from xtrain.builtin import audio as builtin_audio

        final = cache_root(cache_dir) / "data" / short
        return _build_atomically(
            final, lambda tmp: builtin_audio.build_spoken_words(tmp, VERSION), PREFIX + short
        )
    if short in VL_ASSETS:
        from xtrain.builtin import vision_language as builtin_vl

        final = cache_root(cache_dir) / "data" / short
        return _build_atomically(final, lambda tmp: builtin_vl.build_shapes_vqa(tmp, VERSION), PREFIX + short)
    if short in IMAGE_CLASS_ASSETS:
        from xtrain.builtin import image_classes as builtin_classes

        final = cache_root(cache_dir) / "data" / short
        return _build_atomically(
            final, lambda tmp: builtin_classes.build_color_shapes(tmp, VERSION), PREFIX + short
        )
    gen, n_train, n_eval = _DATA_SPECS[short]

    def build(tmp: Path) -> None:
        # Different seeds per split: eval sentences are fresh draws, not copies of training ones.
        _write_jsonl(tmp / "train.jsonl", gen(n_train, 1000 + VERSION))
        _write_jsonl(tmp / "eval.jsonl", gen(n_eval, 2000 + VERSION))

    return _build_atomically(cache_root(cache_dir) / "data" / short, build, PREFIX + short)


def builtin_data_file(name: str, split: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """The jsonl file of one split ("train" or "eval") of a built-in data set."""
    if split not in ("train", "eval"):
        raise XtrainError(f"unknown split '{split}' of {name} (splits: train, eval)")
    return ensure_builtin_data(name, cache_dir) / f"{split}.jsonl"


# --------------------------------------------------------------------------------------------
# Tokenizer and models


def _corpus() -> list[str]:
    texts = [r["text"] for r in sentiment_examples(2000, 7)]
    texts += [r["text"] for r in story_examples(1000, 7)]
    return texts


def build_tokenizer(kind: str):
    """A byte-level BPE tokenizer trained in-process on the built-in corpus (any text encodes).

    ``kind`` "bert" adds ``<s> A </s> [B </s>]`` with token type ids; "llama" adds ``<s>`` only.
    """
    from tokenizers import processors

    tok = byte_level_bpe(_corpus(), 1000, SPECIAL_TOKENS, unk_token="<unk>")
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    if kind == "bert":
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A </s>",
            pair="<s> $A </s> $B:1 </s>:1",
            special_tokens=[("<s>", bos), ("</s>", eos)],
        )
        extra = {
            "cls_token": "<s>",
            "sep_token": "</s>",
            "mask_token": "<mask>",
            "model_input_names": ["input_ids", "token_type_ids", "attention_mask"],
        }
    else:
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", bos)]
        )
        extra = {"model_input_names": ["input_ids", "attention_mask"]}
    return fast_tokenizer(
        tok, 512, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>", **extra
    )


def byte_level_bpe(
    corpus: Iterable[str], vocab_size: int, special_tokens: list[str], unk_token: str | None = None
) -> Any:
    """A ``tokenizers`` byte-level BPE trained in-process on ``corpus`` (any text encodes: the
    byte alphabet is always in the vocabulary), ``special_tokens`` first."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=unk_token) if unk_token else models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    return tok


def fast_tokenizer(tok: Any, model_max_length: int, **special: Any) -> Any:
    """A transformers fast tokenizer over a ``tokenizers`` one, padding on the right; ``special``:
    its special tokens (and ``model_input_names``, default input ids and attention mask)."""
    from transformers import PreTrainedTokenizerFast

    special.setdefault("model_input_names", ["input_ids", "attention_mask"])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, model_max_length=model_max_length, padding_side="right", **special
    )


def _build_model(short: str, folder: Path) -> None:
    import torch
    from transformers import BertConfig, BertModel, LlamaConfig, LlamaForCausalLM

    kind = "bert" if short == "tiny-bert" else "llama"
    tokenizer = build_tokenizer(kind)
    ids = {
        "vocab_size": len(tokenizer),
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
    }
    with torch.random.fork_rng(devices=[]):  # fixed weights, and the caller's RNG stays untouched
        torch.manual_seed(1234)
        if kind == "bert":
            config = BertConfig(
                hidden_size=64,
                num_hidden_layers=2,
                num_attention_heads=4,
                intermediate_size=128,
                max_position_embeddings=512,
                type_vocab_size=2,
                **ids,
            )
            model = BertModel(config, add_pooling_layer=True)
        else:
            config = LlamaConfig(
                hidden_size=64,
                intermediate_size=128,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                max_position_embeddings=512,
                tie_word_embeddings=False,
                initializer_range=0.1,  # logits large enough for LoRA alone to make confident predictions
                **ids,
            )
            model = LlamaForCausalLM(config)
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)


def ensure_builtin_model(name: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """Build a built-in model + tokenizer once; returns the folder ``from_pretrained`` loads."""
    short = _check_name(name, MODELS, "model")
    final = cache_root(cache_dir) / short
    if short in IMAGE_ASSETS:
        from xtrain.builtin import image as builtin_image

        return _build_atomically(final, builtin_image.build_tiny_trocr, PREFIX + short)
    if short in AUDIO_ASSETS:
        from xtrain.builtin import audio as builtin_audio

        return _build_atomically(final, builtin_audio.build_tiny_whisper, PREFIX + short)
    if short in VL_ASSETS:
        from xtrain.builtin import vision_language as builtin_vl

        return _build_atomically(final, builtin_vl.build_tiny_qwen2_vl, PREFIX + short)
    if short in IMAGE_CLASS_ASSETS:
        from xtrain.builtin import image_classes as builtin_classes

        return _build_atomically(final, builtin_classes.build_tiny_vit, PREFIX + short)
    return _build_atomically(final, lambda tmp: _build_model(short, tmp), PREFIX + short)
