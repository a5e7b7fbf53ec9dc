"""image-classification: the task added as one module and one registry line. The built-ins, label
names or integers, bad input in one line, LoRA on the encoder's attention with the head trained
whole, 1 vs 2 processes equal, exact resume, predict prints the label and its probability."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from support.workloads import build_workload

from xtrain import builtin
from xtrain.errors import XtrainError
from xtrain.tasks.validation import load_config

pytestmark = pytest.mark.usefixtures("private_caches")  # conftest: one offline cache for the session


@pytest.fixture
def vit(private_caches) -> str:
    return str(builtin.ensure_builtin_model("builtin:tiny-vit"))


def _rows(n: int, offset: int = 0) -> list[dict]:
    """``n`` rows of the built-in colour shapes (absolute image paths, label names)."""
    folder = builtin.ensure_builtin_data("builtin:color-shapes")
    lines = (folder / "train.jsonl").read_text(encoding="utf-8").splitlines()[offset : offset + n]
    return [{**row, "image": str(folder / row["image"])} for row in map(json.loads, lines)]


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _cfg(model: str, train: Path | str, *extra: str, eval_: Path | str | None = None):
    overrides = [
        f"model.name_or_path={model}",
        "model.task=image-classification",
        f"data.train={train}",
        f"data.eval={eval_ if eval_ is not None else 'null'}",
        "batch.per_device=4",
        *extra,
    ]
    return load_config(None, overrides)


def test_names_become_a_head_with_their_labels_and_lora_spares_the_head(vit, tmp_path):
    rows = _rows(12)
    workload = build_workload(_cfg(vit, _jsonl(tmp_path / "train.jsonl", rows)))
    model = workload.model
    config = model.base_model.model.config
    names = sorted({r["label"] for r in rows})
    assert config.num_labels == len(names) and [config.id2label[i] for i in range(len(names))] == names
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    adapted = {n.split(".lora_A")[0].rsplit(".", 1)[-1] for n in trainable if ".lora_A" in n}
    assert adapted in ({"query", "key", "value"}, {"q_proj", "k_proj", "v_proj"})  # transformers 4 / 5
    assert any("classifier.modules_to_save" in n for n in trainable), "the head trains whole"
    assert not any("classifier" in n and "lora_" in n for n in trainable), "no adapters on the head"
    batch = workload.collator([workload.train_dataset[i] for i in range(4)])
    assert batch["pixel_values"].shape[0] == 4 and batch["labels"].tolist() == [
        names.index(r["label"]) for r in rows[:4]
    ]
    assert model(**batch).loss.isfinite()
    assert workload.record == {"labels": names} and workload.main_metric == "accuracy"


def test_integer_labels_and_num_labels(vit, tmp_path):
    rows = [{**r, "label": i % 3} for i, r in enumerate(_rows(9))]
    train = _jsonl(tmp_path / "train.jsonl", rows)
    assert (
        build_workload(_cfg(vit, train, "model.num_labels=5")).model.base_model.model.config.num_labels == 5
    )
    with pytest.raises(XtrainError, match="does not fit model.num_labels=2"):
        build_workload(_cfg(vit, train, "model.num_labels=2"))


def test_an_imagefolder_names_its_classes_by_its_subfolders(vit, tmp_path):
    for split, rows in (("train", _rows(8)), ("validation", _rows(4, offset=8))):
        for i, row in enumerate(rows):
            folder = tmp_path / "shapes" / split / row["label"]
            folder.mkdir(parents=True, exist_ok=True)
            shutil.copy(row["image"], folder / f"{i}.png")
    cfg = _cfg(vit, tmp_path / "shapes", eval_=tmp_path / "shapes")
    workload = build_workload(cfg)
    names = sorted({p.name for p in (tmp_path / "shapes" / "train").iterdir()})
    config = workload.model.base_model.model.config
    assert [config.id2label[i] for i in range(len(names))] == names
    assert len(workload.train_dataset) == 8 and len(workload.eval_dataset) == 4
    assert workload.train_dataset[0]["image"].mode == "RGB"


def test_bad_input_is_one_line(vit, tmp_path, private_caches):
    rows = _rows(6)
    train = _jsonl(tmp_path / "train.jsonl", rows)
    with pytest.raises(XtrainError, match="column 'img' not in"):
        build_workload(_cfg(vit, train, "data.image_column=img"))
    missing = _jsonl(tmp_path / "missing.jsonl", [*rows, {"image": "nope.png", "label": "circle"}])
    with pytest.raises(XtrainError, match="nope.png .row 6 of"):
        build_workload(_cfg(vit, missing))
    llama = str(builtin.ensure_builtin_model("builtin:tiny-llama"))
    with pytest.raises(XtrainError, match="not an image classifier"):
        build_workload(_cfg(llama, train))
    with pytest.raises(XtrainError, match="data.packing is for task causal-lm, not image-classification"):
        _cfg(vit, train, "data.packing=true")
    # the model checks (xtrain/tasks/model_checks.py) name the missing target before peft runs
    with pytest.raises(XtrainError, match=r"lora.target_modules \['nope'\] not found in the model"):
        build_workload(_cfg(vit, train, "lora.target_modules=[nope]"))


def test_full_fine_tune_trains_everything(vit, tmp_path):
    model = build_workload(_cfg(vit, _jsonl(tmp_path / "t.jsonl", _rows(6)), "lora.enabled=false")).model
    assert all(p.requires_grad for p in model.parameters())


def test_plan_time_sizes_equal_the_built_model(vit, tmp_path):
    from xtrain.tasks.sizes import live_sizes, offline_sizes

    rows = _rows(8)
    classes = f"model.num_labels={len({r['label'] for r in rows})}"  # the plan reads no data
    for extra in ([], ["lora.enabled=false"]):
        cfg = _cfg(vit, _jsonl(tmp_path / "t.jsonl", rows), classes, *extra)
        assert offline_sizes(cfg) == live_sizes(build_workload(cfg).model, cfg=cfg)


JOB = """\
model:
  name_or_path: {model}
  task: image-classification
