"""SIGKILL a training after some step, resume with `resume=auto`, and end with the weights of a
run that was never interrupted: bitwise in one process on CPU, within the stated tolerance with
two, and also when the resumed run uses a different number of processes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from support.jobs import Job, assert_same_training, make_job, python_run, run_until, run_xtrain

pytestmark = pytest.mark.slow

STEPS = 16
KILL_AFTER = 4  # kill as soon as checkpoint step-4 is complete (saves every 2 steps)


@pytest.fixture(scope="module")
def long_job(tmp_path_factory: pytest.TempPathFactory) -> Job:
    return make_job(tmp_path_factory.mktemp("resume"), steps=STEPS, save_every=2)


@pytest.fixture(scope="module")
def uninterrupted(long_job: Job) -> Path:
    out = long_job.root / "straight"
    proc = run_xtrain(python_run("--config", str(long_job.config), f"run.output_dir={out}"), long_job.env)
    assert proc.returncode == 0, proc.stderr
    return out


def _kill_then_resume(job: Job, out: Path, first: list[str], second: list[str]) -> dict:
    args = ["--config", str(job.config), f"run.output_dir={out}", "run.resume=auto"]
    marker = out / "checkpoints" / f"step-{KILL_AFTER}" / "xtrain_state.json"
    code = run_until([*first, *args], job.env, marker.exists)
    assert code == -9, "the run finished before it could be killed"
    done = (out / "checkpoints").glob("step-*")
    steps = sorted(int(p.name.split("-")[1]) for p in done if "." not in p.name)
    assert steps and steps[-1] < STEPS  # killed mid-run, some checkpoint kept
    assert not (out / "adapter").exists()
    proc = run_xtrain([*second, *args], job.env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "train_result.json").read_text())
    assert result["resumed_from"] and result["final_step"] == STEPS
    return result


def test_one_process_resume_is_bitwise(long_job: Job, uninterrupted: Path) -> None:
    out = long_job.root / "kill-1-1"
    _kill_then_resume(long_job, out, python_run(), python_run())
    assert_same_training(uninterrupted, out, exact=True)


def test_two_processes_killed_resume_on_two(long_job: Job, uninterrupted: Path) -> None:
    out = long_job.root / "kill-2-2"
    two = python_run("--processes", "2")
    result = _kill_then_resume(long_job, out, two, two)
    assert result["world_size"] == 2
    assert_same_training(uninterrupted, out)


def test_two_processes_killed_resume_on_one(long_job: Job, uninterrupted: Path) -> None:
    out = long_job.root / "kill-2-1"
    result = _kill_then_resume(long_job, out, python_run("--processes", "2"), python_run())
    assert result["world_size"] == 1 and result["accumulation"] == 2
    assert_same_training(uninterrupted, out)


def test_one_process_killed_resume_on_two_with_torchrun(long_job: Job, uninterrupted: Path) -> None:
    out = long_job.root / "kill-1-2"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m", "xtrain.run"]
    result = _kill_then_resume(long_job, out, python_run(), torchrun)
    assert result["world_size"] == 2 and result["accumulation"] == 1
    assert_same_training(uninterrupted, out)


def test_ctrl_c_under_spawn_saves_and_exits_130(long_job: Job, uninterrupted: Path) -> None:
    """Ctrl+C reaches every process of the terminal's group: the workers stop at the next step
    boundary, save a checkpoint, and the command exits 130 with one line; the next run resumes."""
    import signal

    from support.jobs import kill_group, start_xtrain

    out = long_job.root / "ctrl-c"
    args = ["--config", str(long_job.config), f"run.output_dir={out}"]
    marker = out / "checkpoints" / "step-2" / "xtrain_state.json"
    proc = start_xtrain(python_run("--processes", "2", *args), long_job.env)
    try:
        import time

        deadline = time.monotonic() + 300
        while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        kill_group(proc, signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        kill_group(proc)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err
    stopped = [ln for ln in err.splitlines() if ln.startswith("stopped at step")]
    assert len(stopped) == 1, err[-3000:]
    step = int(stopped[0].split()[3].rstrip(";"))
    assert (out / "checkpoints" / f"step-{step}" / "xtrain_state.json").is_file()
    proc2 = run_xtrain(python_run(*args), long_job.env)
    assert proc2.returncode == 0, proc2.stderr[-3000:]
    assert_same_training(uninterrupted, out)


@pytest.mark.soak  # three runs (~30 s): the mix's seeding is checked in-process in test_data_reading
def test_several_files_interleaved_resume_exactly(tmp_path: Path) -> None:
    """data.train as two files interleaved by shares (data.mix), trained on two processes, killed
    after step 4 and resumed on one: the weights are those of the one-process run never
    interrupted (the mix is made the same in every process and again at the resume)."""
    job = make_job(tmp_path, steps=8, save_every=2)
    rows = (job.root / "train.jsonl").read_text().splitlines()
    (job.root / "a.jsonl").write_text("\n".join(rows[:40]) + "\n")
    (job.root / "b.jsonl").write_text("\n".join(rows[40:]) + "\n")
    mix = [f"data.train=[{job.root / 'a.jsonl'},{job.root / 'b.jsonl'}]", "data.mix=interleave_over"]
    mix += ["data.mix_probs=[0.7,0.3]", "data.max_samples=30"]
    straight = job.root / "straight"
    proc = run_xtrain(python_run("--config", str(job.config), f"run.output_dir={straight}", *mix), job.env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = job.root / "killed"
    args = ["--config", str(job.config), f"run.output_dir={out}", "run.resume=auto", *mix]
    marker = out / "checkpoints" / "step-4" / "xtrain_state.json"
    assert run_until(python_run("--processes", "2", *args), job.env, marker.exists) == -9
    proc = run_xtrain(python_run(*args), job.env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "train_result.json").read_text())
    assert result["resumed_from"] and result["final_step"] == 8 and result["world_size"] == 1
    assert_same_training(straight, out)
