# longer: the one registry of the built-ins (names, data generators, builders, trained stages), a line each
"""Built-in tiny models, tokenizers and data sets, made offline and deterministically.

Everything here is *written to a folder* and then loaded through the same code path as a real
checkpoint or data file (``from_pretrained``, ``load_dataset("json", ...)``), so the quickstart
exercises exactly what a user's own model and data go through.

Names (used as ``model.name_or_path`` / ``data.train`` / ``data.eval``):

- ``builtin:tiny-llama``: a 2-layer llama-style causal LM (hidden 64, 4 heads).
- ``builtin:tiny-llama-sft``: the tiny llama after a short SFT on the built-in preference prompts,
  answering in either of their two styles (the preference quickstart's start; a trained built-in).
- ``builtin:tiny-llama-grpo``: the tiny llama after a short SFT that answers the built-in
  preference prompts curtly most of the time (the GRPO quickstart's start, ``xtrain.builtin.grpo``;
  a trained built-in).
- ``builtin:tiny-llama-chat``: the tiny llama with a chat template in its tokenizer (the default
  quickstart's model, ``xtrain.builtin.chat``).
- ``builtin:tiny-bert``: a 2-layer BERT encoder for sequence classification (hidden 64, 4 heads).
- ``builtin:sentiment``: synthetic labelled sentences (``text``, ``label`` = positive/negative).
- ``builtin:tiny-stories``: synthetic short stories (``text``) for causal LM.
- ``builtin:chat``: short ``messages`` conversations (an animal's sound, an opposite, a greeting)
  for chat fine-tuning (``xtrain.builtin.chat``).
- ``builtin:preference-pairs``: ``{prompt, chosen, rejected}`` pairs, a friendly answer style
  preferred over a curt one, for preference tuning (``xtrain.builtin.preference``).
- ``builtin:tiny-trocr`` / ``builtin:ocr-lines``: a tiny OCR model and rendered text lines for
  image-to-text (``xtrain.builtin.image``).
- ``builtin:tiny-whisper`` / ``builtin:spoken-words``: a tiny Whisper model and synthetic
  tone-sequence "speech" for speech-to-text (``xtrain.builtin.audio``).
- ``builtin:tiny-qwen2-vl`` / ``builtin:shapes-vqa``: a tiny Qwen2-VL model with its processor and
  questions about coloured shapes for vision-language (``xtrain.builtin.vision_language``).
- ``builtin:shapes-preference``: preference pairs on images of coloured shapes, a whole right
  sentence preferred over a curt wrong word, for vision-preference (``xtrain.builtin.vision_language``).
- ``builtin:tiny-agent`` / ``builtin:tool-calls``: a tiny llama whose tokenizer carries Qwen2.5's
  tools-aware chat template, and conversations that call one of three tools and answer from the
  result, for agent training under causal-lm (``xtrain.builtin.agents``, docs/agents.md).
- ``builtin:tiny-agent-grpo`` / ``builtin:arithmetic``: the tiny agent after a short SFT that calls
  a tool now and then and otherwise guesses (a trained built-in), and questions whose exact answer
  needs the tool, for agents trained by reward (``xtrain.builtin.agent_grpo``, docs/grpo.md).
- ``builtin:tiny-agent-calls``: the tiny agent after a short SFT in which every answer calls the
  right tool (a trained built-in: the first stage of ``builtin:tiny-agent-grpo``).
- ``builtin:preference-sft``, ``builtin:preference-sft-curt``, ``builtin:agent-sft-calls``,
  ``builtin:agent-sft``: the SFT data of the trained built-ins.
- ``builtin:tiny-vit`` / ``builtin:color-shapes``: a tiny ViT image classifier with its image
  processor and images of coloured shapes labelled by shape, for image classification
  (``xtrain.builtin.image_classes``).

The folders live under ``$XTRAIN_CACHE/builtin`` (default ``~/.cache/xtrain/builtin``). A build
goes to a temporary folder that is renamed into place only when complete, so processes that
race to build the same asset are safe: one rename wins, the others use the winner's folder.

**Trained built-ins** (``STAGES``) are chains (docs/chains.md): each is the result of a built-in
SFT job (``jobs/sft-*.yaml``: xtrain's own causal-lm stage, a LoRA adapter on a tiny model, on
built-in data), and the quickstart that names it starts from that result (``model.start``). This
layer only knows where such a result is kept (``stage_folder``: keyed by the job's text and
``VERSION``) and whether it is there (``stage_result``); training it is the training layer's
(``xtrain.train.builtin_stages``, called where a run starts, before any worker: one build, under
a lock, renamed into place).
"""

