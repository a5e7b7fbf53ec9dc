"""`xtrain quickstart` end to end: the README's first command, offline, in 1 and 2 processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import warm

pytestmark = pytest.mark.slow


def _quickstart(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "COLUMNS": "120"}
    proc = warm.run(
        [sys.executable, "-m", "xtrain", "quickstart", "--output-dir", str(tmp_path / "qs"), *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = sorted((tmp_path / "qs").glob("run-*"))
    return proc, json.loads((run / "train_result.json").read_text())


def _before_after(result: dict) -> tuple[dict, dict]:
    before = next(h for h in result["eval_history"] if h["step"] == 0)
    return before, result["eval_metrics"]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, dict]:
    """The README's first command, once for this module."""
    return _quickstart(tmp_path_factory.mktemp("quickstart-one"))


def test_quickstart_learns_and_saves_an_adapter(one_process) -> None:
    proc, result = one_process
    before, after = _before_after(result)
    assert after["accuracy"] > 0.85 and after["accuracy"] > before["accuracy"] + 0.25
    assert after["eval_loss"] < before["eval_loss"]
    assert result["global_batch"] == 32 and result["world_size"] == 1 and result["accumulation"] == 2
    assert (Path(result["outputs"]["adapter"]) / "adapter_config.json").is_file()
    for shown in ("before", "after", "accuracy", "samples/s", "adapter"):
        assert shown in proc.stdout
    assert "Traceback" not in proc.stderr


def test_quickstart_two_processes_same_global_batch(one_process, tmp_path: Path) -> None:
    _, one = one_process
    _, two = _quickstart(tmp_path / "two", "--processes", "2")
    assert (two["world_size"], two["accumulation"], two["global_batch"]) == (2, 1, 32)
    # The same samples per optimizer step in the same order: the same training, up to
    # floating-point summation order across processes.
    assert abs(one["eval_metrics"]["eval_loss"] - two["eval_metrics"]["eval_loss"]) < 1e-3
    assert abs(one["eval_metrics"]["accuracy"] - two["eval_metrics"]["accuracy"]) <= 0.01
