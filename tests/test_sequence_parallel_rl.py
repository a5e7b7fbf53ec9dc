"""Sequence parallelism for the tasks whose step makes its sequences (issue 58): GRPO's training
forward and distillation. One process on the whole sequences against two with
``parallel.sequence: 2`` (gloo, real processes, float32): the same step loss and the same LoRA
gradients at the first optimizer step, the rollout generated whole by the group's first rank alone
(the other makes no forward of whole sequences), handed to the group, and trained on shards
(xtrain/tasks/grpo/sharded.py).

The one-process side is itself checked against the loss written out by hand over a plain peft
model (tests/test_grpo.py's and tests/test_distill.py's references: the same completions, the
rewards and advantages recomputed from their text). The two-process side is
tests/test_sequence_parallel.py's torchrun worker (xtrain's loop, every rank's gradients and loss
shares saved); the default cases (GRPO's dapo with the KL, on-policy distillation) run in that
file's one torchrun (``test_grpo_and_distillation_train_on_halves_as_one``), the others here
under soak. The completions (12 tokens after prompts of up to 32) cross the cut, so both
shards hold trained tokens and the prompts' left padding is aligned away before the cut.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from support.gradients import assert_same_gradients, jsonl
from test_sequence_parallel import WORDS, _cache, _common, _torchrun, record_shares

from xtrain.tasks.validation import load_config

pytestmark = pytest.mark.usefixtures("private_caches")  # conftest: one offline cache for the session

REWARD = '''\
def letters(prompts, completions, **columns):
    """Varies between a random model's completions: its share of e's, and its length."""
    return [c.count("e") / max(len(c), 1) + len(c) / 100 for c in completions]
'''
TEMPERATURE, BETA = 0.9, 0.3


def rl_jobs(root: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """Each kind's overrides (without ``parallel.sequence`` and the output folder), its files in
    ``root``; the default kinds (``DEFAULT``) run in tests/test_sequence_parallel.py's torchrun."""
    from support.jobs import session_builtin
    from test_distill import teacher_folder

    reward = root / "rewards.py"
    reward.write_text(REWARD)
    # short prompts of different lengths (left-padded), so the completions cross the cut
    rows = [
        {"prompt": f"count to {n}:" + " and" * (n % 3), "completion": " ".join(WORDS[:n])}
        for n in range(1, 9)
    ]
    prompts = jsonl(
        root / "prompts.jsonl", [{"prompt": r["prompt"], "answer": r["completion"]} for r in rows]
    )
    answers = jsonl(root / "answers.jsonl", rows)
    teacher = teacher_folder(root / "teacher", session_builtin(tmp_path_factory, "builtin:tiny-llama"))
    grpo = ("model.name_or_path=builtin:tiny-llama", "model.task=grpo", f"data.train={prompts}",
            "data.max_length=32", "grpo.num_generations=4", "grpo.max_completion_length=12",
            f"grpo.rewards=[{reward}:letters]", f"grpo.temperature={TEMPERATURE}")  # fmt: skip
    distill = ("model.name_or_path=builtin:tiny-llama", "model.task=distill", f"distill.teacher={teacher}",
               f"data.train={answers}", "data.max_length=32", "distill.max_completion_length=12")  # fmt: skip
    return {
        # dapo with the KL to the adapters-off reference; 2 micro-batches of 2 prompts x 4 samples
        "grpo": _common(
            *grpo, f"grpo.beta={BETA}", "grpo.loss=dapo", "batch.per_device=8", "batch.global_batch=16"
        ),  # fmt: skip
        # the student's samples, the sampled reverse KL a token
        "distill": _common(*distill, "distill.mode=on_policy"),
        # (soak) each completion's token mean
        "grpo-mean": _common(
            *grpo, "grpo.loss=grpo", "batch.per_device=8", "batch.global_batch=16"
        ),  # fmt: skip
        # (soak) the default GRPO case under gradient checkpointing (each layer recomputed on its shard)
        "grpo-checkpointing": _common(
            *grpo,
            f"grpo.beta={BETA}",
            "grpo.loss=dapo",
            "batch.per_device=8",
            "batch.global_batch=16",
            "model.gradient_checkpointing=true",
        ),  # fmt: skip
        # (soak) GKD on the data's answers or the student's samples (the step's draw), the JSD
        "distill-gkd": _common(*distill, "distill.mode=gkd", "distill.lmbda=0.5", "distill.beta=0.5"),
    }


DEFAULT = (
    "grpo",
    "distill",
)  # (in tests/test_sequence_parallel.py's one torchrun: no process start of their own)


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    return rl_jobs(tmp_path_factory.mktemp("seqpar-rl"), tmp_path_factory)


def one_process(overrides: list[str], out: Path) -> tuple[object, float, list[dict], object]:
    """One process on whole sequences: (its first-step capture, its step loss, the micro-batches
    its forward got, the task's step)."""
    from support.gradients import record_forward, xtrain_gradients

    batches: list[dict] = []
    seen: dict = {}

    def record(workload) -> None:
        seen["step"] = workload.forward
        record_forward(workload, batches)  # (every LoRA B moved as the worker's moved_adapters does)

    with record_shares() as shares:
        capture = xtrain_gradients(
            load_config(None, [*overrides, f"run.output_dir={out}"]), on_workload=record
        )
    return capture, sum(shares), batches, seen["step"]


