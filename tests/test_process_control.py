"""Process control with real processes (2 gloo CPU ranks): no public socket, no orphans, stop
codes and lines.

Each test starts one real run that stays inside the training loop (tests/fault_task.py,
FAULT=slow: rank 0 sleeps in every forward pass once it touched a marker file), looks at it from
the outside (the OS's list of listening sockets, the process tree), then signals or kills it the
way a user or a scheduler would:

- `python -m xtrain.run --processes 2` (spawn, FileStore rendezvous): every listening socket of
  the whole process tree is on loopback; SIGTERM to the launcher alone -> the ranks stop at the
  next step, save, exit 143 with one line naming the stop checkpoint;
- `xtrain train --processes 2` (accelerate launch, torchrun's agent in-process): loopback only
  (also the agent's store); Ctrl+C (SIGINT to the group) -> 130 and the line;
- SIGKILL of `xtrain train`'s process group (torchrun's workers sit in sessions of their own):
  every worker is gone within LIFETIME_S and nothing more is written;
- a second Ctrl+C stops at once and says so, no `.tmp` left behind as the newest checkpoint.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from support import warm
from support.jobs import REPO, Job, make_job, python_run

pytestmark = pytest.mark.slow

CUSTOM = ["model.task=custom", "model.custom=fault_task:build"]
START_S = 150  # until the loop runs (2 busy cores, other tests beside)
LIFETIME_S = 10  # workers end this soon after their launcher is killed
STOP_S = 60  # a stop at the next step boundary, with a checkpoint write


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Job:
    job = make_job(tmp_path_factory.mktemp("proc"), steps=400, save_every=1000)
    job.env["PYTHONPATH"] = str(REPO / "tests")
    return job


class Run:
    """A command started in its own session with its output in files (no pipe to fill)."""

    def __init__(self, cmd: list[str], env: dict[str, str], folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.out, self.err = folder / "stdout.txt", folder / "stderr.txt"
        with open(self.out, "w") as o, open(self.err, "w") as e:
            self.proc = warm.popen(cmd, cwd=REPO, env=env, stdout=o, stderr=e, start_new_session=True)

    def wait_for(self, marker: Path, timeout: float = START_S) -> None:
        deadline = time.monotonic() + timeout
        while not marker.exists():
            assert self.proc.poll() is None, f"ended early ({self.proc.returncode}): {self.stderr()[-3000:]}"
            assert time.monotonic() < deadline, f"not in the loop after {timeout}s: {self.stderr()[-3000:]}"
            time.sleep(0.1)

    def tree(self) -> list[psutil.Process]:
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(self.proc.pid)
            return [root, *root.children(recursive=True)]
        return []

    def finish(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running after {timeout}s: {self.stderr()[-3000:]}") from None

    def stderr(self) -> str:
        return self.err.read_text(errors="replace")

    def cleanup(self, pids: list[int]) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        for pid in pids:
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()


def start(job: Job, name: str, cmd: list[str]) -> tuple[Run, Path, Path]:
    out = job.root / name
    marker = job.root / f"{name}.in-loop"
    env = {**job.env, "FAULT": "slow", "FAULT_AT": "3", "FAULT_MARKER": str(marker)}
    return Run(cmd, env, job.root / f"{name}-logs"), out, marker


def run_args(job: Job, out: Path) -> list[str]:
    return ["--config", str(job.config), f"run.output_dir={out}", "run.resume=auto", *CUSTOM]


def xtrain_train(job: Job, out: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "xtrain", "train", str(job.config), *extra,
        f"run.output_dir={out}", "run.resume=auto", *CUSTOM,
    ]  # fmt: skip


def listening(procs: list[psutil.Process]) -> list[tuple[int, str, int]]:
    """(pid, address, port) of every listening TCP socket of these processes, from the OS."""
    found = []
    for p in procs:
        with contextlib.suppress(psutil.Error):
            for c in p.net_connections(kind="tcp"):
                if c.status == psutil.CONN_LISTEN:
                    found.append((p.pid, c.laddr.ip, c.laddr.port))
    return found


def assert_loopback_only(procs: list[psutil.Process]) -> None:
    sockets = listening(procs)
    public = [s for s in sockets if not ipaddress.ip_address(s[1].split("%")[0]).is_loopback]
    assert public == [], f"listening beyond loopback: {public} (all: {sockets})"


def assert_all_gone(pids: list[int]) -> None:
    procs = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            procs.append(psutil.Process(pid))
    _, alive = psutil.wait_procs(procs, timeout=LIFETIME_S)
    assert alive == [], [(p.pid, p.cmdline()) for p in alive]


def stop_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith(("stopped", "second Ctrl+C", "error: "))]


def saved_one_stop_checkpoint(stderr: str, out: Path) -> str:
    """One stop line naming the stop checkpoint, which is the newest and complete; returns it."""
    (line,) = stop_lines(stderr)
    assert line.startswith("stopped at step ") and "checkpoint saved to " in line, line
    newest_is_complete(out, line)
    return line


def newest_is_complete(out: Path, step_line: str) -> None:
    steps = sorted((out / "checkpoints").iterdir(), key=lambda p: p.stat().st_mtime)
    assert steps and not steps[-1].name.endswith(".tmp"), [p.name for p in steps]
    assert str(steps[-1]) in step_line and (steps[-1] / "xtrain_state.json").is_file()


def test_spawn_listens_on_loopback_only_and_sigterm_saves_143(job: Job) -> None:
    out = job.root / "spawn-term"
    run, out, marker = start(job, "spawn-term", python_run("--processes", "2", *run_args(job, out)))
    pids: list[int] = []
    try:
        run.wait_for(marker)
        procs = run.tree()
        pids = [p.pid for p in procs]
        assert len(procs) >= 3, procs  # the launcher and two ranks
        assert_loopback_only(procs)
        os.kill(run.proc.pid, signal.SIGTERM)  # the launcher alone, as a scheduler would
        assert run.finish(STOP_S) == 143, run.stderr()[-3000:]
    finally:
        run.cleanup(pids)
    err = run.stderr()
    assert "Traceback" not in err
    saved_one_stop_checkpoint(err, out)
    assert_all_gone(pids)
    # stderr is a file: no ANSI codes, no live bar, progress as plain lines, paths whole
    assert "\x1b[" not in err and "…" not in err
    assert re.search(r"^  step \d+/400 \(\d+%\)  loss \d", err, re.M), err[-2000:]
    assert f"-> {out}\n" in err


def test_xtrain_train_listens_on_loopback_only_and_ctrl_c_saves_130(job: Job) -> None:
    out = job.root / "acc-int"
    run, out, marker = start(job, "acc-int", xtrain_train(job, out, "--processes", "2"))
    pids: list[int] = []
    try:
        run.wait_for(marker)
        procs = run.tree()
        pids = [p.pid for p in procs]
        assert_loopback_only(procs)  # the agent's store too: it lives in the xtrain process
        assert listening(procs[:1]), "the agent's TCPStore should be listening (on loopback)"
        # Ctrl+C: the terminal signals the foreground group (torchrun's workers are not in it)
        os.killpg(run.proc.pid, signal.SIGINT)
        assert run.finish(STOP_S) == 130, run.stderr()[-3000:]
    finally:
        run.cleanup(pids)
    err = run.stderr()
    assert "Traceback" not in err and "death signal" not in err
    saved_one_stop_checkpoint(err, out)


def test_killing_the_launchers_group_ends_every_worker(job: Job) -> None:
    """torchrun puts each worker in a session of its own: `kill -9 -PGID` does not reach them.
    They watch their launcher (PR_SET_PDEATHSIG + a watch thread) and die with it."""
    out = job.root / "acc-kill"
    run, out, marker = start(job, "acc-kill", xtrain_train(job, out, "--processes", "2"))
    workers: list[psutil.Process] = []
    try:
        run.wait_for(marker)
        workers = run.tree()[1:]
        assert len(workers) >= 2, workers
        os.killpg(run.proc.pid, signal.SIGKILL)
        run.finish(STOP_S)
        gone, alive = psutil.wait_procs(workers, timeout=LIFETIME_S)
        assert alive == [], f"workers outlived their launcher: {alive}"
    finally:
        run.cleanup([w.pid for w in workers])
    before = sorted((p, p.stat().st_mtime_ns) for p in out.rglob("*"))
    time.sleep(1.0)
    assert sorted((p, p.stat().st_mtime_ns) for p in out.rglob("*")) == before  # nothing more written


def test_second_ctrl_c_stops_at_once(job: Job) -> None:
    out = job.root / "twice"
    run, out, marker = start(job, "twice", python_run("--processes", "2", *run_args(job, out)))
    pids: list[int] = []
    try:
        run.wait_for(marker)
        pids = [p.pid for p in run.tree()]
        os.killpg(run.proc.pid, signal.SIGINT)
        time.sleep(0.05)  # inside the current step (0.2 s of sleep): the stop has not happened yet
        os.killpg(run.proc.pid, signal.SIGINT)
        assert run.finish(LIFETIME_S) == 130, run.stderr()[-3000:]
    finally:
        run.cleanup(pids)
    err = run.stderr()
    assert "Traceback" not in err
    (line,) = stop_lines(err)
    assert line.startswith("second Ctrl+C: stopped at once;"), line
    assert not (out / "checkpoints").exists() or not list((out / "checkpoints").glob("*.tmp"))


def test_one_process_xtrain_train_sigterm_saves_143(job: Job) -> None:
    """World size 1: `xtrain train` runs one plain child; SIGTERM to `xtrain train` alone is
    passed on and waited for (not a kill of the child, as subprocess.call does on Ctrl+C)."""
    out = job.root / "one-term"
    run, out, marker = start(job, "one-term", xtrain_train(job, out, "--processes", "1"))
    pids: list[int] = []
    try:
        run.wait_for(marker)
        pids = [p.pid for p in run.tree()]
        os.kill(run.proc.pid, signal.SIGTERM)
        assert run.finish(STOP_S) == 143, run.stderr()[-3000:]
    finally:
        run.cleanup(pids)
    err = run.stderr()
    assert "Traceback" not in err
    saved_one_stop_checkpoint(err, out)
    assert_all_gone(pids)


def test_sigterm_before_the_loop_says_nothing_was_written(job: Job) -> None:
    """`python -m xtrain.run` (one process, no launcher) stopped while it builds the model: exit
    143 and one line saying no checkpoint was written, instead of dying silently by the signal."""
    out = job.root / "early"
    marker = job.root / "early.building"
    env = {**job.env, "FAULT": "stall-build", "FAULT_MARKER": str(marker)}
    run = Run(python_run(*run_args(job, out)), env, job.root / "early-logs")
    try:
        run.wait_for(marker)
        os.kill(run.proc.pid, signal.SIGTERM)
        assert run.finish(STOP_S) == 143, run.stderr()[-3000:]
    finally:
        run.cleanup([])
    err = run.stderr()
    assert "Traceback" not in err
    assert stop_lines(err) == [
        "stopped on SIGTERM; no checkpoint was written (run the same command again to start over)"
    ]
    assert not (out / "checkpoints").exists()


# -- launchers the user starts: torchrun, accelerate launch ------------------------------------------
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m", "xtrain.run"]
ACCELERATE_ONE = [
    sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1",
    "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "xtrain.run",
]  # fmt: skip


def assert_resumes(job: Job, out: Path, line: str) -> None:
    """The stop checkpoint is one a run resumes from (one plain process, 2 more steps)."""
    import json

    from support.jobs import run_xtrain

    step = int(re.search(r"stopped at step (\d+)", line).group(1))
    proc = run_xtrain(python_run(*run_args(job, out), f"run.max_steps={step + 2}"), job.env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "train_result.json").read_text())
    assert result["resumed_from"].endswith(f"step-{step}") and result["final_step"] == step + 2


def test_user_started_torchrun_ctrl_c_stops_the_workers_cleanly(job: Job) -> None:
    """Ctrl+C on `torchrun -m xtrain.run`: torchrun's agent forwards SIGINT to the workers (their
    own sessions), which stop at the next step, save, and rank 0 prints the one line; then the
    agent re-raises its SignalException: exit 1 with its traceback (torchrun's code, not xtrain's:
    docs/reliability.md). If torch changes that, this test says so and the docs must follow."""
    out = job.root / "torchrun-int"
    run, out, marker = start(job, "torchrun-int", [*TORCHRUN, *run_args(job, out)])
    pids: list[int] = []
    try:
        run.wait_for(marker)
        pids = [p.pid for p in run.tree()]
        os.killpg(run.proc.pid, signal.SIGINT)  # the terminal's Ctrl+C: the launcher's group
        assert run.finish(STOP_S) == 1, run.stderr()[-3000:]
    finally:
        run.cleanup(pids)
    err = run.stderr()
    assert "SignalException: Process" in err and "got signal: 2" in err  # torchrun's own ending
    line = saved_one_stop_checkpoint(err, out)
    assert_all_gone(pids)
    assert_resumes(job, out, line)


def test_sigterm_to_one_process_accelerate_launch_stops_with_a_checkpoint(job: Job) -> None:
    """`accelerate launch` with one process runs it as a plain child and installs no handler:
    SIGTERM to accelerate alone ends accelerate at once (-15) and reaches nobody else. The worker
    sees its parent gone (xtrain.runtime.lifetime), stops as on SIGTERM and saves, instead of
    training on alone (as it did before) or dying without a checkpoint."""
    out = job.root / "acc-one-term"
    env_job = Job(job.root, job.config, {**job.env, "HF_HOME": str(job.root / "hf-none")})  # no config
    run, out, marker = start(env_job, "acc-one-term", [*ACCELERATE_ONE, *run_args(job, out)])
    pids: list[int] = []
    try:
        run.wait_for(marker)
        pids = [p.pid for p in run.tree()]
        assert len(pids) == 2, pids  # accelerate and the one worker
        os.kill(run.proc.pid, signal.SIGTERM)
        assert run.finish(STOP_S) == -signal.SIGTERM
        assert_all_gone(pids[1:])  # within LIFETIME_S of accelerate's end, after saving
    finally:
        run.cleanup(pids)
    err = run.stderr()
    assert "Traceback" not in err
    saved_one_stop_checkpoint(err, out)