data:
  train: {root}/train.jsonl
  eval: {root}/eval.jsonl
optim:
  lr: 5.0e-3
batch:
  per_device: 4
  global_batch: 8
run:
  max_steps: 4
  eval_every: 2
  log_every: 1
  save_every: 2
  eval_at_start: true
  seed: 7
"""


@pytest.fixture(scope="module")
def shapes_job(tmp_path_factory):
    from support.jobs import session_builtin, task_job

    root = tmp_path_factory.mktemp("shapes-job")
    rows = []
    for i, row in enumerate(_rows(42)):
        shutil.copy(row["image"], root / f"{i}.png")
        rows.append({"image": f"{i}.png", "label": row["label"]})
    # eval: 10 rows, the last batch is partial on 2 ranks
    return task_job(root, JOB, session_builtin(tmp_path_factory, "builtin:tiny-vit"), rows)


@pytest.fixture(scope="module")
def shapes_straight(shapes_job):
    from support.jobs import train_once

    return train_once(shapes_job)[0]


@pytest.mark.slow
def test_one_and_two_processes_give_the_same_accuracy(shapes_job, shapes_straight):
    from support.jobs import assert_same_training, one_and_two_processes

    out, one, two = one_and_two_processes(shapes_job, shapes_straight)
    assert [h["accuracy"] for h in one["eval_history"]] == [h["accuracy"] for h in two["eval_history"]]
    assert_same_training(shapes_straight, out)


@pytest.mark.slow
def test_loader_workers_train_the_same(shapes_job, shapes_straight):
    """The images decoded in a DataLoader worker (the plan's media_workers on a GPU machine):
    the same batches, so the same losses and accuracy, bit for bit."""
    from support.jobs import assert_same_training, python_run, run_xtrain

    out = shapes_job.root / "workers"
    args = ("--config", str(shapes_job.config), f"run.output_dir={out}", "data.num_workers=1")
    proc = run_xtrain(python_run(*args), shapes_job.env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "1 loader worker(s) per process (data.num_workers)" in proc.stdout + proc.stderr
    assert_same_training(shapes_straight, out, exact=True)


@pytest.mark.slow
def test_kill_and_resume_is_exact(shapes_job, shapes_straight):
    from support.jobs import assert_same_training, python_run, run_until, run_xtrain

    out = shapes_job.root / "killed"
    args = ["--config", str(shapes_job.config), f"run.output_dir={out}", "run.resume=auto"]
    marker = out / "checkpoints" / "step-2" / "xtrain_state.json"
    assert run_until(python_run(*args), shapes_job.env, marker.exists) == -9
    proc = run_xtrain(python_run(*args), shapes_job.env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((out / "train_result.json").read_text())["resumed_from"]
    assert_same_training(shapes_straight, out, exact=True)


@pytest.mark.slow
def test_predict_prints_the_label_and_its_probability(shapes_job, shapes_straight, capsys):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForImageClassification

    from xtrain.cli import main

    out = shapes_job.root / "labels.jsonl"
    images = [str(shapes_job.root / "0.png"), str(shapes_job.root / "1.png")]
    assert main(["predict", str(shapes_straight), *images, "-o", str(out)]) == 0
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    labels = json.loads((shapes_straight / "adapter" / "xtrain_run.json").read_text())["labels"]
    assert [r["input"] for r in rows] == images
    assert all(r["output"] in labels and 0 < float(r["probability"]) <= 1 for r in rows)
    assert capsys.readouterr().out.startswith(f"{images[0]}\t{rows[0]['output']}\t")
    assert main(["predict", str(shapes_straight), "--prompt", "what shape?"]) == 2  # it takes images
    # the adapter is plain peft: it loads on the base with a head of the run's size
    adapter = shapes_straight / "adapter"
    base_path = json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"]
    base = AutoModelForImageClassification.from_pretrained(
        base_path, num_labels=len(labels), ignore_mismatched_sizes=True
    )
    model = PeftModel.from_pretrained(base, str(adapter)).eval()
    size = base.config.image_size
    assert model(pixel_values=torch.zeros(1, 3, size, size)).logits.shape == (1, len(labels))
