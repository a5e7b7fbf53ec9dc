# ruff: noqa: E501  (the case tables read best one case per line)
"""The model-aware checks (xtrain/tasks/model_checks.py): lengths against the model's positions,
LoRA targets against its module names, label names against model.num_labels, sizes against
bounds; in a run (``common.finish_model``) and in ``xtrain train --dry-run``, one line each."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.workloads import build_workload

from xtrain.errors import XtrainError
from xtrain.tasks import model_checks
from xtrain.tasks.validation import load_config

pytestmark = pytest.mark.usefixtures("private_caches")  # conftest: one offline cache for the session

DATA = Path(__file__).resolve().parents[1] / "xtrain" / "builtin" / "jobs"
OCR = str(DATA / "quickstart-image-to-text.yaml")
ASR = str(DATA / "quickstart-speech-to-text.yaml")
VQA = str(DATA / "quickstart-vision-language.yaml")


def offline_error(path: str | None, *overrides: str) -> str:
    with pytest.raises(XtrainError) as e:
        model_checks.check_offline(load_config(path, list(overrides)))
    assert "\n" not in e.value.one_line()
    return e.value.one_line()


@pytest.mark.parametrize(
    ("path", "overrides", "expected"),
    [
        # the trial: generation.max_new_tokens (128, the default) on tiny-trocr's 64-position decoder
        (OCR, ["generation.max_new_tokens=128"],
         "generation.max_new_tokens=128 plus a prompt of up to 1 token is above the decoder's limit "
         "of 64 positions (set generation.max_new_tokens=63 or less)"),
        (OCR, ["data.max_length=512"],
         "data.max_length=512 is above the decoder's limit of 64 positions (set data.max_length=64 or less)"),
        (ASR, ["generation.max_new_tokens=61"], "plus a prompt of up to 4 tokens is above the decoder's limit"),
        (VQA, ["generation.max_new_tokens=961"], "(set generation.max_new_tokens=960 or less)"),
        (None, ["data.max_length=513"], "data.max_length=513 is above the model's limit of 512 positions"),
        # one typo among names that match: peft would drop it silently
        (None, ["lora.target_modules=[query,vaule]"],
         "lora.target_modules ['vaule'] not found in the model (did you mean 'value'?"),
        (None, ["lora.target_modules=[nomatch]"], "lora.target_modules ['nomatch'] not found in the model"),
        (OCR, ["lora.enabled=true", "lora.target_modules=[q_proj,v_prj]"],
         "lora.target_modules ['v_prj'] not found in the model (did you mean 'v_proj'?"),
    ],
)  # fmt: skip
def test_a_config_beyond_the_model_is_one_line(path, overrides, expected):
    assert expected in offline_error(path, *overrides)


@pytest.mark.parametrize("path", [None, OCR, ASR, VQA])
def test_the_quickstart_jobs_pass(path):
    assert "checked against" in model_checks.check_offline(load_config(path, ["lora.enabled=true"]))


def test_the_run_checks_before_training(tmp_path):
    """The same check in a run: the workload is refused before any step or evaluation."""
    cfg = load_config(OCR, ["generation.max_new_tokens=100", "data.eval=null"])
    with pytest.raises(XtrainError, match="generation.max_new_tokens=100 plus a prompt"):
        build_workload(cfg)
    cfg = load_config(None, ["lora.target_modules=[query,vaule]", "data.eval=null"])
    with pytest.raises(XtrainError, match=r"lora.target_modules \['vaule'\] not found"):
        build_workload(cfg)


def test_dry_run_checks_the_model(tmp_path, capsys):
    from xtrain import builtin
    from xtrain.cli import main

    builtin.ensure_builtin_model("builtin:tiny-trocr")  # on this machine: its config.json is read
    assert main(["train", OCR, "lora.enabled=true", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "Model checks: lengths and LoRA targets checked against builtin:tiny-trocr" in out
    # the plan in numbers, and the layers auto picked on the model's skeleton (issue 60)
    assert "; global batch 32 = 16 per-device x 1 process x 2 accumulation\n" in out
    assert (
        "LoRA: r=8, alpha=16, lora.target_modules=auto: q_proj, k_proj, v_proj, out_proj (22 layers)\n" in out
    )
    assert main(["train", OCR, "generation.max_new_tokens=128", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "error: generation.max_new_tokens=128 plus a prompt" in err and "Traceback" not in err


def test_a_model_not_on_this_machine_is_skipped_at_dry_run():
    cfg = load_config(None, ["model.name_or_path=someone/not-downloaded"])
    assert model_checks.check_offline(cfg).startswith("skipped:")
    assert model_checks.check_offline(cfg, light=True).startswith("skipped:")


@pytest.mark.parametrize("path", [OCR, ASR, VQA])
def test_the_light_check_reads_config_json_as_the_run_reads_the_model(path):
    """Without CUDA the dry run reads config.json alone (no transformers): the same limits."""
    from xtrain import builtin

    cfg = load_config(path, [])
    builtin.ensure_builtin_model(cfg.model.name_or_path)
    assert model_checks.check_offline(cfg, light=True).startswith("lengths checked against")
    too_long = load_config(path, ["generation.max_new_tokens=2000"])
    with pytest.raises(XtrainError) as light:
        model_checks.check_offline(too_long, light=True)
    with pytest.raises(XtrainError) as full:
        model_checks.check_offline(too_long)
    assert light.value.one_line() == full.value.one_line()


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("lora.r=1e30", "lora.r must be an integer in 1..4096, got 1000000000000000019884624838656"),
        ("model.num_labels=1e30", "model.num_labels must be an integer in 2..1000000"),
        ("lora.alpha=1e30", "lora.alpha must be an integer in 1..1000000"),
        ("data.max_length=1e12", "data.max_length must be an integer in 1..4194304"),
        ("generation.num_beams=100000", "generation.num_beams must be an integer in 1..256"),
    ],
)
def test_absurd_sizes_are_refused_when_the_config_is_read(override, expected):
    with pytest.raises(XtrainError, match=expected.replace(".", r"\.")):
        load_config(None, [override])


# -- labels and text columns, as the data is read ---------------------------------------------------


def _seq_cls(tmp_path: Path, rows: list[dict], *extra: str):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return load_config(None, [f"data.train={path}", "data.eval=null", "data.max_length=32", *extra])


@pytest.mark.parametrize(
    ("rows", "extra", "expected"),
    [
        ([{"text": "a", "label": 1}, {"text": "b", "label": "pos"}], [],
         "the label column mixes types (number 1, str 'pos')"),
        ([{"text": "a", "label": [1]}, {"text": "b", "label": "pos"}], [], "holds a list in row 0, not a label"),
        ([{"text": ["a", "b"], "label": 1}, {"text": "b", "label": 0}], [],
         "column 'text' of {p} holds a list in row 0, not text"),
        ([{"text": ["a"], "label": 1}, {"text": ["b"], "label": 0}], [], "column 'text' of {p} holds lists, not text"),
        ([{"text": "a", "label": "neg"}, {"text": "b", "label": "pos"}], ["model.num_labels=5"],
         "the data has 2 labels but model.num_labels=5 (set model.num_labels=2 or leave it unset)"),
    ],
)  # fmt: skip
def test_label_and_text_columns_are_one_line(tmp_path, rows, extra, expected):
    with pytest.raises(XtrainError) as e:
        build_workload(_seq_cls(tmp_path, rows, *extra))
    assert expected.format(p=tmp_path / "rows.jsonl") in e.value.one_line()


def test_class_names_and_num_labels_must_agree():
    from xtrain.data.labels import label_mapping

    with pytest.raises(XtrainError, match="names 3 classes but model.num_labels=5"):
        label_mapping([0, 1, 2], [], 5, ("t", "e"), class_names=["a", "b", "c"])
    assert label_mapping([0, 1], [], None, ("t", "e"), class_names=["a", "b", "c"])[1] == 3
