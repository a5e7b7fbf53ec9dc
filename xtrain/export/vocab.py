"""The tokenizer in a GGUF file: what llama.cpp needs to tokenize exactly as the transformers
tokenizer the run trained with (``tokenizer.ggml.*``), read off that tokenizer's own
``tokenizer.json`` (its ``backend_tokenizer``). Two kinds, as in llama.cpp's converter:

- byte-level BPE (GPT-2, Llama 3, Qwen2): ``gpt2`` with its merges, and the pre-tokenizer named
  by its split pattern (llama.cpp keeps the regex of each pre-tokenizer it knows under a name:
  ``gpt-2``, ``llama-bpe``, ``qwen2``); a pattern it does not know is refused, since llama.cpp
  would split text differently from training;
- SentencePiece-style BPE with byte fallback (Llama 2, Mistral, Gemma, Phi-3): ``llama``, the
  pieces with scores in merge order and ``<0xNN>`` byte pieces, and whether a space is prefixed.

Token types: special added tokens are control tokens, other added tokens user-defined; bos, eos,
unk, pad and the chat template's end-of-turn token (``eot``) by id; ``add_bos_token`` /
``add_eos_token`` as the tokenizer adds them to a plain text, and for a chat run as training fed
its rendered conversations (tokenized without added specials: the template writes them): llama.cpp
renders the template, takes a leading bos off its text and adds bos when the file says so, so the
file adds bos only where the template writes it (``chat_bos``) and eos never.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from xtrain.errors import XtrainError

if TYPE_CHECKING:
    from gguf import GGUFWriter
    from transformers import PreTrainedTokenizerBase

# llama.cpp's names for the byte-level pre-tokenizers it knows, keyed by the split regex
# (convert_hf_to_gguf.py get_vocab_base_pre; llama-vocab.cpp): GPT-2's regex is ByteLevel's own
_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PRE_TOKENIZERS = {_LLAMA3: "llama-bpe", _QWEN2: "qwen2"}
GPT2 = "gpt-2"

# gguf.TokenType values (kept here so this module imports nothing heavy)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
_BYTE_PIECE = re.compile(r"<0x[0-9A-Fa-f]{2}>")


@dataclass
class Vocab:
    """What ``tokenizer.ggml.*`` holds: plain data."""

    model: str  # gpt2 | llama
    pre: str  # the pre-tokenizer's name (gpt2) or "default" (llama)
    tokens: list[str]
    types: list[int]
    scores: list[float] | None = None  # llama only
    merges: list[str] = field(default_factory=list)  # gpt2 only
    special: dict[str, int] = field(default_factory=dict)  # bos, eos, unk, pad, eot -> id
    add_bos: bool = False
    add_eos: bool = False
    add_space_prefix: bool | None = None  # llama only


def _pre_name(spec: dict[str, Any] | None) -> str:
    """llama.cpp's name for a byte-level BPE's pre-tokenizer, or a one-line refusal."""
    parts = (spec or {}).get("pretokenizers") or ([spec] if spec else [])
    splits = [p for p in parts if p.get("type") == "Split"]
    levels = [p for p in parts if p.get("type") == "ByteLevel"]
    if not splits and levels and levels[0].get("use_regex", True):
        return GPT2  # ByteLevel's own regex is GPT-2's
    if len(splits) == 1:
        pattern = splits[0].get("pattern", {})
        name = PRE_TOKENIZERS.get(pattern.get("Regex", ""))
        if name is not None:
            return name
    raise XtrainError(
        "the tokenizer splits text with a pattern llama.cpp does not know (GPT-2, Llama 3 and "
        "Qwen2 byte-level BPE, and SentencePiece-style tokenizers are written)",
        "export it with --to merged; a GGUF tokenizing differently from training would answer worse",
    )


def _merges(model: dict[str, Any]) -> list[str]:
    merges = model.get("merges") or []
    return [m if isinstance(m, str) else " ".join(m) for m in merges]


def _added(tokenizer: PreTrainedTokenizerBase) -> dict[int, Any]:
    return dict(getattr(tokenizer, "added_tokens_decoder", {}) or {})


def _special_ids(tokenizer: PreTrainedTokenizerBase, eot: int | None) -> dict[str, int]:
    out = {}
    for kind in ("bos", "eos", "unk", "pad"):
        found = getattr(tokenizer, f"{kind}_token_id", None)
        if isinstance(found, int):
            out[kind] = found
    if eot is not None:
        out["eot"] = eot
    return out


def _adds(tokenizer: PreTrainedTokenizerBase) -> tuple[bool, bool]:
    """Whether the tokenizer adds bos / eos around a plain text (its post-processor)."""
    ids = tokenizer("a", add_special_tokens=True)["input_ids"]
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    return bool(ids and bos is not None and ids[0] == bos), bool(ids and eos is not None and ids[-1] == eos)


def read_vocab(
    tokenizer: PreTrainedTokenizerBase, vocab_size: int, eot: int | None = None, chat_bos: bool | None = None
) -> Vocab:
    """The GGUF vocabulary of a fast transformers tokenizer, padded to the model's ``vocab_size``
    (embedding rows past the tokenizer's own are unused pieces, as llama.cpp's converter writes);
    ``chat_bos``: a chat run's, whether its template writes the bos token first (None: a plain run)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise XtrainError(
            "GGUF export needs the run's fast tokenizer (tokenizer.json); this one is a slow tokenizer",
            "save the tokenizer with tokenizers installed, or export with --to merged",
        )
    spec = json.loads(backend.to_str())
    model = spec.get("model", {})
    if model.get("type") != "BPE":
        raise XtrainError(
            f"GGUF export writes BPE tokenizers; this one is {model.get('type', 'unknown')}",
            "export it with --to merged",
        )
    by_id = {i: t for t, i in tokenizer.get_vocab().items()}
    size = max(vocab_size, max(by_id) + 1)
    added = _added(tokenizer)
    tokens, types = [], []
    for i in range(size):
        text = by_id.get(i)
        if text is None:
            tokens.append(f"[PAD{i}]")
            types.append(UNUSED)
            continue
        tokens.append(text)
        if i in added:
            types.append(CONTROL if getattr(added[i], "special", False) else USER_DEFINED)
        elif model.get("byte_fallback") and _BYTE_PIECE.fullmatch(text):
            types.append(BYTE)
        elif text == model.get("unk_token"):
            types.append(UNKNOWN)
        else:
            types.append(NORMAL)
    add_bos, add_eos = _adds(tokenizer)
    if chat_bos is not None:  # training tokenized the rendered text as it is
        add_bos, add_eos = add_bos and chat_bos, False
    common = {"special": _special_ids(tokenizer, eot), "add_bos": add_bos, "add_eos": add_eos}
    if model.get("byte_fallback"):
        # SentencePiece BPE: llama.cpp merges the pair whose result scores highest; pieces are
        # numbered in merge order, so a falling score by id is that order
        scores = [0.0 if t != NORMAL else -float(i) for i, t in enumerate(types)]
        space = _prefixes_space(spec)
        return Vocab("llama", "default", tokens, types, scores=scores, add_space_prefix=space, **common)
    return Vocab("gpt2", _pre_name(spec.get("pre_tokenizer")), tokens, types, merges=_merges(model), **common)


def _prefixes_space(spec: dict[str, Any]) -> bool:
    """Whether a SentencePiece-style tokenizer puts ``▁`` before the first word (Llama 2, Mistral:
    yes; Gemma: no)."""
    text = json.dumps([spec.get("normalizer"), spec.get("pre_tokenizer")])
    return '"Prepend"' in text or '"prepend_scheme": "always"' in text or '"add_prefix_space": true' in text


def write_vocab(writer: GGUFWriter, vocab: Vocab) -> None:
    """The vocabulary's keys, through ``GGUFWriter``'s own setters."""
    writer.add_tokenizer_model(vocab.model)
    writer.add_tokenizer_pre(vocab.pre)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.types)
    if vocab.scores is not None:
        writer.add_token_scores(vocab.scores)
    if vocab.merges:
        writer.add_token_merges(vocab.merges)
    for kind, token in vocab.special.items():
        getattr(writer, f"add_{kind}_token_id")(token)
    writer.add_add_bos_token(vocab.add_bos)
    writer.add_add_eos_token(vocab.add_eos)
    if vocab.add_space_prefix is not None:
        writer.add_add_space_prefix(vocab.add_space_prefix)