def by_hand(kind: str, capture, batches: list[dict], step) -> dict[str, torch.Tensor]:
    """The step's gradients written out over a plain peft model of the run's weights."""
    from support.gradients import reference_model

    ref = reference_model(capture).train()
    if kind.startswith("grpo"):
        from support.gradients import dapo_gradients, grpo_token_loss

        tok = step.encoder.tokenizer

        def per_token(batch: dict) -> torch.Tensor:
            width = batch["completion_mask"].shape[1]
            texts = tok.batch_decode(batch["input_ids"][:, -width:], skip_special_tokens=True)
            rewards = torch.tensor([t.count("e") / max(len(t), 1) + len(t) / 100 for t in texts]).view(-1, 4)
            assert float(rewards.std(1).max()) > 0, "no reward spread: no advantage to train on"
            adv = ((rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-4)).reshape(
                -1
            )
            torch.testing.assert_close(batch["advantages"], adv)
            return grpo_token_loss(ref, batch, adv, TEMPERATURE, 0.0 if kind == "grpo-mean" else BETA)

        if kind != "grpo-mean":  # dapo: every completion token of the global batch
            return dapo_gradients(ref, batches, per_token)
        loss = sum(  # grpo: each completion's token mean, over the step's completions
            ((per_token(b) * b["loss_mask"]).sum(-1) / b["loss_mask"].sum(-1).clamp(min=1)).sum()
            for b in batches
        )
        (loss / sum(len(b["loss_mask"]) for b in batches)).backward()
    else:
        from support.distill import reference_loss

        mode = "on_policy" if kind == "distill" else "gkd"
        sums, tokens = zip(
            *(reference_loss(ref, step.teacher.model, b, mode, 0.5) for b in batches), strict=True
        )
        (sum(sums) / sum(tokens)).backward()
    return {n: p.grad.detach().float().cpu() for n, p in ref.named_parameters() if p.grad is not None}


def check(kind: str, overrides: list[str], two: list[dict], out: Path) -> None:
    capture, loss, batches, step = one_process(overrides, out)
    for b in batches:  # the completions cross the cut: both halves of the rows (aligned left) train
        width, real = b["completion_mask"].size(1), b["attention_mask"].sum(-1)
        prompts = real - b["completion_mask"].sum(-1)
        half = -(-b["input_ids"].size(1) // 2)
        assert int(prompts.min()) < half <= int(real.max()) - 1, (
            prompts.tolist(),
            real.tolist(),
            half,
            width,
        )
    assert_same_gradients(capture.grads, by_hand(kind, capture, batches, step))
    assert sum(r["loss"] for r in two) == pytest.approx(loss, rel=1e-5, abs=1e-6)  # (grpo, beta 0: ~0)
    for i, rank in enumerate(two):  # each process trained on its own half (sharded forwards only)
        assert rank["shards"] and set(rank["shards"]) == {(i % 2, 2)}, rank["shards"]
        assert (rank["whole"] > 0) == (i % 2 == 0), rank["whole"]  # a group's first rank alone generates
        assert_same_gradients(rank["grads"], capture.grads)


@pytest.mark.soak  # one more torchrun and a one-process run a case
@pytest.mark.parametrize("kind", ["grpo-mean", "grpo-checkpointing", "distill-gkd"])
def test_the_other_losses_train_as_one(jobs, kind, tmp_path, tmp_path_factory):
    """GRPO's per-completion token mean (each row's tokens counted over both shards), GRPO under
    gradient checkpointing and GKD's generalized JSD: two processes holding half of each sequence
    against one."""
    two = _torchrun({kind: [*jobs[kind], "parallel.sequence=2", f"run.output_dir={tmp_path / 'two'}"]},
                    tmp_path, _cache(tmp_path_factory))[kind]  # fmt: skip
    check(kind, jobs[kind], two, tmp_path / "one")


@pytest.mark.soak  # four processes on two cores
def test_four_processes_data_parallel_on_top(jobs, tmp_path, tmp_path_factory):
    """Four processes, two groups of two: the groups generate and train on different prompts
    (global batch 32 = 8 per-device x 2 groups x 2 accumulation), each group on one set of
    episodes, and the step is one process's on the same prompts."""
    wide = [*jobs["grpo"], "batch.global_batch=32"]
    four = _torchrun({"dp": [*wide, "parallel.sequence=2", f"run.output_dir={tmp_path / 'dp'}"]}, tmp_path,
                     _cache(tmp_path_factory), processes=4)["dp"]  # fmt: skip
    check("grpo", wide, four, tmp_path / "one")


def test_the_estimate_counts_a_share_of_prompt_and_completion():
    """GRPO's and distillation's samples are a prompt and its completion: the memory estimate's
    stacks keep the completion's tokens when it sets the length, and split both (parallel.sequence);
    the longest-sequence line says both parts."""
    from xtrain.model.activations import Stack, at_length

    stack = Stack("language model", 32 + 12, 2, 64, 128, 4, text=True, extra=12)
    assert at_length([stack], 32)[0].positions == 44
    assert at_length([stack], 32, 2)[0].positions == 22 and at_length([stack], 32, 2)[0].sequence == 2
    from dataclasses import replace

    from test_sequence_memory import SIZES, STACK

    from xtrain.model import memory

    grpo = replace(SIZES, stacks=(replace(STACK, extra=8192),))
    line = memory.longest_line(grpo, 2, True, "bf16", 80.0, memory.MemoryLevers(chunked=True, sequence=2), 2)
    assert line.count(" of prompt + 8,192 of completion)") == 2, line
