"""The reward task on CUDA (skipped without it: tests/gpu/conftest.py): the step's gradients under
bf16 autocast and on a 4-bit base against the reward model and its loss written out by hand in
float32 (support/reward_models.py; the tolerances of tests/gpu/test_gradients_gpu.py, per tensor,
relative to its norm), and GRPO's ``model:RUN`` reward scoring on the run's GPU as ``xtrain
predict`` scores on it."""

from __future__ import annotations

import json

import pytest
from support.gradients import assert_close_gradients, jsonl
from support.jobs import session_builtin, task_job

from xtrain import builtin
from xtrain.tasks.validation import load_config

pytestmark = pytest.mark.usefixtures("private_caches")  # conftest: one offline cache for the session

JOB = """\
model:
  name_or_path: {model}
  task: reward
reward:
  center_rewards_coefficient: 0.01
lora:
  r: 4
  dropout: 0.0
data:
  train: {root}/train.jsonl
  eval: {root}/eval.jsonl
  max_length: 48
batch:
  per_device: 4
  global_batch: 8
run:
  max_steps: 4
  log_every: 1
  seed: 7
  report_to: none
"""


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    rows = [{**r, "margin": [0.0, 0.5][i % 2]} for i, r in enumerate(builtin.preference_examples(24, 3))]
    model = session_builtin(tmp_path_factory, "builtin:tiny-llama")
    return task_job(tmp_path_factory.mktemp("reward-gpu"), JOB, model, rows, n_train=16)


def _plan():
    from xtrain.machine.probe import collect
    from xtrain.planning.rules import make_plan

    return make_plan(collect(quick=True))


@pytest.mark.parametrize(
    ("quantization", "precision", "tolerance"), [(None, "bf16", 5e-2), ("4bit", "bf16", 5e-2)]
)
def test_reward_gradients_on_cuda_equal_the_hand_written_reward_model(
    job, tmp_path, quantization, precision, tolerance
):
    from support.reward_models import hand_gradients, reward_step

    if quantization:
        pytest.importorskip("bitsandbytes")
    cfg = load_config(job.config, [
        f"run.output_dir={tmp_path}", "run.max_steps=1", "optim.max_grad_norm=null", "run.eval_every=null",
        f"model.quantization={quantization or 'null'}", f"run.mixed_precision={precision}",
    ])  # fmt: skip
    capture, batches = reward_step(cfg, _plan())
    assert batches[0]["input_ids"].device.type == "cuda" and len(batches) == 2
    assert_close_gradients(capture.grads, hand_gradients(capture, batches, 0.01), tolerance)


def test_grpo_scores_with_the_reward_model_on_the_gpu_as_predict_does(job, tmp_path):
    from xtrain import predict as lib
    from xtrain.tasks.contract import PredictRequest
    from xtrain.tasks.grpo.rewards import ModelReward
    from xtrain.train.loop import train

    rm = tmp_path / "rm"
    train(load_config(job.config, [f"run.output_dir={rm}"]), _plan())
    reward = ModelReward(str(rm))
    reward.place("cuda")
    prompts = [r["prompt"] for r in builtin.preference_examples(4, 9)]
    completions = ["a ball. whatever.", "they played in the park, and they were very happy.", "no idea.", "x"]
    scores = reward(prompts=prompts, completions=completions)
    assert next(reward.scorer.model.parameters()).device.type == "cuda"
    file = jsonl(
        tmp_path / "texts.jsonl",
        [{"prompt": p, "completion": c} for p, c in zip(prompts, completions, strict=True)],
    )
    rows = lib.predict_file(rm, file, PredictRequest([], [], batch_size=3)).rows
    assert scores == pytest.approx(
        [r["score"] for r in rows], abs=1e-2
    )  # the GPU's arithmetic, batches differ
    assert json.loads((rm / "adapter" / "xtrain_run.json").read_text())["task"] == "reward"
