"""Helpers for the multi-process training tests (test_launch_modes.py, test_resume.py): a tiny
job on disk (data files, YAML config), a subprocess runner that never leaves workers behind, and
the comparison of two runs' results."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from support import warm

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 300

# Tolerances between runs with different process counts (docs/training.md states them).
LOSS_REL = 1e-4
WEIGHT_ATOL = 1e-5

CONFIG = """\
model:
  name_or_path: {model}
  task: causal-lm
lora:
  r: 4
  alpha: 8
  dropout: 0.1
data:
  train: {root}/train.jsonl
  eval: {root}/eval.jsonl
  text_column: text
  max_length: 48
optim:
  lr: 0.005
  warmup_steps: 1
batch:
  per_device: 4
  global_batch: 8
run:
  max_steps: {steps}
  log_every: 1
  save_every: {save_every}
  keep_checkpoints: 3
  tensorboard: false
  seed: 7
"""


@dataclass
class Job:
    root: Path
    config: Path
    env: dict[str, str]


def make_job(root: Path, steps: int = 4, save_every: int = 2, model: str | None = None) -> Job:
    """Data files and a config in ``root``; the model is the built-in tiny llama, written to a
    folder first and then loaded from disk like any pretrained checkpoint."""
    from xtrain import builtin

    root.mkdir(parents=True, exist_ok=True)
    cache = root / "xtrain-cache"
    env = offline_env(root, cache)
    if model is None:
        model = str(builtin.ensure_builtin_model("builtin:tiny-llama", cache / "builtin"))
    stories = builtin.story_examples(72, seed=11)
    with open(root / "train.jsonl", "w", encoding="utf-8") as f:
        for row in stories[:64]:
            f.write(json.dumps(row) + "\n")
    with open(root / "eval.jsonl", "w", encoding="utf-8") as f:
        for row in stories[64:]:
            f.write(json.dumps(row) + "\n")
    config = root / "job.yaml"
    config.write_text(CONFIG.format(model=model, root=root, steps=steps, save_every=save_every))
    return Job(root=root, config=config, env=env)


# The HF_HOME of the jobs that need none of their own (set by conftest for the test session):
# no accelerate default config in it, ever (``offline_env`` checks), and one HF_HOME lets the
# jobs' commands share a warm interpreter (support/warm.py: imports read HF_HOME).
SHARED_HF_HOME: Path | None = None


def offline_env(root: Path, cache: Path) -> dict[str, str]:
    """The environment of a job's processes: offline, an HF_HOME without an accelerate default
    config (the session's shared one, else a private one under ``root``) and XTRAIN_CACHE, one
    thread each. A test that writes a default config gives its job an HF_HOME of its own."""
    hf_home = SHARED_HF_HOME if SHARED_HF_HOME is not None else root / "hf"
    assert not (hf_home / "accelerate").exists(), f"an accelerate config was written into {hf_home}"
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_HOME": str(hf_home),
        "XTRAIN_CACHE": str(cache),
        "OMP_NUM_THREADS": "1",  # same threads per process in every mode: fewer float differences
        "PYTHONWARNINGS": "ignore",
    }
    env.pop("XTRAIN_PLATFORM", None)
    env.pop("XTRAIN_FORCE_CPU_STAGED", None)
    return env


def session_builtin(tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    """The folder of built-in model ``name`` in the test session's shared cache (conftest's
    ``private_caches``): built once for every test and job that uses it."""
    from xtrain import builtin

    return builtin.ensure_builtin_model(
        name, tmp_path_factory.getbasetemp() / "offline-caches" / "xtrain" / "builtin"
    )


def task_job(root: Path, template: str, model: Path, rows: list[dict], n_train: int = 32) -> Job:
    """A job of the model folder ``model`` on ``rows`` (media files already in ``root``): the
    first ``n_train`` rows in ``train.jsonl``, the rest in ``eval.jsonl``, and ``template`` (YAML
    with ``{model}`` and ``{root}``) as ``job.yaml``."""
    cache = root / "xtrain-cache"
    lines = [json.dumps(r) + "\n" for r in rows]
    (root / "train.jsonl").write_text("".join(lines[:n_train]))
    (root / "eval.jsonl").write_text("".join(lines[n_train:]))
    config = root / "job.yaml"
    config.write_text(template.format(model=model, root=root))
    return Job(root=root, config=config, env=offline_env(root, cache))


def train_once(job: Job, name: str = "straight", *extra: str) -> tuple[Path, subprocess.CompletedProcess]:
    """``python -m xtrain.run [extra]`` on ``job`` into ``job.root / name``; it must succeed."""
    out = job.root / name
    proc = run_xtrain(python_run(*extra, "--config", str(job.config), f"run.output_dir={out}"), job.env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc


def logged_run(job: Job, name: str, *extra: str) -> tuple[Path, Path]:
    """``train_once`` with a fresh folder ``<name>-log`` in ``GRPO_TEST_LOG``, where the job's
    reward function writes what it scores (one file a rank): (the run's folder, the log's)."""
    log = job.root / f"{name}-log"
    log.mkdir()
    job.env["GRPO_TEST_LOG"] = str(log)
    return train_once(job, name, *extra)[0], log


def logged_lines(log: Path) -> list[str]:
    """Every rank's logged lines, sorted (the same set at any process count)."""
    return sorted(line for f in log.glob("rank*.txt") for line in f.read_text().splitlines())


