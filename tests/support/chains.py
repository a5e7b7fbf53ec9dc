"""Chained results for the chain tests (tests/test_chains.py, tests/test_chain_results.py): stages
trained by xtrain's own loop, in this process, in the session's shared built-in cache."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.gradients import jsonl


def _sft_rows(n: int, seed: int) -> list[dict]:
    """Prompt/response rows answered in the chosen (friendly) style: an SFT that moves the model."""
    from xtrain import builtin

    return [{"prompt": r["prompt"], "response": r["chosen"]} for r in builtin.preference_examples(n, seed)]


def train_stage(tmp_path_factory: pytest.TempPathFactory, name: str, overrides: list[str]) -> Path:
    """A stage trained by ``xtrain.train.loop.train`` with the session's built-ins (a module
    fixture runs before ``private_caches``); returns its output folder."""
    from support.workloads import this_machine
    from xtrain.tasks.validation import load_config
    from xtrain.train.loop import train

    root = tmp_path_factory.mktemp(name)
    caches = tmp_path_factory.getbasetemp() / "offline-caches"
    job = root / "job.yaml"
    job.write_text("model:\n  task: causal-lm\n", encoding="utf-8")  # (the default job's keys not given)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XTRAIN_CACHE", str(caches / "xtrain"))
        common = [f"run.output_dir={root / 'out'}", "run.report_to=none", "optim.warmup_steps=0"]
        train(load_config(job, [*common, *overrides]), this_machine())
    return root / "out"


def sft_result(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An SFT result on the built-in tiny llama (LoRA r 4 on every Linear, no dropout), its adapter
    moved well away from zero: the start differs from the base."""
    data = jsonl(tmp_path_factory.mktemp("sft-data") / "train.jsonl", _sft_rows(48, 3))
    return train_stage(
        tmp_path_factory,
        "sft",
        ["model.name_or_path=builtin:tiny-llama", f"data.train={data}", "data.eval=null",
         "data.max_length=48", "lora.r=4", "lora.alpha=8", "lora.target_modules=all-linear",
         "lora.dropout=0.0", "optim.lr=1e-2", "batch.per_device=8", "run.max_steps=6", "run.log_every=6"],
    )  # fmt: skip
