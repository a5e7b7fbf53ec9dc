"""Built-in speech-to-text assets, made offline and deterministically (``xtrain.builtin`` calls these).

- ``builtin:tiny-whisper``: a ``WhisperForConditionalGeneration`` (2 encoder + 2 decoder layers,
  hidden 128, 40 mel bins over a 1-second window) with a character-level tokenizer written
  like Whisper's (``<|startoftranscript|>`` text ``<|endoftext|>``) and a
  ``WhisperFeatureExtractor``, saved like a hub checkpoint.
- ``builtin:spoken-words``: synthetic "speech": each word of a 16-word vocabulary is its own
  sequence of three tones (slightly detuned, gliding, with noise), a clip says one to three
  words. Written as 8 kHz mono WAV files (resampled to 16 kHz when read, as a user's 8 kHz
  telephone audio would be) listed in ``train.jsonl`` / ``eval.jsonl`` with paths relative to
  the file (``{"audio": "train/00000.wav", "text": "left seven"}``): the same layout as a user's
  own CSV/JSONL of audio paths, read through the same code.

The weights are random: the quickstart shows the loop learning to transcribe, not a pretrained ASR.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import TYPE_CHECKING

from xtrain.builtin.text import fast_tokenizer

if TYPE_CHECKING:
    import numpy as np
    import torch
    from transformers import PreTrainedTokenizerFast

MODELS = ("tiny-whisper",)
DATASETS = ("spoken-words",)

SAMPLING_RATE = 16000  # the feature extractor's rate (Whisper's)
FILE_RATE = 8000  # the clips' rate on disk
WINDOW_SECONDS = 1  # the model's input window (Whisper's is 30)
CHARSET = [chr(c) for c in range(32, 127)]  # printable ASCII: any plain transcript encodes
SPECIAL_TOKENS = ["<|endoftext|>", "<|startoftranscript|>", "<|unk|>"]
TRAIN_CLIPS, EVAL_CLIPS = 2000, 200
# Four letters each: with the space, character k of a transcript belongs to word k // 5, so the
# decoder's position table can start out pointing at that word's time slot (see build_tiny_whisper).
WORDS = [
    "zero", "four", "five", "nine", "stop", "left", "down", "back",
    "open", "shut", "play", "next", "kite", "blue", "tree", "moon",
]  # fmt: skip
TONE_S, GAP_S = 0.07, 0.05  # three tones a word, a gap after it: 0.26 s a word
FREQUENCIES = [350.0 * 2 ** (k / 2.5) for k in range(8)]  # 350 Hz .. 2.4 kHz, well apart


# --------------------------------------------------------------------------------------------
# Data


def word_codes() -> dict[str, tuple[int, int, int]]:
    """Each word -> three distinct frequency indices, all words different (fixed by the seed)."""
    rng = random.Random(77)
    codes: dict[str, tuple[int, int, int]] = {}
    used: set[tuple[int, int, int]] = set()
    for word in WORDS:
        while True:
            code = tuple(rng.sample(range(len(FREQUENCIES)), 3))
            if code not in used:
                used.add(code)  # type: ignore[arg-type]
                codes[word] = code  # type: ignore[assignment]
                break
    return codes


def clip_texts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 3))) for _ in range(n)]


def synthesize(text: str, rng: random.Random, rate: int = FILE_RATE) -> np.ndarray:
    """A float32 mono clip of ``text`` at ``rate``: per word three tones (each detuned by up to
    3 % and gliding by up to 5 %, with a smooth envelope), a short gap, and noise throughout."""
    import numpy as np

    codes = word_codes()
    tone = int(TONE_S * rate)
    pieces = [np.zeros(int(rng.uniform(0.0, 0.04) * rate), dtype=np.float64)]
    t = np.arange(tone) / rate
    envelope = np.sin(np.pi * np.arange(tone) / tone) ** 0.5
    for word in text.split():
        for k in codes[word]:
            f0 = FREQUENCIES[k] * rng.uniform(0.97, 1.03)
            f1 = f0 * rng.uniform(0.95, 1.05)
            phase = 2 * math.pi * (f0 * t + (f1 - f0) * t * t / (2 * TONE_S))  # linear chirp f0 -> f1
            pieces.append(rng.uniform(0.3, 0.6) * envelope * np.sin(phase))
        pieces.append(np.zeros(int(GAP_S * rate)))
    clip = np.concatenate(pieces)
    noise = np.random.default_rng(rng.randrange(2**32)).normal(0.0, 0.03, clip.shape)
    return (clip + noise).astype(np.float32)


def build_spoken_words(folder: Path, version: int) -> None:
    """``train.jsonl`` + ``train/*.wav`` and ``eval.jsonl`` + ``eval/*.wav`` in ``folder``."""
    import soundfile

    for split, n, seed in (("train", TRAIN_CLIPS, 1000), ("eval", EVAL_CLIPS, 2000)):
        (folder / split).mkdir()
        rng = random.Random(seed + version)
        rows = []
        for i, text in enumerate(clip_texts(n, seed + version)):
            name = f"{split}/{i:05d}.wav"
            soundfile.write(folder / name, synthesize(text, rng), FILE_RATE, subtype="PCM_16")
            rows.append({"audio": name, "text": text})
        with open(folder / f"{split}.jsonl", "w", encoding="utf-8", newline="\n") as f:
            for row in rows:
                f.write(json.dumps(row, sort_keys=True) + "\n")


# --------------------------------------------------------------------------------------------
# Tokenizer and model


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character, framed like Whisper's: ``<|startoftranscript|> $A <|endoftext|>``
    (the task strips the start token from labels, as it does for a real Whisper tokenizer)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + CHARSET)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|unk|>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    start, end = "<|startoftranscript|>", "<|endoftext|>"
    tok.post_processor = processors.TemplateProcessing(
        single=f"{start} $A {end}",
        pair=f"{start} $A $B {end}",
        special_tokens=[(start, vocab[start]), (end, vocab[end])],
    )
    return fast_tokenizer(
        tok,
        64,
        bos_token=start,
        eos_token=end,
        pad_token=end,  # as Whisper: labels are padded with -100 anyway
        unk_token="<|unk|>",
    )


def _sinusoids(length: int, dim: int) -> torch.Tensor:
    """Whisper's own encoder position table (``transformers``' ``sinusoids``)."""
    import torch

    scales = torch.exp(-math.log(10000) / (dim // 2 - 1) * torch.arange(dim // 2))
    times = torch.arange(length)[:, None] * scales[None, :]
    return torch.cat([times.sin(), times.cos()], dim=1)


def build_tiny_whisper(folder: Path) -> None:
    import torch
    from transformers import WhisperConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration

    tokenizer = build_char_tokenizer()
    hop = 160
    frames = WINDOW_SECONDS * SAMPLING_RATE // hop  # 100 mel frames; the encoder halves them
    hidden = 128
    start, end = tokenizer.bos_token_id, tokenizer.eos_token_id
    config = WhisperConfig(
        vocab_size=len(tokenizer),
        num_mel_bins=40,
        encoder_layers=2,
        encoder_attention_heads=4,
        decoder_layers=2,
        decoder_attention_heads=4,
        encoder_ffn_dim=2 * hidden,
        decoder_ffn_dim=2 * hidden,
        d_model=hidden,
        max_source_positions=frames // 2,
        max_target_positions=64,
        pad_token_id=end,
        bos_token_id=end,
        eos_token_id=end,
        decoder_start_token_id=start,
        suppress_tokens=None,  # Whisper's defaults name ids of its 51k vocabulary
        begin_suppress_tokens=None,
        # Larger than Whisper's 0.02: attention starts peaked instead of uniform (its q/k
        # gradients are ~0 when uniform), as for the built-in OCR model.
        init_std=0.1,
    )
    with torch.random.fork_rng(devices=[]):  # fixed weights; the caller's RNG stays untouched
        torch.manual_seed(1234)
        model = WhisperForConditionalGeneration(config)
        # Decoder position k starts as the encoder position at the middle of word k // 5 (4
        # letters + a space; 0.26 s = 13 encoder positions a word): cross-attention starts out
        # knowing where to listen, and transcription is learnt in CPU minutes instead of hours.
        table = _sinusoids(config.max_source_positions, hidden)
        steps = model.model.decoder.embed_positions.weight
        per_word = (TONE_S * 3 + GAP_S) * SAMPLING_RATE / hop / 2
        with torch.no_grad():
            for k in range(steps.shape[0]):
                slot = min(int((k // 5 + 0.5) * per_word + 1), config.max_source_positions - 1)
                steps[k].copy_(0.3 * table[slot])
    gen = model.generation_config
    gen.decoder_start_token_id, gen.pad_token_id, gen.eos_token_id = start, end, end
    gen.bos_token_id = end
    gen.forced_decoder_ids = None
    gen.suppress_tokens = None
    gen.begin_suppress_tokens = None
    gen.max_length = 64
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    WhisperFeatureExtractor(
        feature_size=40, sampling_rate=SAMPLING_RATE, hop_length=hop, chunk_length=WINDOW_SECONDS, n_fft=400
    ).save_pretrained(folder)