from __future__ import annotations

import difflib
import json
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from xtrain import atomic
from xtrain.builtin.agent_grpo import arithmetic_examples, calling_examples
from xtrain.builtin.agent_grpo import sft_examples as agent_sft_examples
from xtrain.builtin.chat import chat_examples, long_chat_examples
from xtrain.builtin.preference import curt_sft_examples, preference_examples
from xtrain.builtin.preference import sft_examples as preference_sft_examples
from xtrain.builtin.text import build_tokenizer, sentiment_examples, story_examples, tiny_llama_config
from xtrain.errors import XtrainError

PREFIX = "builtin:"
# Bump when a generator changes: stale folders are rebuilt instead of silently reused.
VERSION = 4  # 4: builtin:tiny-agent's template in the Jinja llama.cpp runs (same rendering)
# What the data generators are seeded with (the ``version`` they take): fixed, so a VERSION bump
# rebuilds the cached folders without changing the built-in data every test and figure rests on
DATA_SEED = 3
MARKER = "xtrain_builtin.json"

MODELS = (
    "tiny-llama",
    "tiny-llama-chat",
    "tiny-bert",
    "tiny-trocr",
    "tiny-whisper",
    "tiny-qwen2-vl",
    "tiny-vit",
    "tiny-agent",
)
# trained built-ins: name -> the built-in SFT job (jobs/) whose result it is
STAGES = {
    "tiny-llama-sft": "sft-tiny-llama-sft.yaml",
    "tiny-llama-grpo": "sft-tiny-llama-grpo.yaml",
    "tiny-agent-calls": "sft-tiny-agent-calls.yaml",
    "tiny-agent-grpo": "sft-tiny-agent-grpo.yaml",
}
JOBS = Path(__file__).resolve().parent / "jobs"
DATASETS = (
    "sentiment",
    "tiny-stories",
    "chat",
    "preference-pairs",
    "ocr-lines",
    "spoken-words",
    "shapes-vqa",
    "shapes-preference",
    "color-shapes",
    "tool-calls",
    "arithmetic",
    "preference-sft",
    "preference-sft-curt",
    "agent-sft",
    "agent-sft-calls",
    "long-chat",
)
IMAGE_ASSETS = ("tiny-trocr", "ocr-lines")  # built by xtrain.builtin.image
IMAGE_CLASS_ASSETS = ("tiny-vit", "color-shapes")  # built by xtrain.builtin.image_classes
AUDIO_ASSETS = ("tiny-whisper", "spoken-words")  # built by xtrain.builtin.audio
AGENT_ASSETS = ("tiny-agent", "tool-calls")  # built by xtrain.builtin.agents
VL_ASSETS = ("tiny-qwen2-vl", "shapes-vqa", "shapes-preference")  # built by xtrain.builtin.vision_language


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
    """Run ``build(tmp)`` into a fresh temporary folder next to ``final``, then rename it in. A
    cache the filesystem refuses (read-only, full: a read-only HOME) is one line naming
    XTRAIN_CACHE (``atomic.CannotWrite``), the temporary folder removed."""
    if _is_complete(final):
        return final
    root = final.parent.parent if final.parent.name == "data" else final.parent  # data sets: root/data
    with atomic.writing(atomic.BUILTIN_CACHE, root):
        return _build_into(final, build, name)


def _build_into(final: Path, build: Callable[[Path], None], name: str) -> Path:
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


