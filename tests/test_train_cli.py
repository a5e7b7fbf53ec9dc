"""`xtrain train`: one command starts every planned process and matches `accelerate launch -m
xtrain.run` on the same config; its dry run prints the equivalent commands per shell; bad input
is one line."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from support.jobs import REPO, assert_same_training, make_job, run_xtrain

EXAMPLE = REPO / "examples" / "seq-cls.yaml"
STEPS = ["run.max_steps=12", "run.eval_every=null", "run.tensorboard=false", "batch.global_batch=32"]
XTRAIN = [sys.executable, "-m", "xtrain"]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return make_job(tmp_path_factory.mktemp("train-cli")).env


@pytest.mark.slow
def test_train_two_processes_matches_accelerate_launch(env: dict[str, str], tmp_path: Path) -> None:
    ours, theirs = tmp_path / "xtrain-train", tmp_path / "accelerate-launch"
    proc = run_xtrain(
        [*XTRAIN, "train", str(EXAMPLE), *STEPS, f"run.output_dir={ours}", "--processes", "2"], env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2"]
    proc = run_xtrain(
        [*launch, "-m", "xtrain.run", "--config", str(EXAMPLE), *STEPS, f"run.output_dir={theirs}"], env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_same_training(theirs, ours)


def test_dry_run_prints_the_commands_for_the_shell(env: dict[str, str]) -> None:
    linux = run_xtrain([*XTRAIN, "train", str(EXAMPLE), "--processes", "2", "--dry-run"], env)
    assert linux.returncode == 0, linux.stderr
    assert "accelerate launch --multi_gpu --num_processes 2" in linux.stdout
    assert "torchrun --nproc_per_node 2" in linux.stdout
    # the test's environment sets OMP_NUM_THREADS=1: the user's choice, said and left to torch (the
    # plan's own count, exported for 2 CPU processes without it: tests/test_cpu_threads.py)
    assert "Threads: OMP_NUM_THREADS=1 set in the environment" in linux.stdout
    windows = run_xtrain(
        [*XTRAIN, "train", str(EXAMPLE), "--processes", "2", "--dry-run", "--platform", "windows"], env
    )
    assert windows.returncode == 0, windows.stderr
    assert '$env:USE_LIBUV = "0"' in windows.stdout
    assert f"python -m xtrain.run --processes 2 --config {EXAMPLE}" in windows.stdout
    assert "export " not in windows.stdout


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["nope.yaml"], "config nope.yaml not found"),
        ([str(EXAMPLE), "run.max_steps"], "override 'run.max_steps' must look like section.key=value"),
        ([str(EXAMPLE), "--processes", "0"], "--processes must be at least 1"),
        ([str(EXAMPLE), "--gpus", "0,x"], "is not a list of GPU ids"),
        ([str(EXAMPLE), "batch.global_batch=48", "--processes", "2"], "global batch 48 is not divisible"),
        ([str(EXAMPLE), "lora.rank=4"], "did you mean 'lora.r'"),
    ],
)
def test_bad_input_is_one_line(env: dict[str, str], args: list[str], line: str) -> None:
    proc = run_xtrain([*XTRAIN, "train", *args, "--dry-run"], env)
    assert proc.returncode == 2
    assert line in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("text", ["compute_environment: [LOCAL\n", "a: " + "[" * 5000 + "]" * 5000 + "\n"])
def test_a_broken_accelerate_default_config_is_one_line_before_launch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys, text: str
) -> None:
    """accelerate's launcher reads its default config under HF_HOME and died with a YAML traceback
    (or RecursionError) on a broken one: xtrain train names the file first, and leaves it alone."""
    from xtrain.cli import main

    config = tmp_path / "accelerate" / "default_config.yaml"
    config.parent.mkdir()
    config.write_text(text)
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.delenv("XTRAIN_PLATFORM", raising=False)
    code = main(["train", str(REPO / "examples" / "seq-cls.yaml"), "--processes", "2", "--platform", "linux"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    assert f"error: accelerate's default config {config} cannot be read" in err
    assert config.read_text() == text
