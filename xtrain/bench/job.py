"""The bench job on disk: a random llama-style model, packed tiny stories, one config per run."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xtrain.bench.sizes import LORA_TARGETS, ModelSize
from xtrain.builtin import build_tokenizer, story_examples


def write_model(size: ModelSize, folder: Path) -> int:
    """A randomly initialised llama-style model of ``size`` plus xtrain's built-in tokenizer,
    saved where ``from_pretrained`` loads it. Returns the vocabulary size used."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = build_tokenizer("llama")
    vocab = max(size.vocab, len(tokenizer))
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=size.hidden,
        intermediate_size=size.intermediate,
        num_hidden_layers=size.layers,
        num_attention_heads=size.heads,
        num_key_value_heads=size.heads,
        max_position_embeddings=max(2048, size.seq_len),
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return vocab


def write_stories(path: Path, blocks: int, seq_len: int) -> None:
    """Enough built-in tiny stories (~60 tokens each) to pack into ``blocks`` blocks of ``seq_len``."""
    n = max(64, math.ceil(blocks * seq_len / 50))
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for row in story_examples(n, seed=11):
            f.write(json.dumps(row) + "\n")


@dataclass
class Job:
    """A bench job on disk: model folder, data file and the config for one process count."""

    root: Path
    size: ModelSize
    model_dir: Path
    data_file: Path
    vocab: int


def prepare_job(root: Path, size: ModelSize, max_processes: int) -> Job:
    model_dir, data_file = root / "model", root / "train.jsonl"
    vocab = write_model(size, model_dir)
    write_stories(data_file, blocks=max(64, 4 * size.per_device * max_processes), seq_len=size.seq_len)
    return Job(root, size, model_dir, data_file, vocab)


def job_config(
    job: Job,
    output_dir: Path,
    global_batch: int,
    steps: int,
    log_every: int,
    full: bool,
    precision: str | None,
    lora_r: int,
    packing: str = "concatenate",  # fixed max_length blocks: every step the same tokens
) -> dict[str, Any]:
    """The train config of one bench run (plain data; ``write_config`` saves it)."""
    return {
        "model": {"name_or_path": str(job.model_dir), "task": "causal-lm"},
        "lora": {
            "enabled": not full,
            "r": lora_r,
            "alpha": 2 * lora_r,
            "dropout": 0.0,
            "target_modules": LORA_TARGETS,
        },
        "data": {"train": str(job.data_file), "max_length": job.size.seq_len, "packing": packing},
        "optim": {"lr": 1e-4, "warmup_steps": 0},
        "batch": {"per_device": job.size.per_device, "global_batch": global_batch},
        "run": {
            "output_dir": str(output_dir),
            "max_steps": steps,
            "log_every": log_every,
            "resume": "off",
            "tensorboard": False,  # the rates come from train_result.json's windows
            "keep_checkpoints": 1,
            "mixed_precision": precision or "auto",
            "seed": 0,
        },
    }


def write_config(path: Path, config: dict[str, Any]) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path
