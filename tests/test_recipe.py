"""A recipe from the command line (docs/chains.md): `xtrain train sft.yaml dpo.yaml grpo.yaml` on
the built-in tiny llama, each stage from the one before. Each stage's first evaluation shows the
policy equal to its reference (DPO's loss ln 2 and rewards 0; GRPO's KL 0 at its first step); a
recipe killed in its second stage and run again skips the first, resumes the second and ends with
the same three adapters, to the bit, as a recipe never stopped; 2 processes train the same chain."""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

import pytest
from support import jobs

pytestmark = pytest.mark.slow

STAGES = {
    "sft.yaml": """\
model:
  name_or_path: {model}
  task: causal-lm
data:
  train: builtin:preference-pairs
  eval: builtin:preference-pairs
  prompt_column: prompt
  response_column: chosen
  max_samples: 64
  max_length: 48
""",
    "dpo.yaml": """\
model:
  name_or_path: previous
  task: preference
preference:
  beta: 0.1
data:
  train: builtin:preference-pairs
  eval: builtin:preference-pairs
  max_samples: 32
  max_length: 48
""",
    "grpo.yaml": """\
model:
  name_or_path: previous
  task: grpo
grpo:
  num_generations: 4
  max_completion_length: 8
  rewards: [length]                # varies within a group: the stage trains
  length_target: 24
  beta: 0.04
data:
  train: builtin:preference-pairs
  eval: builtin:preference-pairs
  max_samples: 16
  max_length: 48
batch:
  per_device: 4
  global_batch: 8
""",
}
COMMON = """\
lora:
  r: 4
  alpha: 8
  dropout: 0.0
optim:
  lr: 0.01
batch:
  per_device: 4
  global_batch: 8
run:
  output_dir: {out}/{stage}
  max_steps: 4
  save_every: 2
  log_every: 1
  tensorboard: false
  seed: 7
"""


def _recipe(root: Path, model: Path) -> list[str]:
    """The three stage configs in ``root`` (their outputs under ``root/runs``), as arguments."""
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, text in STAGES.items():
        stage = name.removesuffix(".yaml")
        common = COMMON.format(out=root / "runs", stage=stage)
        if "batch:" in text:  # the stage's own batch section replaces the common one
            common = re.sub(r"batch:\n(  .*\n)+", "", common)
        (root / name).write_text(text.format(model=model) + common)
        paths.append(str(root / name))
    return paths


def _train(configs: list[str], env: dict[str, str], *extra: str) -> list[str]:
    """The recipe's command; DPO evaluates before its first step (the policy equal to its reference)."""
    return [sys.executable, "-m", "xtrain", "train", *configs, *extra, "2:run.eval_at_start=true"]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return jobs.session_builtin(tmp_path_factory, "builtin:tiny-llama")


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory, model: Path) -> tuple[Path, dict[str, str], str]:
    """The recipe run once, never stopped: (its root, its environment, what it printed)."""
    root = tmp_path_factory.mktemp("recipe-straight")
    env = jobs.offline_env(root, root / "xtrain-cache")
    done = jobs.run_xtrain(_train(_recipe(root, model), env), env)
    assert done.returncode == 0, done.stderr[-3000:]
    return root, env, done.stdout + done.stderr


def _result(root: Path, stage: str) -> dict:
    return json.loads((root / "runs" / stage / "train_result.json").read_text())


