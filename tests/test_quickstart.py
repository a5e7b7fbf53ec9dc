"""`xtrain quickstart` end to end: the README's first command (chat LoRA on the built-in tiny
llama, its answers before and after), offline, in 1 and 2 processes; the other tasks' jobs by
``--task``."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def _result(run: Path) -> dict:
    return json.loads((run / "train_result.json").read_text())


def _before_after(result: dict) -> tuple[dict, dict]:
    before = next(h for h in result["eval_history"] if h["step"] == 0)
    return before, result["eval_metrics"]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory: pytest.TempPathFactory):
    """The README's first command, once for the session (test_chat_cli.py chats with its run)."""
    from support.jobs import session_quickstart

    proc, run = session_quickstart(tmp_path_factory)
    return proc, run, _result(run)


def test_quickstart_learns_to_chat_and_shows_answers_before_and_after(one_process) -> None:
    proc, run, result = one_process
    before, after = _before_after(result)
    assert (
        after["token_accuracy"] > before["token_accuracy"] + 0.5 and after["eval_loss"] < before["eval_loss"]
    )
    assert (result["global_batch"], result["world_size"], result["accumulation"]) == (16, 1, 2)
    assert (Path(result["outputs"]["adapter"]) / "adapter_config.json").is_file()
    out = proc.stdout
    for shown in (
        "causal-lm LoRA on builtin:tiny-llama-chat",
        "token_accuracy",
        "base model",
        "trained adapter",
    ):
        assert shown in out
    # the exact match of the base model (noise) and of the adapter over the whole eval split
    found = re.search(r"exact match (\S+) -> (\S+) over 40 eval rows", out)
    assert found is not None, out[-2000:]
    assert float(found[1]) == 0.0 and float(found[2]) >= 0.4  # measured 0.55 (token accuracy 0.94)
    assert f"xtrain chat {run}" in out and "--prompt" in out  # Next: predict and chat with it
    assert f"xtrain export {run} --to gguf -o {run}-gguf" in out  # and export it (test_llamacpp.py runs it)
    # its curves named (the picture: test_report_browser.py reads it back), and the page of the run
    assert f"Curves: {run / 'curves.png'}" in out and f"`xtrain report {run}`" in out
    assert result["outputs"]["curves"] == str(run / "curves.png")
    answers = json.loads((run / "answers.json").read_text(encoding="utf-8"))  # for the report
    assert len(answers["rows"]) == 40 and f"{answers['metrics']['exact_match']['trained']:.2f}" == found[2]
    assert "Traceback" not in proc.stderr


def test_quickstart_two_processes_same_global_batch(one_process, tmp_path_factory) -> None:
    from support.jobs import session_quickstart

    _, _, one = one_process
    _, run = session_quickstart(tmp_path_factory, "--processes", "2")
    two = _result(run)
    assert (two["world_size"], two["accumulation"], two["global_batch"]) == (2, 1, 16)
    # The same samples per optimizer step in the same order: the same training, up to
    # floating-point summation order across processes.
    assert abs(one["eval_metrics"]["eval_loss"] - two["eval_metrics"]["eval_loss"]) < 1e-3
    assert abs(one["eval_metrics"]["token_accuracy"] - two["eval_metrics"]["token_accuracy"]) <= 0.01


def test_the_default_job_is_chat_and_every_task_job_is_named(capsys, monkeypatch) -> None:
    from xtrain import run
    from xtrain.cli import main
    from xtrain.errors import XtrainError
    from xtrain.tasks import default_job, default_quickstart, job_file, quickstarts

    jobs = quickstarts()
    assert default_quickstart() == "causal-lm" and sum(q.default for q in jobs.values()) == 1
    assert job_file(jobs["causal-lm"]).name == "quickstart-chat.yaml"
    assert job_file(jobs["seq-cls"]).name == "quickstart.yaml"  # `--task seq-cls`: the BERT classifier
    assert all(job_file(q).is_file() for q in jobs.values())
    assert main(["quickstart", "--task", "list"]) == 0
    listed = capsys.readouterr().out
    assert "--task causal-lm" in listed and "--task seq-cls" in listed
    assert "--task grpo-tools (GRPO agents" in listed  # a task's other job, under its own name
    # `python -m xtrain.run` without --config trains the same job (it once trained the BERT one)
    loaded = []

    def load_config(path, overrides=()):
        loaded.append(path)
        raise XtrainError("loaded")

    monkeypatch.setattr("xtrain.tasks.validation.load_config", load_config)
    assert run.main(["run.max_steps=1"]) == 2 and loaded == [str(default_job())]
    assert "error: loaded" in capsys.readouterr().err


@pytest.mark.soak  # each first run trains its built-in SFT stage (tens of seconds) before the job
@pytest.mark.parametrize(
    ("task", "metric", "before", "after"),
    [
        ("preference", "rewards/accuracy", 0.5, 1.0),
        ("grpo", "reward", 0.0, 0.8),
        ("reward", "rewards/accuracy", 0.5, 0.9),
    ],  # fmt: skip
)
def test_the_quickstarts_from_a_built_in_sft_stage_learn_at_one_and_two_processes(
    tmp_path_factory, task, metric, before, after
) -> None:
    """``--task preference`` (reward accuracy 0.5 -> 1.0), ``--task grpo`` (mean reward 0 -> 0.8
    or more) and ``--task reward`` (a reward model: accuracy 0.5 -> 0.9 or more) start from their
    built-in SFT stage's result (builtin:tiny-llama-sft,
    builtin:tiny-llama-grpo: trained once by the first run, named in the result's lineage) and
    learn alike at 1 and 2 processes."""
    from support.jobs import session_quickstart

    runs = []
    for args in ((), ("--processes", "2")):
        proc, run = session_quickstart(tmp_path_factory, "--task", task, *args)
        first, last = _before_after(_result(run))
        assert first[metric] == pytest.approx(before, abs=0.05) and last[metric] >= after, (first, last)
        runs.append(last[metric])
        record = json.loads((run / "adapter" / "xtrain_run.json").read_text())
        (stage,) = record["lineage"]  # the built-in SFT stage it started from, trained whole
        assert (stage["task"], stage["mode"], record["mode"]) == ("causal-lm", "full", "new")
    assert runs[0] == pytest.approx(runs[1], abs=0.02)
