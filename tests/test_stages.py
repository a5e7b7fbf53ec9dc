# ruff: noqa: E501  (the refusals read best one case per line)
"""A recipe's stages decided before anything trains (xtrain/train/stages.py): the arguments told
apart, per-stage overrides, ``previous`` resolved, output folders and model classes checked, the
start a stage is checked on before the stage it follows has trained. Nothing is loaded."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from xtrain.errors import XtrainError
from xtrain.train.stages import load_stages, overrides_for, planned_config, split_args, stage_state

SFT = """\
model:
  name_or_path: builtin:tiny-llama-chat
  task: causal-lm
data:
  train: builtin:chat
  chat_template: chatml
run:
  output_dir: {out}
"""
DPO = """\
model:
  name_or_path: previous
  task: {task}
data:
  train: builtin:preference-pairs
run:
  output_dir: {out}
"""
GRPO = DPO.replace("{task}", "grpo") + "grpo:\n  rewards: [length]\n"


def _write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def recipe(tmp_path: Path) -> list[Path]:
    return [
        _write(tmp_path, "sft.yaml", SFT.format(out=tmp_path / "runs" / "sft")),
        _write(tmp_path, "dpo.yaml", DPO.format(task="preference", out=tmp_path / "runs" / "dpo")),
        _write(tmp_path, "grpo.yaml", GRPO.format(out=tmp_path / "runs" / "grpo")),
    ]


def test_arguments_are_configs_then_overrides(tmp_path: Path) -> None:
    a = _write(tmp_path, "a.yaml", "")
    assert split_args([str(a), "b.yml", "run.max_steps=3", "2:optim.lr=1e-4"]) == (
        [a, Path("b.yml")],
        ["run.max_steps=3", "2:optim.lr=1e-4"],
    )
    assert split_args([str(a), "oops"]) == ([a], ["oops"])  # parse_override says how one looks
    with pytest.raises(XtrainError, match="comes after an override"):
        split_args([str(a), "run.max_steps=3", "b.yaml"])


def test_stage_overrides_apply_to_their_stage() -> None:
    given = ["run.max_steps=3", "2:optim.lr=1e-4", "1:run.seed=5"]
    assert overrides_for(1, 2, given) == ["run.max_steps=3", "run.seed=5"]
    assert overrides_for(2, 2, given) == ["run.max_steps=3", "optim.lr=1e-4"]
    with pytest.raises(XtrainError, match="names stage 3, but there are 2 stages"):
        overrides_for(1, 2, ["3:optim.lr=1e-4"])


def test_previous_is_the_output_of_the_stage_before(recipe: list[Path]) -> None:
    stages = load_stages(recipe, ["run.max_steps=2", "3:grpo.num_generations=4"])
    assert [s.follows for s in stages] == [False, True, True]
    assert stages[1].cfg.model.name_or_path == str((recipe[0].parent / "runs" / "sft").resolve())
    assert stages[2].cfg.model.name_or_path == str((recipe[0].parent / "runs" / "dpo").resolve())
    assert all(s.cfg.run.max_steps == 2 for s in stages)
    assert stages[2].cfg.grpo.num_generations == 4 and stages[1].cfg.grpo.num_generations != 4
    # the workers re-read the file with these overrides: they must name the same start
    assert stages[2].overrides[-1] == f"model.name_or_path={stages[2].cfg.model.name_or_path}"
    assert [stage_state(s).describe() for s in stages] == ["trains from the start"] * 3


def test_a_stage_is_checked_on_the_recipes_first_model_until_its_start_is_trained(
    recipe: list[Path],
) -> None:
    stages = load_stages(recipe, [])
    planned = planned_config(stages, stages[2], done=set())
    assert planned.model.name_or_path == "builtin:tiny-llama-chat"
    assert planned.data.chat_template == "chatml"  # the tokenizer stage 1's result will carry
    assert stages[2].cfg.model.name_or_path.endswith("dpo")  # the stage itself is unchanged
    assert planned_config(stages, stages[2], done={2}).model.name_or_path.endswith("dpo")


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("sft.yaml", DPO.format(task="causal-lm", out="x"), "'previous', but it is the first stage"),
        ("dpo.yaml", DPO.format(task="preference", out="{runs}/sft"), "stage 1 (sft.yaml) and stage 2 (dpo.yaml) both write to"),
        ("dpo.yaml", DPO.format(task="seq-cls", out="y").replace("preference-pairs", "sentiment"), "dpo.yaml (seq-cls) cannot start from stage 1 (sft.yaml) (causal-lm)"),
        ("grpo.yaml", GRPO.format(out="z") + "optim:\n  lr: -1\n", "stage 3 (grpo.yaml): "),
    ],
    ids=["first stage follows", "same output folder", "another model class", "a stage's own mistake"],
)  # fmt: skip
def test_a_recipe_that_cannot_run_is_refused_before_anything_trains(recipe, name, text, message) -> None:
    _write(recipe[0].parent, name, text.replace("{runs}", str(recipe[0].parent / "runs")))
    with pytest.raises(XtrainError, match=re.escape(message)):
        load_stages(recipe, [])


def test_the_example_recipe_chains_three_stages() -> None:
    folder = Path(__file__).resolve().parents[1] / "examples" / "recipe"
    stages = load_stages([folder / "sft.yaml", folder / "dpo.yaml", folder / "grpo.yaml"], [])
    assert [s.cfg.model.task for s in stages] == ["causal-lm", "preference", "grpo"]
    assert [s.follows for s in stages] == [False, True, True]
    assert all(Path(s.cfg.data.train).is_file() for s in stages)  # next to the configs