def test_each_stage_starts_from_the_one_before_and_equal_to_its_reference(straight) -> None:
    root, _, printed = straight
    record = json.loads((root / "runs" / "grpo" / "adapter" / "xtrain_run.json").read_text())
    assert record["task"] == "grpo"  # the stages it came from, oldest first
    assert [e["task"] for e in record["lineage"]] == ["causal-lm", "preference"]
    assert [e["source"] for e in record["lineage"]] == [str(root / "runs" / s) for s in ("sft", "dpo")]
    dpo_first = _result(root, "dpo")["eval_history"][0]  # eval_at_start: the policy is the SFT model
    assert dpo_first["step"] == 0
    assert dpo_first["eval_loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert dpo_first["rewards/chosen"] == pytest.approx(0, abs=1e-6)
    assert dpo_first["rewards/margin"] == pytest.approx(0, abs=1e-6)
    kl = {w["step"]: w["kl"] for w in _result(root, "grpo")["log_history"]}
    assert kl[1] == pytest.approx(0, abs=1e-6)  # the first step's policy is the DPO stage's model
    assert kl[4] > 1e-6  # and then it moves away from it
    assert "Recipe done" in printed
    # every logging window carries the task's own metrics (issue 60): DPO's first is the policy
    # against itself, on the console's line for the window as in the log history
    dpo_step1 = _result(root, "dpo")["log_history"][0]
    assert dpo_step1["step"] == 1 and dpo_step1["rewards/margin"] == pytest.approx(0, abs=1e-5)
    assert dpo_step1["rewards/accuracy"] == pytest.approx(0.5, abs=1e-6)
    assert re.search(r"step 1 rewards/chosen \S+ .*rewards/accuracy 0\.5 ", printed), printed[-3000:]
    assert re.search(r"step 4 .*kl \S+ .*reward \S+ .*rewards/length/mean \S+", printed)  # GRPO's


def test_a_chain_s_report_names_each_stage_s_start(straight) -> None:
    """The DPO stage's step-0 answers are the SFT stage's model's: headed so, not "base model"."""
    from xtrain.report import page
    from xtrain.report.runs import read_runs

    root = straight[0]
    runs, chained = read_runs([root / "runs" / s for s in ("sft", "dpo", "grpo")])
    assert chained
    html = page.render(runs, chained)
    assert "start: sft (step 0)" in html and "base model (step 0)" not in html


def test_a_killed_recipe_run_again_ends_with_the_same_adapters(straight, model, tmp_path: Path) -> None:
    ref, _, _ = straight
    configs = _recipe(tmp_path, model)
    env = jobs.offline_env(tmp_path, tmp_path / "xtrain-cache")
    second = tmp_path / "runs" / "dpo" / "checkpoints" / "step-2"
    code = jobs.run_until(_train(configs, env), env, ready=lambda: (second / "xtrain_state.json").is_file())
    assert code != 0 and not (tmp_path / "runs" / "dpo" / "adapter").exists()
    again = jobs.run_xtrain(_train(configs, env), env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert re.search(r"1\. sft\.yaml: .*\(finished: skipped\)", again.stdout)
    assert re.search(r"2\. dpo\.yaml: .*\(resumes at step 2\)", again.stdout)
    for stage in ("sft", "dpo", "grpo"):
        jobs.assert_same_training(ref / "runs" / stage, tmp_path / "runs" / stage, exact=True)
    third = jobs.run_xtrain(_train(configs, env), env)  # all finished: nothing trains, nothing changes
    assert third.returncode == 0 and third.stdout.count("finished: skipped") == 3


@pytest.mark.soak
def test_two_processes_train_the_same_chain(straight, model, tmp_path: Path) -> None:
    ref, _, _ = straight
    env = jobs.offline_env(tmp_path, tmp_path / "xtrain-cache")
    done = jobs.run_xtrain(_train(_recipe(tmp_path, model), env, "--processes", "2"), env)
    assert done.returncode == 0, done.stderr[-3000:]
    for stage in ("sft", "dpo", "grpo"):
        jobs.assert_same_training(ref / "runs" / stage, tmp_path / "runs" / stage)


def test_a_checkpoint_started_from_another_result_is_not_resumed(straight, tmp_path: Path) -> None:
    """A stage's checkpoint records the hashes of the adapters it started from: once the stage
    before trained on (another adapter in its folder), ``run.resume: auto`` refuses it."""
    from xtrain.errors import XtrainError
    from xtrain.train.checkpoint.layout import STATE_FILE
    from xtrain.train.checkpoint.resume import read_state, start_hashes

    root = straight[0]
    checkpoint = sorted((root / "runs" / "dpo" / "checkpoints").glob("step-*"))[-1]
    state = json.loads((checkpoint / STATE_FILE).read_text())
    assert len(state["start"]) == 1 and state["start"] == start_hashes(state["config"])
    read_state(checkpoint, state["config"])  # the same start: resumed
    state["start"] = ["0" * 64]
    (tmp_path / STATE_FILE).write_text(json.dumps(state))
    with pytest.raises(XtrainError, match="was trained from another result"):
        read_state(tmp_path, state["config"])
    read_state(tmp_path, state["config"], named=True)  # run.resume=PATH: asked for
