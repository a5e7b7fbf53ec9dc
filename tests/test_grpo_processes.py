"""The grpo task's guarantees across processes (issue 42 §7): 1 and 2 processes sample the same
completions (seeded per completion, generated one micro-batch at a time) and train the same
losses and adapter; a run killed mid-epoch and resumed is bitwise the same; the result runs in
``xtrain predict``. Real processes (gloo on CPU), one short job on the random tiny llama with a
reward file that also logs every completion it scores."""

from __future__ import annotations

import json

import pytest
from support.jobs import logged_lines, logged_run

pytestmark = [pytest.mark.usefixtures("private_caches"), pytest.mark.slow]

REWARDS = """\
import os
from pathlib import Path


def letters(prompts, completions, split, **columns):
    log = Path(os.environ["GRPO_TEST_LOG"]) / f"rank{os.environ.get('RANK', '0')}.txt"
    with log.open("a") as f:  # the training completions (an eval batch may repeat rows to even out)
        f.writelines(repr(c) + "\\n" for c, s in zip(completions, split) if s == "train")
    return [c.count("e") / max(len(c), 1) + len(c) / 100 for c in completions]
"""

JOB = """\
model:
  name_or_path: {model}
  task: grpo
grpo:
  num_generations: 4
  max_completion_length: 8
  rewards: [{root}/rewards.py:letters]
  beta: 0.1
data:
  train: {root}/train.jsonl
  eval: {root}/eval.jsonl
  max_length: 32
optim:
  lr: 1.0e-2
batch:
  per_device: 8
  global_batch: 16
run:
  max_steps: 4
  eval_every: 2
  log_every: 1
  save_every: 2
  seed: 7
"""


@pytest.fixture(scope="module")
def grpo_job(tmp_path_factory):
    from support.jobs import session_builtin, task_job

    from xtrain.builtin.preference import preference_examples

    root = tmp_path_factory.mktemp("grpo-job")
    (root / "rewards.py").write_text(REWARDS)
    model = session_builtin(tmp_path_factory, "builtin:tiny-llama")
    rows = [{"prompt": r["prompt"], "split": "train" if i < 24 else "eval"}
            for i, r in enumerate(preference_examples(28, 5))]  # fmt: skip
    return task_job(root, JOB, model, rows, n_train=24)  # 24 prompts, 4 eval prompts


def test_one_and_two_processes_sample_and_train_the_same(grpo_job):
    from support.jobs import assert_same_training

    one, one_log = logged_run(grpo_job, "one")
    two, two_log = logged_run(grpo_job, "two", "--processes", "2")
    a, b = (json.loads((o / "train_result.json").read_text()) for o in (one, two))
    assert (a["accumulation"], b["world_size"], b["accumulation"]) == (2, 2, 1)
    assert len(list(two_log.glob("rank*.txt"))) == 2  # each process generated its share
    assert logged_lines(one_log) == logged_lines(two_log)
    assert len(logged_lines(one_log)) == 4 * 16  # 4 steps of 16 completions
    for x, y in zip(a["eval_history"], b["eval_history"], strict=True):
        assert y["reward"] == pytest.approx(x["reward"], rel=1e-5)
    assert_same_training(one, two)


def test_kill_and_resume_mid_epoch_is_exact(grpo_job):
    from support.jobs import assert_same_training, python_run, run_until, run_xtrain

    straight = grpo_job.root / "one"
    if not straight.exists():
        straight, _ = logged_run(grpo_job, "one")
    out = grpo_job.root / "killed"
    (grpo_job.root / "killed-completions").mkdir()
    grpo_job.env["GRPO_TEST_LOG"] = str(grpo_job.root / "killed-completions")
    args = ["--config", str(grpo_job.config), f"run.output_dir={out}", "run.resume=auto"]
    marker = out / "checkpoints" / "step-2" / "xtrain_state.json"
    assert run_until(python_run(*args), grpo_job.env, marker.exists) == -9
    proc = run_xtrain(python_run(*args), grpo_job.env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((out / "train_result.json").read_text())["resumed_from"]
    assert_same_training(straight, out, exact=True)


def test_predict_continues_a_prompt_with_the_trained_run(grpo_job, capsys):
    from xtrain.cli import main

    straight = grpo_job.root / "one"
    if not straight.exists():
        straight, _ = logged_run(grpo_job, "one")
    code = main(["predict", str(straight), "--prompt", "question: where did tom play? answer: ",
                 "--max-new-tokens", "5"])  # fmt: skip
    assert code == 0, capsys.readouterr().err


def test_lora_grpo_under_fsdp2_samples_and_trains_like_one_process(grpo_job):
    """Two FSDP2 ranks (accelerate's FSDP2 path on CPU, support/fsdp.py): generate runs on the
    sharded model (every rank steps until all are done), the reference is the sharded policy with
    its adapters off; the same completions, losses and adapter as one process."""
    from support.fsdp import fsdp_run
    from support.jobs import assert_same_training

    straight = grpo_job.root / "one"
    if not straight.exists():
        straight, _ = logged_run(grpo_job, "one")
    out, log = grpo_job.root / "fsdp", grpo_job.root / "fsdp-completions"
    log.mkdir()
    grpo_job.env["GRPO_TEST_LOG"] = str(log)
    fsdp_run(grpo_job, out)
    two = json.loads((out / "train_result.json").read_text())
    assert two["run_info"]["distributed_type"] == "DistributedType.FSDP"
    assert logged_lines(log) == logged_lines(grpo_job.root / "one-log")
    assert_same_training(straight, out)
