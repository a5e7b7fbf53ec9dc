"""Defaults that fit the model: a ``data.max_length`` or ``generation.max_new_tokens`` the user did
not write is lowered to what the model's positions allow, with a note, in ``xtrain train`` and in
each worker before anything is built; an explicit value that cannot work is still refused."""

from __future__ import annotations

import json
import shutil
import types
from pathlib import Path

import pytest

from xtrain.config.schema import TrainConfig, given_keys
from xtrain.errors import XtrainError
from xtrain.model.configs import local_config
from xtrain.tasks import model_checks
from xtrain.tasks.validation import load_config

pytestmark = pytest.mark.usefixtures("private_caches")  # conftest: one offline cache for the session

ROOT = Path(__file__).resolve().parents[1]
OCR = (ROOT / "xtrain" / "builtin" / "jobs" / "quickstart-image-to-text.yaml").read_text(encoding="utf-8")
LLAMA_JOB = """
model: {{name_or_path: {model}, task: causal-lm}}
data: {{train: {data}, prompt_column: prompt, response_column: response}}
run: {{output_dir: {out}, max_steps: 2}}
"""


def short_llama(folder: Path, positions: int) -> Path:
    """The built-in llama with a position table of ``positions`` in its config.json."""
    from xtrain import builtin

    shutil.copytree(builtin.ensure_builtin_model("builtin:tiny-llama"), folder)
    data = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    data["max_position_embeddings"] = positions
    (folder / "config.json").write_text(json.dumps(data), encoding="utf-8")
    return folder


def llama_job(tmp_path: Path, positions: int = 48) -> Path:
    model = short_llama(tmp_path / "model", positions)
    data = ROOT / "examples" / "data" / "opposites-train.jsonl"
    job = tmp_path / "job.yaml"
    job.write_text(LLAMA_JOB.format(model=model, data=data, out=tmp_path / "out"), encoding="utf-8")
    return job


def test_the_loader_records_which_keys_were_given(tmp_path: Path) -> None:
    cfg = load_config(llama_job(tmp_path), ["optim.lr=1e-3"])
    assert {"model.name_or_path", "data.train", "optim.lr"} <= given_keys(cfg)
    assert "data.max_length" not in given_keys(cfg)
    assert given_keys(TrainConfig()) is None  # built in code: every value counts as chosen


def test_an_unset_max_length_takes_the_models_positions(tmp_path: Path, capsys) -> None:
    from xtrain.cli import main

    job = llama_job(tmp_path)
    cfg = load_config(job)
    assert cfg.data.max_length == 512  # the schema's default ...
    notes = model_checks.fit_defaults(cfg)
    assert cfg.data.max_length == 48 and notes == [
        "data.max_length=48: the model's limit (the default 512 is above it)"
    ]  # ... lowered to the 48 positions, and the check passes
    assert "checked against" in model_checks.check_offline(cfg, light=True)
    assert main(["train", str(job), "--dry-run"]) == 0
    assert "Fitted to the model: data.max_length=48: the model's limit" in capsys.readouterr().out
    # an explicit value that cannot work is the user's: refused, as before
    assert main(["train", str(job), "data.max_length=512", "--dry-run"]) == 2
    assert "data.max_length=512 is above the model's limit of 48 positions" in capsys.readouterr().err


def test_a_small_trocr_without_lengths_trains_instead_of_being_refused(tmp_path: Path) -> None:
    """The trial: tiny-trocr's decoder has 64 positions; neither length was written. The worker's
    fit (run.py) comes before the build, whose model check then passes."""
    from support.workloads import build_workload

    from xtrain import run

    job = tmp_path / "ocr.yaml"
    job.write_text(
        OCR.replace("  max_length: 24\n", "").replace("  max_new_tokens: 20\n", ""), encoding="utf-8"
    )
    cfg = load_config(job, ["data.eval=null", f"run.output_dir={tmp_path / 'out'}"])
    with pytest.raises(XtrainError, match="data.max_length=512 is above the decoder's limit of 64"):
        model_checks.check_lengths(cfg, model_checks_task(cfg), local_config(cfg, fetch=True))
    run._fit_defaults(cfg)
    assert (cfg.data.max_length, cfg.generation.max_new_tokens) == (64, 63)  # 63 + the start token
    assert build_workload(cfg).model is not None  # the run's own check passes
    # given values stay the user's: an explicit 128 new tokens is refused in one line
    cfg = load_config(job, ["generation.max_new_tokens=128"])
    run._fit_defaults(cfg)
    assert cfg.data.max_length == 64
    with pytest.raises(XtrainError, match="generation.max_new_tokens=128 plus a prompt of up to 1 token"):
        model_checks.check_lengths(cfg, model_checks_task(cfg), local_config(cfg))


def model_checks_task(cfg: TrainConfig):
    from xtrain import tasks

    return tasks.get(cfg.model.task)


def test_a_prompt_of_max_length_leaves_room_to_generate(tmp_path: Path) -> None:
    """vision-language: the prompt is up to data.max_length, generation comes on top of it."""
    job = tmp_path / "vl.yaml"
    job.write_text("model: {name_or_path: builtin:tiny-qwen2-vl, task: vision-language}\n", encoding="utf-8")
    cfg = load_config(job)
    notes = model_checks.fit_defaults(cfg, types.SimpleNamespace(max_position_embeddings=200))
    assert (cfg.data.max_length, cfg.generation.max_new_tokens) == (100, 100) and len(notes) == 2
