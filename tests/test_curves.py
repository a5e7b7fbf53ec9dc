"""A run's curves: its history laid out in panels (train/curves.py: plain data), drawn as a PNG read
back here (train/plot.py), and the files a run keeps for a person (train/run_files.py): a failure
to draw is one warning line and the run goes on; a resumed run's samples file keeps the
evaluations before its checkpoint. A real run's picture, and a resumed run's history equal to an
uninterrupted one's, are checked by tests/support/jobs.py's ``assert_same_training`` (the resume
tests) and by tests/test_report_browser.py."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pytest

from xtrain import tasks
from xtrain.tasks.contract import Curve
from xtrain.train import run_files
from xtrain.train.curves import EVAL, SMOOTH_FROM, SMOOTHED, TRAIN, History, panels, smoothed
from xtrain.train.run_files import RunFiles


def _history(windows: int = 30, evals: tuple[int, ...] = (0, 15, 30)) -> History:
    log = [
        {
            "step": s,
            "loss": 3 / s,
            "lr": 1e-3 * (1 - s / 31),
            "reward": s / 30,
            "rewards/exact/mean": s / 40,
            "rewards/format/mean": 0.5,
            "completions/mean_length": 10 + s,
        }
        for s in range(1, windows + 1)
    ]
    ev = [
        {"step": s, "reward": s / 30, "rewards/exact": s / 40, "perplexity": 1000 / (s + 1) ** 2}
        for s in evals
    ]
    return History([[r["step"], r["loss"]] for r in log], log, ev)


def test_panels_in_order_each_with_what_it_shows() -> None:
    grpo = tasks.get("grpo").curves
    found = {p.title: p for p in panels(_history(), grpo)}
    titles = list(found)
    assert titles[:2] == ["loss", "learning rate"]
    loss = found["loss"]
    assert [line.kind for line in loss.lines] == [TRAIN, SMOOTHED]  # no eval_loss in this history
    reward = found["reward (weighted sum)"]
    assert [(line.kind, line.label) for line in reward.lines] == [(TRAIN, "train"), (EVAL, "eval")]
    per_fn = found["reward per function"]
    assert [line.label for line in per_fn.lines] == ["exact train", "format train", "exact eval"]
    assert "KL to the reference" not in found  # beta 0: no point, no panel
    # every other eval metric a panel of its own, after the task's; the ones a task panel drew not again
    assert titles[-1] == "perplexity (eval)" and "reward (eval)" not in titles
    assert found["perplexity (eval)"].log_scale and not reward.log_scale  # 1000 -> 1: over 100x
    assert found["learning rate"].lines[0].points[0] == (1.0, pytest.approx(1e-3 * 30 / 31))


def test_a_short_run_is_drawn_as_it_is_and_non_finite_values_are_left_out() -> None:
    h = History([[1, 2.0], [2, math.nan], [3, math.inf], [4, 1.0]], [], [{"step": 4, "eval_loss": 1.5}])
    (loss,) = panels(h)
    assert [line.kind for line in loss.lines] == [TRAIN, EVAL]  # fewer than SMOOTH_FROM: no smoothed line
    assert loss.lines[0].points == ((1.0, 2.0), (4.0, 1.0))
    assert SMOOTH_FROM > 4


def test_smoothing_starts_at_the_first_value_and_keeps_a_constant() -> None:
    assert smoothed([5.0] * 50) == pytest.approx([5.0] * 50)
    out = smoothed([10.0, 0.0] * 25)
    assert out[0] == 10.0 and 3 < out[-1] < 7  # debiased start; the average of a zig-zag later


def test_history_from_a_hand_edited_file_keeps_the_well_formed_rows() -> None:
    saved = {
        "losses": [[1, 0.5], ["2", 0.4], [3], "x", [4, True]],
        "log_history": [{"step": 1, "loss": 0.5, "note": "text"}, {"loss": 0.4}, 7],
        "eval_history": "not a list",
    }
    h = History.of(saved)
    assert h.losses == [[1, 0.5]] and h.log_history == [{"step": 1, "loss": 0.5}] and h.eval_history == []


def _pixels(png: bytes) -> tuple[tuple[int, int], int]:
    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("L")
    low, high = image.getextrema()
    return image.size, high - low


def test_the_picture_is_a_grid_of_the_panels_and_not_blank() -> None:
    from xtrain.train.plot import png

    found = panels(_history(), tasks.get("grpo").curves)
    size, contrast = _pixels(png(found, "a run"))
    assert len(found) == 6
    assert size == (1120, round(3.3 * 3 * 100 + 50))  # two a row, three rows
    assert contrast > 200  # lines and text on white


def test_a_drawing_failure_is_one_warning_and_the_run_goes_on(tmp_path: Path, monkeypatch) -> None:
    from xtrain.train import plot

    def broken(*args: object) -> bytes:
        raise RuntimeError("no fonts")

    monkeypatch.setattr(plot, "png", broken)
    files = RunFiles(tmp_path, (), "t")
    first = files.evaluated(10, [], _history(10))
    assert len(first) == 1 and "the curves not written" in first[0] and "no fonts" in first[0]
    assert files.evaluated(20, [], _history(20)) == []  # said once
    assert files.picture is None
    assert files.draw(History()) == []  # nothing trained yet: nothing drawn, nothing said


def test_samples_are_kept_per_evaluation_and_a_resume_drops_the_later_ones(tmp_path: Path) -> None:
    files = RunFiles(tmp_path, (Curve("x", train=("loss",)),), "t")
    one = [{"reference": "a", "prediction": "b"}]
    for step in (0, 10, 20):
        files.evaluated(step, one, History())
    assert [e["step"] for e in run_files.read_samples(tmp_path)] == [0, 10, 20]
    RunFiles(tmp_path, (), "t").started(None, start_step=10)  # resumed at step 10: 20 is evaluated again
    assert [e["step"] for e in run_files.read_samples(tmp_path)] == [0, 10]
    files.evaluated(10, one, History())  # the same step again replaces it
    assert [e["step"] for e in run_files.read_samples(tmp_path)] == [0, 10]
    (tmp_path / run_files.CURVES).write_bytes(b"an earlier run's")
    RunFiles(tmp_path, (), "t").started(None, start_step=0)  # a new run in the folder: starts over
    assert run_files.read_samples(tmp_path) == [] and not (tmp_path / run_files.CURVES).exists()
    (tmp_path / run_files.SAMPLES).write_text("{not json", encoding="utf-8")
    assert run_files.read_samples(tmp_path) == []


def test_the_data_check_is_saved_and_read_back(tmp_path: Path) -> None:
    from xtrain.tasks.data_report import DataReport, Example, Piece, SourceCheck

    report = DataReport(
        "causal-lm",
        48,
        [SourceCheck("train", "t.jsonl", 3, 3, lengths=[4, 5, 9])],
        Example("t.jsonl", 0, [Piece("q ", False), Piece("a", True)], tokens=2, trained=1),
    )
    assert RunFiles(tmp_path, (), "t").started(report, 0) == []
    back = DataReport.from_dict(json.loads((tmp_path / run_files.DATA_CHECK).read_text(encoding="utf-8")))
    assert back == report