# name -> (generator, train size, eval size)
_DATA_SPECS: dict[str, tuple[Callable[[int, int], list[dict[str, Any]]], int, int]] = {
    "sentiment": (sentiment_examples, 4000, 500),
    "tiny-stories": (story_examples, 2000, 200),
    "preference-pairs": (preference_examples, 400, 100),
    "chat": (chat_examples, 1000, 40),
    "arithmetic": (arithmetic_examples, 400, 100),
    "preference-sft": (preference_sft_examples, 400, 40),
    "preference-sft-curt": (curt_sft_examples, 400, 40),
    "agent-sft": (agent_sft_examples, 2000, 40),
    "agent-sft-calls": (calling_examples, 4000, 40),
    "long-chat": (long_chat_examples, 400, 20),  # xtrain quickstart --task long
}


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for row in rows:
            f.write(json.dumps(row, sort_keys=True) + "\n")


def _data_writer(short: str) -> Callable[[Path, int], None]:
    """The function that writes the built-in data set ``short`` into a folder (its arguments: the
    folder, ``DATA_SEED``): the module of its own kind for images, audio, conversations and tool
    calls (imported only then), else the text sets' jsonl writer (``_DATA_SPECS``)."""
    if short in IMAGE_ASSETS:
        from xtrain.builtin import image as builtin_image

        return builtin_image.build_ocr_lines
    if short in AUDIO_ASSETS:
        from xtrain.builtin import audio as builtin_audio

        return builtin_audio.build_spoken_words
    if short in VL_ASSETS:
        from xtrain.builtin import vision_language as builtin_vl

        return builtin_vl.build_shapes_vqa if short == "shapes-vqa" else builtin_vl.build_shapes_preference
    if short in AGENT_ASSETS:
        from xtrain.builtin import agents as builtin_agents

        return builtin_agents.build_tool_calls
    if short in IMAGE_CLASS_ASSETS:
        from xtrain.builtin import image_classes as builtin_classes

        return builtin_classes.build_color_shapes
    gen, n_train, n_eval = _DATA_SPECS[short]

    def write(tmp: Path, version: int) -> None:
        # Different seeds per split: eval sentences are fresh draws, not copies of training ones.
        _write_jsonl(tmp / "train.jsonl", gen(n_train, 1000 + version))
        _write_jsonl(tmp / "eval.jsonl", gen(n_eval, 2000 + version))

    return write


