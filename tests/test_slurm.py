"""The sbatch script of `xtrain configure --slurm` under a real one-node SLURM (skipped where SLURM
is not installed): the CPU plan's script runs unedited and trains the tiny built-in job; a job told
that its time limit is near saves a checkpoint, is requeued and resumes from it (soak).

tests/support/slurm.py starts munged, slurmctld and slurmd with a temporary slurm.conf (or uses a
SLURM that answers ``sinfo``). The time-limit signal is sent the way ``#SBATCH
--signal=B:USR1@N`` sends it (``scancel --signal=USR1 --batch``), without waiting for a limit.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import slurm as slurm_support
from support.jobs import Job, make_job

from xtrain.cli import main


@pytest.fixture(scope="module")
def slurm() -> Iterator[slurm_support.Slurm]:
    with slurm_support.start() as running:
        yield running


def cpu_script(job: Job, capsys: pytest.CaptureFixture[str]) -> Path:
    """`xtrain configure --slurm` planned from this machine's facts (no GPU here)."""
    from xtrain.machine import probe

    facts = probe.collect(quick=True)
    assert not facts.gpus, "this test is for a machine without GPUs"
    (job.root / "node.json").write_text(facts.to_json(), encoding="utf-8")
    args = ["configure", "--facts", str(job.root / "node.json"), "--slurm", str(job.root / "job.sbatch"),
            "--nodes", "1", "--output", str(job.root / "job.accelerate.yaml")]  # fmt: skip
    assert main(args) == 0, capsys.readouterr().err
    capsys.readouterr()
    return job.root / "job.sbatch"


def job_env(job: Job) -> dict[str, str]:
    env = dict(job.env)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])  # accelerate
    return env


def log_of(job: Job, job_id: str) -> str:
    path = job.root / f"xtrain-{job_id}.out"
    return path.read_text(errors="replace") if path.exists() else ""


@pytest.mark.slow
def test_cpu_plan_script_trains_unedited(slurm, tmp_path, capsys):
    job = make_job(tmp_path / "job", steps=2, save_every=2)
    script = cpu_script(job, capsys)
    text = script.read_text()
    assert "--gpus" not in text  # a CPU-only SLURM would refuse or hold a job that asks for GPUs
    assert "#SBATCH --signal=B:USR1@" in text and "#SBATCH --requeue" in text
    assert "MAIN_PORT=29500" not in text and "SLURM_JOB_ID % " in text
    out = job.root / "out"
    args = ["--config", str(job.config), f"run.output_dir={out}"]
    job_id = slurm.submit(script, args, job_env(job), job.root)
    state = slurm.wait(job_id, timeout_s=240)
    log = log_of(job, job_id)
    assert state["JobState"] == "COMPLETED" and state["ExitCode"] == "0:0", log[-3000:]
    result = json.loads((out / "train_result.json").read_text())
    assert result["final_step"] == 2
    assert (out / "adapter" / "adapter_config.json").exists()
    assert "done step 2" in log


@pytest.mark.soak
def test_a_job_near_its_time_limit_saves_is_requeued_and_resumes(slurm, tmp_path, capsys):
    steps = 400
    job = make_job(tmp_path / "job", steps=steps, save_every=1000)
    script = cpu_script(job, capsys)
    out = job.root / "out"
    args = ["--config", str(job.config), f"run.output_dir={out}", "run.eval_every=null"]
    job_id = slurm.submit(script, args, job_env(job), job.root)
    deadline = time.monotonic() + 180
    while "trainable parameters" not in log_of(job, job_id):
        assert time.monotonic() < deadline, log_of(job, job_id)[-3000:]
        time.sleep(0.5)
    time.sleep(2)  # a few steps in
    # what `#SBATCH --signal=B:USR1@N` does N seconds before the limit
    sent = slurm.run("scancel", "--signal=USR1", "--batch", job_id)
    assert sent.returncode == 0, sent.stderr
    state = slurm.wait(job_id, timeout_s=400)
    log = log_of(job, job_id)
    assert state["JobState"] == "COMPLETED" and state["Restarts"] == "1", log[-3000:]
    stopped = re.search(r"stopped at step (\d+); checkpoint saved", log)
    assert stopped and 0 < int(stopped.group(1)) < steps, log[-3000:]
    assert f"resuming from {out / 'checkpoints' / ('step-' + stopped.group(1))}" in log
    assert json.loads((out / "train_result.json").read_text())["final_step"] == steps
