"""Early stopping (run.early_stopping_patience / _threshold): the decision from the eval history,
the refused combinations in one line, a run that cannot improve ending long before max_steps
(saying so, train_result.json, best/), a resume that does not train on, and the same stop in
1 and 2 processes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from support.jobs import REPO, make_job, offline_env, python_run, run_xtrain

from xtrain.errors import XtrainError
from xtrain.tasks.validation import load_config
from xtrain.train.early_stopping import early_stop
from xtrain.train.report import ListReporter

EXAMPLE = REPO / "examples" / "seq-cls.yaml"


def history(metric: str, *values: float) -> list[dict[str, float]]:
    return [{"step": 10 * (i + 1), metric: v} for i, v in enumerate(values)]


# -- the decision -------------------------------------------------------------------------------------
def test_patience_counts_evaluations_without_improvement() -> None:
    assert early_stop(history("eval_loss", 3.0, 2.5, 2.6), "eval_loss", 2) is None
    found = early_stop(history("eval_loss", 3.0, 2.5, 2.6, 2.5), "eval_loss", 2)
    assert found is not None and (found.step, found.best, found.best_step) == (40, 2.5, 20)
    assert (
        found.reason
        == "stopped early at step 40: eval_loss did not improve in 2 evaluations (best 2.5 at step 20)"
    )
    assert early_stop(history("eval_loss", 3.0, 2.5, 2.6, 2.4), "eval_loss", 2) is None  # improved: reset


def test_higher_is_better_for_accuracies_and_the_threshold_is_a_minimum_gain() -> None:
    assert early_stop(history("accuracy", 0.5, 0.6, 0.7), "accuracy", 1) is None
    assert early_stop(history("accuracy", 0.5, 0.4), "accuracy", 1) is not None
    # gains of 0.005 each: below the threshold, so no improvement, though the best moves
    found = early_stop(history("accuracy", 0.5, 0.505, 0.51), "accuracy", 2, threshold=0.01)
    assert found is not None and found.best == 0.51 and "by more than 0.01" in found.reason
    assert early_stop(history("eval_loss", 1.0, 0.5), "cer", 1) is None  # the metric never came


# -- refused combinations -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("overrides", "line"),
    [
        (["run.early_stopping_patience=2", "run.eval_every=5"], "needs run.best_metric"),
        (
            ["run.early_stopping_patience=2", "run.best_metric=eval_loss", "run.eval_every=null"],
            "needs run.eval_every",
        ),
        (
            ["run.early_stopping_threshold=0.1"],
            "run.early_stopping_threshold needs run.early_stopping_patience",
        ),
        (["run.early_stopping_patience=0"], "run.early_stopping_patience must be a positive integer"),
        (["run.early_stopping_threshold=-1"], "run.early_stopping_threshold must be a number >= 0"),
    ],
)
def test_refused_combinations_are_one_line(overrides: list[str], line: str) -> None:
    with pytest.raises(XtrainError) as e:
        load_config(str(EXAMPLE), overrides)
    assert line in e.value.one_line() and "\n" not in e.value.one_line()


def test_xtrain_train_refuses_early_stopping_without_a_metric(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "xtrain", "train", str(EXAMPLE), "run.early_stopping_patience=3"]
    proc = run_xtrain([*cmd, "run.eval_every=5", "--dry-run"], offline_env(tmp_path, tmp_path / "cache"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "error: run.early_stopping_patience needs run.best_metric (the metric it waits to improve) "
        "(set run.best_metric, e.g. eval_loss)"
    ]


# -- in one process -----------------------------------------------------------------------------------
def stalled_config(out: Path, **run: object):
    """The tiny job of test_loop with an lr that cannot move the weights: eval_loss stays put."""
    from test_loop import tiny_config

    cfg = tiny_config(out, **{"max_steps": 200, "eval_every": 1, "best_metric": "eval_loss", **run})
    cfg.optim.lr = 1e-12
    cfg.run.early_stopping_patience = 2
    cfg.run.early_stopping_threshold = 1e-3
    return cfg


@pytest.mark.slow
def test_a_run_that_cannot_improve_stops_early_and_a_resume_does_not_train_on(tmp_path: Path) -> None:
    from test_loop import build_tiny, cpu_plan

    from xtrain.train.loop import train

    out = tmp_path / "run"
    rep = ListReporter()
    result = train(stalled_config(out), cpu_plan(), rep, build=build_tiny)
    assert (result.final_step, result.total_steps) == (3, 200)  # evals 1 (the best), 2, 3: no gain
    assert result.stopped_early is not None and result.stopped_early["best_step"] == 1
    notes = [m for k, m in rep.events if k == "note"]
    assert any(
        m.startswith("stopped early at step 3: eval_loss did not improve by more than 0.001") for m in notes
    )
    saved = json.loads((out / "train_result.json").read_text())
    assert saved["final_step"] == 3 and saved["stopped_early"]["reason"] == result.stopped_early["reason"]
    assert json.loads((out / "best" / "best.json").read_text())["step"] == 1
    assert (out / "adapter").is_dir() and (out / "checkpoints" / "step-3").is_dir()

    again = ListReporter()
    resumed = train(stalled_config(out), cpu_plan(), again, build=build_tiny)
    assert resumed.final_step == 3 and resumed.stopped_early == result.stopped_early
    assert not [e for e in again.events if e[0] in ("progress", "checkpoint", "eval")]  # nothing trained
    assert any("already finished, nothing trained (step 3" in m for k, m in again.events if k == "note")


@pytest.mark.slow
def test_without_an_eval_set_or_its_metric_the_run_stops_in_one_line(tmp_path: Path) -> None:
    from test_loop import build_tiny, cpu_plan

    from xtrain.train.loop import train

    def no_eval(run, main_process_first):
        workload = build_tiny(run, main_process_first)
        workload.eval_dataset = None
        return workload

    with pytest.raises(XtrainError, match="run.early_stopping_patience needs an eval set"):
        train(stalled_config(tmp_path / "a"), cpu_plan(), build=no_eval)
    with pytest.raises(XtrainError, match="run.best_metric=cer is not among the eval metrics") as e:
        train(stalled_config(tmp_path / "b", best_metric="cer"), cpu_plan(), build=build_tiny)
    assert e.value.hint == "set run.best_metric to one of eval_loss"


# -- 1 and 2 processes ----------------------------------------------------------------------------------
@pytest.mark.slow
def test_one_and_two_processes_stop_at_the_same_evaluation(tmp_path: Path) -> None:
    job = make_job(tmp_path / "job", steps=60, save_every=100)
    stall = ["optim.lr=1e-12", "run.eval_every=2", "run.best_metric=eval_loss"]
    stall += ["run.early_stopping_patience=2", "run.early_stopping_threshold=0.001"]
    results = []
    for processes in ("1", "2"):
        out = tmp_path / f"p{processes}"
        args = ("--processes", processes, "--config", str(job.config), f"run.output_dir={out}", *stall)
        proc = run_xtrain(python_run(*args), job.env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "stopped early at step 6: eval_loss did not improve by more than 0.001" in proc.stderr
        results.append(json.loads((out / "train_result.json").read_text()))
    one, two = results
    assert (one["world_size"], two["world_size"]) == (1, 2)
    assert one["final_step"] == two["final_step"] == 6 and one["total_steps"] == 60
    assert one["stopped_early"]["step"] == two["stopped_early"]["step"] == 6
    for a, b in zip(one["eval_history"], two["eval_history"], strict=True):
        assert a["step"] == b["step"] and a["eval_loss"] == pytest.approx(b["eval_loss"], rel=1e-4)
