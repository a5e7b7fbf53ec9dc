"""The byte-level BPE trainer the built-in text models share (any text encodes, no download)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def train_byte_level_bpe(
    corpus: Iterable[str], vocab_size: int, special_tokens: list[str], unk_token: str | None = None
) -> Any:
    """A ``tokenizers.Tokenizer`` trained in-process on ``corpus``: byte-level pre-tokenizer and
    decoder, the byte alphabet always in the vocabulary, ``special_tokens`` first."""
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