def ensure_builtin_data(name: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """Write a built-in data set once; returns its folder holding ``train.jsonl`` and ``eval.jsonl``."""
    short = _check_name(name, DATASETS, "data set")
    write, final = _data_writer(short), cache_root(cache_dir) / "data" / short
    return _build_atomically(final, lambda tmp: write(tmp, DATA_SEED), PREFIX + short)


def first_eval_row(name: str) -> tuple[Path, dict[str, Any]]:
    """(the folder of the built-in data set ``name``, the first row of its eval split): what a
    quickstart shows ``xtrain predict`` run on (its media paths are relative to the folder)."""
    folder = ensure_builtin_data(name)  # built by the run before
    return folder, json.loads((folder / "eval.jsonl").read_text(encoding="utf-8").splitlines()[0])


def builtin_data_file(name: str, split: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """The jsonl file of one split ("train" or "eval") of a built-in data set."""
    if split not in ("train", "eval"):
        raise XtrainError(f"unknown split '{split}' of {name} (splits: train, eval)")
    return ensure_builtin_data(name, cache_dir) / f"{split}.jsonl"


# --------------------------------------------------------------------------------------------
# Tokenizer and models


def _build_model(short: str, folder: Path) -> None:
    import torch
    from transformers import BertConfig, BertModel, LlamaForCausalLM

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
            config = tiny_llama_config(max_position_embeddings=512, **ids)
            model = LlamaForCausalLM(config)
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)


def _model_builder(short: str, cache_dir: str | os.PathLike | None) -> Callable[[Path], None]:
    """The function that writes the built-in model ``short`` (and its tokenizer or processor) into
    a folder: the module of its own kind (imported only then), a tiny llama's variant built from
    the tiny llama (built first), else ``_build_model``."""
    if short in IMAGE_ASSETS:
        from xtrain.builtin import image as builtin_image

        return builtin_image.build_tiny_trocr
    if short in AUDIO_ASSETS:
        from xtrain.builtin import audio as builtin_audio

        return builtin_audio.build_tiny_whisper
    if short in VL_ASSETS:
        from xtrain.builtin import vision_language as builtin_vl

        return builtin_vl.build_tiny_qwen2_vl
    if short in IMAGE_CLASS_ASSETS:
        from xtrain.builtin import image_classes as builtin_classes

        return builtin_classes.build_tiny_vit
    if short in AGENT_ASSETS:
        from xtrain.builtin import agents as builtin_agents

        return builtin_agents.build_tiny_agent
    if short == "tiny-llama-chat":  # the tiny llama with a chat template (xtrain.builtin.chat)
        from xtrain.builtin.chat import build_tiny_llama_chat

        base = ensure_builtin_model(PREFIX + "tiny-llama", cache_dir)
        return lambda tmp: build_tiny_llama_chat(base, tmp)
    return lambda tmp: _build_model(short, tmp)


def ensure_builtin_model(name: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """Build a built-in model + tokenizer once; returns the folder ``from_pretrained`` loads (a
    trained built-in: the folder of its result, ``stage_result``)."""
    if is_stage(name):
        return stage_result(name, cache_dir)
    short = _check_name(name, (*MODELS, *STAGES), "model")
    return _build_atomically(cache_root(cache_dir) / short, _model_builder(short, cache_dir), PREFIX + short)


# --------------------------------------------------------------------------------------------
# Trained built-ins: results of xtrain's own SFT stage (trained by xtrain.train.builtin_stages)


class StageNotBuilt(XtrainError):
    """A trained built-in named before the stage that trains it ran (where a run starts)."""


def is_stage(name: str | None) -> bool:
    return is_builtin(name) and strip_prefix(str(name)) in STAGES


def stage_job(name: str) -> Path:
    """The built-in SFT job whose result the trained built-in ``name`` is."""
    return JOBS / STAGES[strip_prefix(name)]


def stage_folder(name: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """Where the result of ``name``'s job is kept: named by the job's text, ``VERSION``,
    ``DATA_SEED`` and its start's own name when that is a trained built-in too (a changed job,
    generator or earlier stage trains anew, never reuses a stale result)."""
    import hashlib
    import re

    text = stage_job(name).read_text(encoding="utf-8")
    start = re.search(r"name_or_path:\s*(builtin:[\w.-]+)", text)
    earlier = stage_folder(start[1], cache_dir).name if start and is_stage(start[1]) else ""
    key = hashlib.sha256(f"{text}|{VERSION}|{DATA_SEED}|{earlier}".encode())
    return cache_root(cache_dir) / "stages" / f"{strip_prefix(name)}-{key.hexdigest()[:12]}"


def stage_built(name: str, cache_dir: str | os.PathLike | None = None) -> bool:
    return _is_complete(stage_folder(name, cache_dir))


def stage_result(name: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """The output folder of the trained built-in ``name`` (what ``model.name_or_path`` and
    ``xtrain predict`` take); one line when its stage has not run on this machine yet."""
    folder = stage_folder(name, cache_dir)
    if not _is_complete(folder):
        raise StageNotBuilt(
            f"{name} is trained by xtrain's own SFT stage ({stage_job(name).name}) on first use, "
            "and has not been here yet",
            "start it with xtrain train or xtrain quickstart (they train it first), or python -m xtrain.run",
        )
    return folder


def keep_stage(name: str, built: Path) -> Path:
    """The trained built-in's result, trained into ``built`` (a folder next to its place), moved
    into place: one rename wins; a process that lost the race keeps the winner's."""
    final = stage_folder(name)
    (built / MARKER).write_text(json.dumps({"name": name, "version": VERSION}), encoding="utf-8")
    try:
        os.rename(built, final)
    except OSError:
        if not _is_complete(final):
            raise
        shutil.rmtree(built, ignore_errors=True)
    return final