def one_and_two_processes(job: Job, straight: Path) -> tuple[Path, dict, dict]:
    """``job`` again on 2 processes (into ``two``): (its folder, the one-process run's result, the
    two-process run's), both runs' global batch checked to be the same (2 x 1 against 1 x 2)."""
    out, _ = train_once(job, "two", "--processes", "2")
    one = json.loads((straight / "train_result.json").read_text())
    two = json.loads((out / "train_result.json").read_text())
    assert (two["world_size"], two["accumulation"], one["accumulation"]) == (2, 1, 2)
    return out, one, two


def start_xtrain(cmd: list[str], env: dict[str, str]) -> subprocess.Popen:
    """Start a command in its own process group (so all its workers can be killed at once); an
    ``xtrain``/``xtrain.run``/launcher command from a warm interpreter (support/warm.py)."""
    return warm.popen(
        cmd,
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def kill_group(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)


def run_xtrain(
    cmd: list[str], env: dict[str, str], timeout: float = TIMEOUT_S
) -> subprocess.CompletedProcess:
    proc = start_xtrain(cmd, env)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        out, err = proc.communicate()
        raise AssertionError(f"timed out after {timeout}s: {' '.join(cmd)}\n{err[-3000:]}") from None
    finally:
        kill_group(proc)  # workers left behind by a failed launcher
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def run_until(
    cmd: list[str], env: dict[str, str], ready: Callable[[], bool], timeout: float = TIMEOUT_S
) -> int:
    """Start ``cmd``, SIGKILL its whole process group as soon as ``ready()``; returns the exit code
    (-9 when it was killed)."""
    proc = start_xtrain(cmd, env)
    deadline = time.monotonic() + timeout
    try:
        while proc.poll() is None:
            if ready():
                kill_group(proc)
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out: {' '.join(cmd)}")
            time.sleep(0.01)
        proc.communicate(timeout=60)
    finally:
        kill_group(proc)
    return proc.returncode


def python_run(*args: str) -> list[str]:
    return [sys.executable, "-m", "xtrain.run", *args]


# The ways to start `xtrain.run` with 2 CPU processes that every task must agree on
# (test_launch_modes.py for causal-lm, test_speech_to_text.py for speech-to-text).
TWO_PROCESSES = {
    "spawn": [sys.executable, "-m", "xtrain.run", "--processes", "2"],
    "torchrun": [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m", "xtrain.run"],
    "accelerate": [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "xtrain.run",
    ],
    # the design card's command, with the default config `xtrain configure --processes 2` writes
    "accelerate-config": [sys.executable, "-m", "accelerate.commands.launch", "-m", "xtrain.run"],
}  # fmt: skip


def two_process_command(mode: str, root: Path, env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """The command and environment of launch mode ``mode`` (a key of ``TWO_PROCESSES``);
    ``accelerate-config`` first writes accelerate's default config with ``xtrain configure``
    into a private ``HF_HOME`` under ``root``."""
    env = dict(env)
    if mode == "accelerate-config":
        env["HF_HOME"] = str(root / "hf-configured")
        configure = run_xtrain([sys.executable, "-m", "xtrain", "configure", "--processes", "2"], env)
        assert configure.returncode == 0, configure.stderr
    return list(TWO_PROCESSES[mode]), env


def adapter_weights(out: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(out / "adapter" / "adapter_model.safetensors"))


def assert_same_training(ref: Path, out: Path, exact: bool = False) -> None:
    """Same loss trajectory, final eval metrics (its loss; GRPO: its reward, it has no eval loss)
    and adapter weights (bitwise when ``exact``)."""
    import torch

    a = json.loads((ref / "train_result.json").read_text())
    b = json.loads((out / "train_result.json").read_text())
    assert [s for s, _ in a["losses"]] == [s for s, _ in b["losses"]]
    # the curves: each window's logged values continue as the loss does (a resumed run's are the
    # uninterrupted run's), and the picture drawn from them is there
    assert [h["step"] for h in a["log_history"]] == [h["step"] for h in b["log_history"]]
    lrs = [h["lr"] for h in a["log_history"]]
    assert [h["lr"] for h in b["log_history"]] == pytest.approx(lrs, rel=1e-6)
    assert (ref / "curves.png").is_file() and (out / "curves.png").is_file()
    if exact:
        assert a["losses"] == b["losses"]
        assert a["eval_metrics"] == b["eval_metrics"]
    else:
        for (_, la), (_, lb) in zip(a["losses"], b["losses"], strict=True):
            assert lb == pytest.approx(la, rel=LOSS_REL)
        assert a["eval_metrics"].keys() == b["eval_metrics"].keys()
        # the eval loss, else GRPO's reward, else distillation's KL to the teacher
        key = next(k for k in ("eval_loss", "reward", "kl") if k in a["eval_metrics"])
        assert b["eval_metrics"][key] == pytest.approx(a["eval_metrics"][key], rel=LOSS_REL)
    wa, wb = adapter_weights(ref), adapter_weights(out)
    assert wa.keys() == wb.keys()
    for k in wa:
        if exact:
            assert torch.equal(wa[k], wb[k]), k
        else:
            torch.testing.assert_close(wb[k], wa[k], rtol=0, atol=WEIGHT_ATOL)


_QUICKSTARTS: dict[tuple[Path, tuple[str, ...]], tuple[subprocess.CompletedProcess, Path]] = {}


def session_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder every test process of this session shares: the session's base temporary folder,
    or under xdist the one above the workers' own (pytest-xdist's recipe for a session fixture
    built once)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def session_quickstart(
    tmp_path_factory: pytest.TempPathFactory, *args: str
) -> tuple[subprocess.CompletedProcess, Path]:
    """``xtrain quickstart [args]`` run once for the test session, whichever test process asks
    first (the others wait on a lock and read its output), offline, with the session's shared
    built-in cache: its output and its run folder, for every module that tests on it (the
    quickstart's own checks, ``xtrain chat``, predict on a chat run, the llama.cpp export)."""
    from filelock import FileLock

    root = session_root(tmp_path_factory)
    key = (root, args)
    if key in _QUICKSTARTS:
        return _QUICKSTARTS[key]
    folder = root / ("quickstart" + "".join(f"-{a.strip('-')}" for a in args))
    folder.mkdir(parents=True, exist_ok=True)
    done = folder / "done.json"
    with FileLock(str(folder / "lock")):
        if not done.is_file():
            env = {**offline_env(folder, root / "offline-caches" / "xtrain"), "COLUMNS": "160"}
            cmd = [sys.executable, "-m", "xtrain", "quickstart", "--output-dir", str(folder / "qs"), *args]
            proc = run_xtrain(cmd, env, timeout=600)
            assert proc.returncode == 0, proc.stderr[-3000:]
            saved = {"args": proc.args, "stdout": proc.stdout, "stderr": proc.stderr}
            done.write_text(json.dumps(saved), encoding="utf-8")
    saved = json.loads(done.read_text(encoding="utf-8"))
    proc = subprocess.CompletedProcess(saved["args"], 0, saved["stdout"], saved["stderr"])
    (run,) = sorted(p for p in (folder / "qs").iterdir() if p.is_dir())
    _QUICKSTARTS[key] = (proc, run)
    return _QUICKSTARTS[key]
