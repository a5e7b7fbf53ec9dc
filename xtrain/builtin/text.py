"""The built-ins' text: deterministic sentiment reviews and short stories (the built-in data sets
and every tokenizer's corpus) and the tokenizers trained on them offline (WordPiece for BERT-style
models, byte-level BPE for the others), each a pure function of its arguments."""

from __future__ import annotations

import random
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tokenizers import Tokenizer
    from transformers import LlamaConfig, PreTrainedTokenizerFast

SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<unk>", "<mask>"]


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
) -> Tokenizer:
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


def fast_tokenizer(tok: Tokenizer, model_max_length: int, **special: Any) -> PreTrainedTokenizerFast:
    """A transformers fast tokenizer over a ``tokenizers`` one, padding on the right; ``special``:
    its special tokens (and ``model_input_names``, default input ids and attention mask)."""
    from transformers import PreTrainedTokenizerFast

    special.setdefault("model_input_names", ["input_ids", "attention_mask"])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, model_max_length=model_max_length, padding_side="right", **special
    )


def tiny_llama_config(**overrides: object) -> LlamaConfig:
    """The built-in tiny llamas' shape (2 layers, hidden 64, 4 heads, 2 key/value heads), untied,
    initialised wide enough (0.1) that LoRA alone makes confident predictions; ``overrides`` set the
    positions and the tokenizer's ids."""
    from transformers import LlamaConfig

    shape = {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "tie_word_embeddings": False,
        "initializer_range": 0.1,
    }
    return LlamaConfig(**{**shape, **overrides})
