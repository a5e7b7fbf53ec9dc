"""`xtrain predict` across tasks: a result that does not generate text (seq-cls) refused in one
line, ``--output`` never overwriting a file, and the device every task runs on."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xtrain import builtin, trained
from xtrain import predict as lib
from xtrain.cli import main
from xtrain.errors import XtrainError

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.usefixtures("private_caches")  # conftest: one offline cache for the session


@pytest.fixture(scope="module")
def cls_run(tmp_path_factory) -> Path:
    """A one-step seq-cls run of the quickstart job (tiny-bert classifier)."""
    from support.jobs import offline_env, python_run, run_xtrain

    root = tmp_path_factory.mktemp("cls")
    env = offline_env(root, tmp_path_factory.getbasetemp() / "offline-caches" / "xtrain")
    out = root / "run"
    config = REPO / "xtrain" / "builtin" / "jobs" / "quickstart.yaml"
    args = ("--config", str(config), "run.max_steps=1", "data.eval=null", f"run.output_dir={out}")
    proc = run_xtrain(python_run(*args), env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def _refused(args: list[str], capsys) -> str:
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error:")
    return err


def test_predict_refuses_a_seq_cls_run_in_one_line(cls_run, tmp_path, capsys):
    for path in (cls_run, cls_run / "adapter"):
        assert "seq-cls" in _refused(["predict", str(path), "-p", "great movie"], capsys)
    assert capsys.readouterr().out == ""  # no generated garbage
    # a run from before the record: its checkpoints' config, then peft's task_type, tell
    old = shutil.copytree(cls_run, tmp_path / "old")
    (old / "adapter" / "xtrain_run.json").unlink()
    assert "seq-cls" in _refused(["predict", str(old), "-p", "great movie"], capsys)
    shutil.rmtree(old / "checkpoints")
    assert "seq-cls" in _refused(["predict", str(old), "-p", "great movie"], capsys)


def test_the_run_record_keeps_the_data_settings_a_data_file_is_read_with(cls_run, tmp_path):
    from xtrain import tasks

    record = json.loads((cls_run / "adapter" / "xtrain_run.json").read_text(encoding="utf-8"))
    assert record["data"]["text_column"] == "text" and record["data"]["label_column"] == "label"
    found = trained.run_task(cls_run / "adapter")
    assert trained.run_data(cls_run / "adapter", found) == record["data"]
    old = shutil.copytree(cls_run, tmp_path / "old")  # a run from before the record kept them
    del record["data"]
    (old / "adapter" / "xtrain_run.json").write_text(json.dumps(record), encoding="utf-8")
    settings = trained.run_data(old / "adapter", trained.run_task(old / "adapter"))
    assert settings["label_column"] == "label" and settings["train"] == "builtin:sentiment"  # the checkpoint
    cfg = lib.file_config(tasks.get("seq-cls"), {**settings, "from_a_newer_xtrain": 1}, tmp_path / "f.csv")
    assert cfg.data.train == cfg.data.eval == str(tmp_path / "f.csv") and cfg.data.label_column == "label"


def _write(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data), encoding="utf-8")


def test_the_task_is_read_from_the_record_then_the_checkpoints_then_the_head(tmp_path):
    run = tmp_path / "run"
    _write(run / "adapter" / "adapter_config.json", {"task_type": "CAUSAL_LM"})
    assert trained.run_task(run / "adapter") == trained.RunTask(None)
    state = run / "checkpoints" / "step-2" / "xtrain_state.json"
    _write(state, {"config": {"model": {"task": "custom"}}})
    assert trained.run_task(run / "adapter") == trained.RunTask("custom")
    with pytest.raises(XtrainError, match="custom result"):
        lib.predicting_task(run / "adapter")
    _write(run / "adapter" / "xtrain_run.json", {"task": "causal-lm", "chat": True})
    task, found = lib.predicting_task(run / "adapter")
    assert task.name == "causal-lm" and found == trained.RunTask("causal-lm", chat=True)
    _write(tmp_path / "full" / "config.json", {"architectures": ["BertForSequenceClassification"]})
    assert trained.run_task(tmp_path / "full") == trained.RunTask("seq-cls")
    _write(tmp_path / "vit" / "config.json", {"architectures": ["ViTForImageClassification"]})
    assert trained.run_task(tmp_path / "vit") == trained.RunTask("image-classification")
    _write(tmp_path / "what" / "config.json", {"architectures": ["BertForTokenClassification"]})
    with pytest.raises(XtrainError, match="cannot tell which task"):
        lib.predicting_task(tmp_path / "what")


def test_an_existing_output_file_is_refused_before_any_model_loads(tmp_path, capsys):
    out = tmp_path / "answers.jsonl"
    out.write_text("the user's own lines\n", encoding="utf-8")
    missing = str(tmp_path / "no-such-run")  # the output is checked first: no model is looked at
    err = _refused(["predict", missing, "-p", "hi", "--output", str(out)], capsys)
    assert "already exists" in err and "another file name" in err and "--force" in err
    assert out.read_text(encoding="utf-8") == "the user's own lines\n"


def test_every_task_runs_on_cuda_when_there_is_one(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert lib.pick_device() == "cuda"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert lib.pick_device() == "cpu"
    placed = []
    monkeypatch.setattr(lib, "pick_device", lambda: placed.append(True) or "cpu")
    lib.load_predictor(builtin.ensure_builtin_model("builtin:tiny-llama"))  # causal-lm, like the rest
    assert placed == [True]


def test_inputs_follow_the_model_device_and_dtype():
    import torch

    class Model:
        device, dtype = torch.device("cpu"), torch.float16

    from xtrain.tasks.predicting import to_model

    batch = to_model({"input_ids": torch.ones(1, 2, dtype=torch.long), "x": torch.ones(1)}, Model())
    assert batch["input_ids"].dtype == torch.long and batch["x"].dtype == torch.float16


@pytest.mark.parametrize("kind", ["image", "audio file"])
def test_an_unreadable_input_names_the_file_not_a_row(tmp_path, kind):
    from xtrain.data.rows.audio import read_audio
    from xtrain.data.rows.images import open_image

    bad = tmp_path / "notes.png"
    bad.write_text("not media", encoding="utf-8")
    read = {
        "image": lambda: open_image(str(bad), None, 0, ""),
        "audio file": lambda: read_audio(str(bad), None, 0, "", 16000),
    }
    from xtrain.tasks.predicting import read_input

    with pytest.raises(XtrainError) as e:
        read_input(bad, kind, read[kind])
    assert e.value.message.startswith(f"input {bad} is not a readable {kind}: ")
    assert "row" not in str(e.value) and "leave it out of the inputs" in str(e.value)


@pytest.mark.parametrize(
    "task",
    ["image-to-text", "speech-to-text", "vision-language", "vision-preference", "image-classification"],
)
def test_quickstart_offers_predict_on_real_built_in_inputs(task, tmp_path):
    import shlex

    from xtrain.commands.quickstart import next_line
    from xtrain.tasks import quickstarts

    line = next_line(quickstarts()[task], tmp_path / "run", "bash")
    words = shlex.split(line.split("`")[1])
    assert words[:3] == ["xtrain", "predict", str(tmp_path / "run")]
    assert Path(words[3]).is_file()  # an eval image or clip of the built-in data the job trained on
    assert "for your own data" in line


def test_quickstart_seq_cls_offers_no_predict(tmp_path):
    from xtrain.commands.quickstart import next_line
    from xtrain.tasks import quickstarts

    line = next_line(quickstarts()["seq-cls"], tmp_path, "bash")
    assert "predict" not in line and "xtrain train examples/seq-cls.yaml" in line


def test_quickstart_names_what_it_trained(tmp_path):
    """The distillation built-in trains its whole student: the line says model, not adapter."""
    from xtrain.commands.quickstart import next_line
    from xtrain.tasks import quickstarts

    job = quickstarts()["distill"]
    assert "runs the model just trained" in next_line(job, tmp_path, "bash", adapter=False)
    assert "runs the adapter just trained" in next_line(job, tmp_path, "bash")


# ---------------------------------------------------------------------------------------------
# A chat model that xtrain did not train; the results lines


def test_a_base_model_with_a_chat_template_is_prompted_through_it(tmp_path_factory, capsys):
    import torch
    from support.jobs import session_builtin

    base = session_builtin(tmp_path_factory, "builtin:tiny-llama-chat")
    assert trained.run_task(base) == trained.RunTask("causal-lm", chat=True, templated=True)
    plain = session_builtin(tmp_path_factory, "builtin:tiny-llama")  # no template: text as it is
    assert trained.run_task(plain) == trained.RunTask("causal-lm")
    question, system = "where is the frog?", "you answer in one sentence."
    capsys.readouterr()
    args = ["predict", str(base), "-p", question, "--system", system, "--max-new-tokens", "5"]
    assert main([*args, "--format", "jsonl"]) == 0
    captured = capsys.readouterr()
    assert "is not an xtrain run" in captured.err and "chat template" in captured.err
    row = json.loads(captured.out)
    # the reference: the template rendered by transformers with the generation prompt, greedy
    _, loaded = lib.load_predictor(base)
    turns = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    text = loaded.tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
    enc = loaded.tokenizer(text, add_special_tokens=False, return_tensors="pt")
    with torch.no_grad():
        ids = loaded.model.generate(**enc, max_new_tokens=5, do_sample=False, pad_token_id=0)
    expected = loaded.tokenizer.decode(ids[0, enc["input_ids"].shape[1] :], skip_special_tokens=True).strip()
    assert row == {"input": question, "output": expected}


def _unescape(field: str) -> str:
    import re

    return re.sub(r"\\(.)", lambda m: {"t": "\t", "n": "\n", "r": "\r"}.get(m[1], m[1]), field)


@settings(max_examples=60, deadline=None)
@given(values=st.lists(st.text(st.characters(codec="utf-8")), min_size=1, max_size=4))
def test_a_tab_separated_line_keeps_every_value_on_one_line(values):
    from xtrain.commands.predict import tsv_line

    line = tsv_line(values)
    assert "\n" not in line and "\r" not in line
    assert [_unescape(f) for f in line.split("\t")] == values


def test_the_metric_line_says_how_many_rows_it_is_over():
    from xtrain.commands.predict import metrics_line

    assert metrics_line({"exact_match": 0.62}, 50, 50) == "exact match 0.62 over 50 rows"
    assert (
        metrics_line({"cer": 0.1, "wer": 0.25}, 2, 3)
        == "cer 0.1, wer 0.25 over 2 rows with a reference (of 3)"
    )
