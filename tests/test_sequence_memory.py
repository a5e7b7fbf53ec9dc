"""The plan tells the truth about sequence parallelism (issue 58): the memory estimate counts each
process's share of every sequence (activations and logits at max_length / N; eager attention's
probabilities honestly N times a share's square, Ulysses running the whole sequence for 1/N of the
heads), and ``xtrain doctor --config`` and the dry run say the longest sequence that fits a card
with and without it: Qwen2.5-7B LoRA (its published config.json, sized on the meta device, no
download) on the saved snapshot of two RTX 4090s under Windows."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
from test_memory_fitting import MODELS

from xtrain.model import memory
from xtrain.model.activations import Stack

FIXTURES = Path(__file__).parent / "fixtures" / "machines"
QWEN = next(config for name, _, config in MODELS if name == "Qwen2.5-7B-Instruct")


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Qwen2.5-7B-Instruct's config.json in a folder (the weights are never needed), and a job."""
    root = tmp_path_factory.mktemp("qwen")
    (root / "Qwen2.5-7B-Instruct").mkdir()
    (root / "Qwen2.5-7B-Instruct" / "config.json").write_text(json.dumps(QWEN))
    (root / "rows.jsonl").write_text(json.dumps({"text": "a long document"}) + "\n")
    model, rows, out = (
        (root / "Qwen2.5-7B-Instruct").as_posix(),
        (root / "rows.jsonl").as_posix(),
        root / "out",
    )
    (root / "job.yaml").write_text(
        f"model:\n  name_or_path: {model}\n  task: causal-lm\n  gradient_checkpointing: true\n"
        f"data:\n  train: {rows}\n  max_length: 16384\nbatch:\n  per_device: 1\n"
        f"run:\n  output_dir: {out.as_posix()}\nparallel:\n  sequence: 2\n"
    )
    return root


# Qwen2.5-7B's language model as the estimate sees it (LoRA on q/k/v/o; tests/test_memory*.py size
# the real config on the meta device): the rule, without building anything
LORA = (("attn_in", 3), ("attn_out", 1))
STACK = Stack("language model", 0, 28, 3584, 18944, 28, gated=True, rms_norm=True, text=True)
STACK = replace(STACK, trains="lora", adapters=LORA)
SHAPE = memory.Shape(3584, 28, 18944, 152064)
SIZES = memory.ModelSizes(7_620_000_000, 10_000_000, SHAPE, weight_bytes=2, stacks=(STACK,), lora_rank=8)


def test_a_process_holds_its_share_of_every_sequence():
    """Split across 2, 8192 tokens cost a process what 4096 cost one alone (sdpa: every term is per
    position); under eager attention more (the probabilities of the whole sequence's keys, for
    half the heads) but less than 8192 alone; the weights and optimizer states stay whole."""
    sizes = SIZES
    eager = replace(sizes, stacks=(replace(STACK, eager=True),))
    for checkpointing in (False, True):
        chunked, split = memory.MemoryLevers(chunked=True), memory.MemoryLevers(chunked=True, sequence=2)
        one = memory.estimate_run(sizes, 1, 4096, checkpointing, "bf16", chunked)
        assert memory.estimate_run(sizes, 1, 8192, checkpointing, "bf16", split) == pytest.approx(one)
        alone = [memory.estimate_run(eager, 1, n, checkpointing, "bf16", chunked)[0] for n in (4096, 8192)]
        assert alone[0] < memory.estimate_run(eager, 1, 8192, checkpointing, "bf16", split)[0] < alone[1]
    split, alone = (
        memory.estimate_run(sizes, 1, n, False, "bf16", memory.MemoryLevers(sequence=n)) for n in (2, 1)
    )
    assert (
        split == alone and split[0] > sizes.params * 2 / memory.GIB
    )  # every process holds the whole weights


def test_doctor_says_the_longest_sequence_a_4090_fits_with_and_without(private_caches, qwen, capsys):
    """``xtrain doctor --facts windows-2x4090.json --config job.yaml``: Qwen2.5-7B LoRA, bf16,
    checkpointing, the chunked loss: the split across both cards, staged through host memory
    (gloo on Windows), and the longest sequence a 24 GiB card fits split (about twice) and alone."""
    from xtrain.cli import main

    code = main(
        ["doctor", "--facts", str(FIXTURES / "windows-2x4090.json"), "--config", str(qwen / "job.yaml")]
    )
    out = capsys.readouterr().out
    assert code in (0, None), out
    assert "each sequence split across 2 processes (ulysses" in out and "through host memory" in out
    found = re.search(
        r"Longest sequence: ~([\d,]+) tokens split across 2 .*; ~([\d,]+) tokens on one card alone", out
    )
    assert found, out
    split, alone = (int(g.replace(",", "")) for g in found.groups())
    assert split > 16384 and alone < 16384 and split == pytest.approx(2 * alone, rel=0.02), (split, alone)
