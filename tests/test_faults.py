"""The fault suite: what a run does when things go wrong, with real processes on CPU.

Faults enter through the public custom-task hook (tests/fault_task.py: the causal-lm task plus
one injected fault), never through switches in the library:

- a loss that turns NaN: the run stops with one line naming the step and the last good
  checkpoint, exit 3, and no NaN weights are ever written;
- out of memory: one line naming per-device batch, global batch, accumulation and the fix;
- SIGKILL inside a checkpoint write: the previous checkpoint stays loadable, the partial
  ``step-N.tmp`` is ignored and removed by the next start, which resumes bitwise;
- SIGKILL at several seeded random points of one training, each followed by a resume: the
  final weights are bitwise those of an uninterrupted run (1 process, CPU);
- one rank of a 2-process run killed, under xtrain's two launchers (spawn, accelerate launch):
  the command ends non-zero within the test's timeout naming the rank, the last checkpoint intact.
"""

from __future__ import annotations

import json
import math
import random
import re
import sys
from pathlib import Path

import pytest
import torch
from support.jobs import REPO, Job, assert_same_training, make_job, python_run, run_until, run_xtrain

from xtrain.errors import XtrainError

STEPS = 8
CUSTOM = ["model.task=custom", "model.custom=fault_task:build"]
BOUNDED_S = 120  # a failed multi-process run must end well within this


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Job:
    job = make_job(tmp_path_factory.mktemp("faults"), steps=STEPS, save_every=2)
    job.env["PYTHONPATH"] = str(REPO / "tests")
    return job


def fault_env(job: Job, **values: object) -> dict[str, str]:
    return {**job.env, **{k: str(v) for k, v in values.items()}}


def run_args(job: Job, out: Path, *extra: str) -> list[str]:
    return ["--config", str(job.config), f"run.output_dir={out}", "run.resume=auto", *CUSTOM, *extra]


def error_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith("error: ")]


def complete_steps(out: Path) -> list[int]:
    return sorted(
        int(p.name.split("-")[1]) for p in (out / "checkpoints").glob("step-*") if "." not in p.name
    )


def assert_loadable(checkpoint: Path) -> None:
    """A complete checkpoint: state file readable, weights finite and loadable."""
    from safetensors.torch import load_file

    state = json.loads((checkpoint / "xtrain_state.json").read_text())
    assert state["step"] == int(checkpoint.name.split("-")[1])
    weights = load_file(str(checkpoint / "model.safetensors"))
    assert weights and all(torch.isfinite(w).all() for w in weights.values())


@pytest.fixture(scope="module")
def uninterrupted(job: Job) -> Path:
    out = job.root / "straight"
    proc = run_xtrain(python_run(*run_args(job, out)), job.env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


# -- non-finite loss --------------------------------------------------------------------------------
@pytest.mark.slow
def test_persistent_nan_stops_with_the_last_good_checkpoint(job: Job) -> None:
    """The loss turns NaN in step 4 (forward 7 of 2 per step): the checkpoint of step 2 is the
    last good one, nothing after it is written, the command says so in one line and exits 3."""
    out = job.root / "nan"
    proc = run_xtrain(python_run(*run_args(job, out)), fault_env(job, FAULT="nan", FAULT_AT=7))
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    (line,) = error_lines(proc.stderr)
    assert "the loss is not finite since step 4" in line, line
    assert f"last good checkpoint: {out / 'checkpoints' / 'step-2'}" in line, line
    assert complete_steps(out) == [2]
    assert_loadable(out / "checkpoints" / "step-2")
    assert not (out / "adapter").exists() and not (out / "train_result.json").exists()
    assert not list((out / "checkpoints").glob("*.tmp"))


def test_nan_between_log_points_never_reaches_a_save(tmp_path: Path) -> None:
    """With log_every larger than the run, the only host syncs are the saves: the weight check
    before each save stops the run before NaN weights are written (in-process, 1 process)."""
    from test_loop import build_tiny, cpu_plan, tiny_config

    from xtrain.train.loop import NonFiniteLoss, train

    def build_nan_after_first_step(run, mpf):
        workload = build_tiny(run, mpf)
        calls = [0]

        def after(module, args, kwargs, output):
            calls[0] += 1
            if calls[0] > 2:  # step 1 (2 micro-batches) is finite, then NaN
                output.loss = output.loss * math.nan
            return output

        workload.model.register_forward_hook(after, with_kwargs=True)
        return workload

    out = tmp_path / "run"
    cfg = tiny_config(out, max_steps=4, save_every=1, log_every=100)
    with pytest.raises(NonFiniteLoss) as info:
        train(cfg, cpu_plan(), build=build_nan_after_first_step)
    assert info.value.exit_code == 3 and info.value.step == 2
    assert "the weights are NaN/inf" in info.value.message
    assert info.value.last_good == out / "checkpoints" / "step-1"
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step-1"]
    assert not (out / "adapter").exists()


def test_overflow_skips_are_counted_not_fatal(tmp_path: Path) -> None:
    """Skipped optimizer steps (what the fp16 scaler does on overflow) are counted in the result
    and the checkpoints; a short run of non-finite losses below the limit does not stop it."""
    from test_loop import build_tiny, cpu_plan, tiny_config

    from xtrain.train import loop

    def build_two_bad_steps(run, mpf):
        workload = build_tiny(run, mpf)
        calls = [0]

        def after(module, args, kwargs, output):
            if module.training:
                calls[0] += 1
                if calls[0] in (3, 4):  # step 2's two micro-batches overflow
                    output.loss = output.loss * math.inf
            return output

        workload.model.register_forward_hook(after, with_kwargs=True)
        return workload

    class SkipNonFinite(torch.optim.AdamW):
        """What fp16's GradScaler does (there is none on CPU): a step whose gradients are not
        finite is skipped; accelerate reports it through ``step_was_skipped``."""

        skipped = False

        def step(self, closure=None):
            grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
            self.skipped = not all(bool(torch.isfinite(g).all()) for g in grads)
            return None if self.skipped else super().step(closure)

    from accelerate.optimizer import AcceleratedOptimizer

    original = loop.build_optimizer
    mp = pytest.MonkeyPatch()
    mp.setattr(loop, "build_optimizer", lambda *a: SkipNonFinite(original(*a).param_groups))
    mp.setattr(AcceleratedOptimizer, "step_was_skipped", property(lambda self: self.optimizer.skipped))
    try:
        out = tmp_path / "run"
        result = loop.train(tiny_config(out, max_steps=5, log_every=1), cpu_plan(), build=build_two_bad_steps)
    finally:
        mp.undo()
    assert result.skipped_steps == 1
    assert math.isinf(result.losses[1][1]) and all(math.isfinite(v) for _, v in result.losses[2:])
    state = json.loads((out / "checkpoints" / "step-5" / "xtrain_state.json").read_text())
    assert state["skipped_steps"] == 1


# -- out of memory ----------------------------------------------------------------------------------
def test_out_of_memory_message_names_the_batch_and_the_fix() -> None:
    from xtrain.train.loop import out_of_memory_error

    e = out_of_memory_error("cuda:0", per_device=8, world=2, accumulation=2, global_batch=32)
    assert e.one_line() == (
        "out of memory on cuda:0 with batch.per_device=8 (global batch 32 = 8 per device x "
        "2 processes x accumulation 2) (batch.per_device=4 batch.global_batch=32 keeps the "
        "global batch 32; accumulation becomes 4)"
    )
    e = out_of_memory_error("cuda:0", per_device=3, world=1, accumulation=1, global_batch=3)
    assert "batch.per_device=1 batch.global_batch=3" in e.hint and "accumulation becomes 3" in e.hint
    e = out_of_memory_error("cuda:0", per_device=1, world=4, accumulation=8, global_batch=32)
    assert "already 1" in e.hint and "gradient_checkpointing" in e.hint


@pytest.mark.slow
def test_out_of_memory_in_a_run_is_one_line(job: Job) -> None:
    out = job.root / "oom"
    proc = run_xtrain(python_run(*run_args(job, out)), fault_env(job, FAULT="oom", FAULT_AT=3))
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    (line,) = error_lines(proc.stderr)
    assert "out of memory on cpu with batch.per_device=4 (global batch 8 = 4 per device x 1 process" in line
    assert "batch.per_device=2 batch.global_batch=8 keeps the global batch 8; accumulation becomes 4" in line
    assert not (out / "checkpoints").exists() or complete_steps(out) == []


def test_out_of_memory_error_is_constructible_on_cpu_builds() -> None:
    assert issubclass(torch.cuda.OutOfMemoryError, RuntimeError)
    assert torch.cuda.OutOfMemoryError is torch.OutOfMemoryError
    assert not isinstance(torch.cuda.OutOfMemoryError("x"), XtrainError)


# -- kills --------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_kill_inside_a_checkpoint_write(job: Job, uninterrupted: Path) -> None:
    """SIGKILL while step-4 is being written (accelerate's files are in step-4.tmp, xtrain's state
    file and the rename are not done): step-2 stays loadable, step-4.tmp is never resumed from,
    the next start removes it and ends bitwise where an uninterrupted run ends."""
    out = job.root / "kill-in-save"
    marker = job.root / "in-save"
    env = fault_env(job, FAULT="stall-save", FAULT_AT=4, FAULT_MARKER=marker)
    code = run_until(python_run(*run_args(job, out)), env, marker.exists, timeout=BOUNDED_S)
    assert code == -9
    assert complete_steps(out) == [2]
    partial = out / "checkpoints" / "step-4.tmp"
    assert partial.is_dir() and (partial / "model.safetensors").is_file()
    assert not (partial / "xtrain_state.json").exists()
    assert_loadable(out / "checkpoints" / "step-2")

    proc = run_xtrain(python_run(*run_args(job, out)), job.env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "train_result.json").read_text())
    assert result["resumed_from"] == str(out / "checkpoints" / "step-2")
    assert not partial.exists()
    assert_same_training(uninterrupted, out, exact=True)


@pytest.mark.slow
def test_sigkill_at_random_points_then_resume_is_bitwise(job: Job, uninterrupted: Path) -> None:
    """Three SIGKILLs at seeded random forward passes (anywhere inside a step, not only at
    checkpoints), each followed by `resume=auto`: the weights end bitwise equal."""
    out = job.root / "random-kills"
    # forward 3..6 of a session: killed within steps 2-3, so every session has forwards left
    points = [random.Random(2024 + i).randint(3, 6) for i in range(3)]
    for at in points:
        proc = run_xtrain(python_run(*run_args(job, out)), fault_env(job, FAULT="kill", FAULT_AT=at))
        assert proc.returncode == -9, (at, proc.stderr[-3000:])
        assert not (out / "adapter").exists()
    proc = run_xtrain(python_run(*run_args(job, out)), job.env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "train_result.json").read_text())
    assert result["resumed_from"] and result["final_step"] == STEPS
    assert_same_training(uninterrupted, out, exact=True)


RANK_DIES = {
    "spawn": lambda job, out: python_run("--processes", "2", *run_args(job, out)),
    "accelerate": lambda job, out: [
        sys.executable, "-m", "xtrain", "train", str(job.config), "--processes", "2",
        f"run.output_dir={out}", "run.resume=auto", *CUSTOM,
    ],
}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("launcher", list(RANK_DIES))
def test_one_rank_killed_stops_the_others(job: Job, launcher: str) -> None:
    """Rank 1 is SIGKILLed in step 5 (2 processes, one forward per step): the command ends
    non-zero without hanging, one line names rank 1, the last checkpoint (step 4) is intact."""
    out = job.root / f"rank-dies-{launcher}"
    proc = run_xtrain(
        RANK_DIES[launcher](job, out),
        fault_env(job, FAULT="kill", FAULT_RANK=1, FAULT_AT=5),
        timeout=BOUNDED_S,
    )
    assert proc.returncode not in (0, None), proc.stderr[-3000:]
    # spawn reports on stderr, `xtrain train` (accelerate launch) on its console (stdout)
    output = proc.stderr + proc.stdout
    lines = [ln for ln in output.splitlines() if "rank 1" in ln and ln.startswith("error: ")]
    assert len(lines) == 1, output[-3000:]
    assert "Traceback" not in proc.stdout
    assert "SIGKILL" in lines[0] or "signal 9" in lines[0], lines[0]
    assert complete_steps(out) == [2, 4]
    assert_loadable(out / "checkpoints" / "step-4")
    assert not (out / "adapter").exists()


# -- security ------------------------------------------------------------------------------------------
XTRAIN_SOURCES = sorted((REPO / "xtrain").rglob("*.py"))


def _calls(pattern: str) -> list[tuple[str, str]]:
    found = []
    for path in XTRAIN_SOURCES:
        for line in path.read_text(encoding="utf-8").splitlines():
            code = line.split("#", 1)[0]
            if re.search(pattern, code):
                found.append((str(path.relative_to(REPO)), line.strip()))
    return found


def test_yaml_is_only_read_with_safe_load() -> None:
    """No yaml.load / unsafe_load / full_load / Loader= anywhere, every YAML read through one
    SafeLoader; a `!!python/...` tag in a config is refused in one line (the bad-input table runs
    it and checks nothing executed)."""
    assert _calls(r"yaml\.(load|unsafe_load|full_load|load_all|safe_load)\s*\(|Loader\s*=") == []
    # the one reader (xtrain/structured.py) is PyYAML's SafeLoader, refusing keys written twice
    import yaml

    from xtrain import structured

    loader = structured._strict_loader()
    assert issubclass(loader, yaml.SafeLoader)
    assert loader.yaml_constructors is yaml.SafeLoader.yaml_constructors


def test_torch_load_only_with_weights_only() -> None:
    unsafe = [(f, ln) for f, ln in _calls(r"torch\.load\(") if "weights_only=True" not in ln]
    assert unsafe == []


def test_no_remote_code_unless_asked() -> None:
    from xtrain.config.schema import TrainConfig
    from xtrain.tasks.validation import load_config

    assert TrainConfig().model.trust_remote_code is False
    assert load_config(None).model.trust_remote_code is False
    assert _calls(r"trust_remote_code\s*=\s*True") == []
    # every from_pretrained call passes the config's choice through
    for f, ln in _calls(r"\.from_pretrained\("):
        if "Auto" in ln and "tokenizer" not in f:
            assert "trust_remote_code" in ln or "kwargs" in ln, (f, ln)


def test_single_machine_rendezvous_is_loopback() -> None:
    from xtrain.launch.accelerate_launcher import accelerate_args
    from xtrain.machine.facts import Facts
    from xtrain.planning.plan import Overrides
    from xtrain.planning.rules import make_plan

    plan = make_plan(Facts(torch_version="2.13.0", gloo_available=True), Overrides(num_processes=2))
    assert plan.main_address == "127.0.0.1"
    args = accelerate_args("xtrain.run", [], plan)
    assert args[args.index("--main_process_ip") + 1] == "127.0.0.1"
    windows = make_plan(
        Facts(torch_version="2.13.0", gloo_available=True), Overrides(num_processes=2, platform="windows")
    )
    assert windows.launcher == "spawn" and windows.main_address == "127.0.0.1"


def test_writes_stay_inside_the_output_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every name xtrain writes under is fixed (checkpoints/step-N from an integer, adapter,
    model, merged, logs, train_result.json): a run creates nothing next to run.output_dir, and
    run.resume (any path) is only read."""
    from test_loop import build_tiny, cpu_plan, tiny_config

    from xtrain.train.loop import train

    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "step-1").mkdir()
    cfg = tiny_config(work / "out", max_steps=2, save_every=1, save_merged=True)
    cfg.run.resume = "auto"
    train(cfg, cpu_plan(), build=build_tiny)
    assert sorted(p.name for p in work.iterdir()) == ["out"]
    names = {p.relative_to(work / "out").parts[0] for p in (work / "out").rglob("*")}
    run_files = {"curves.png", "history.jsonl", "eval_samples.json", "data_check.json"}  # for a person
    assert names <= {"checkpoints", "adapter", "merged", "model", "logs", "train_result.json", *run_files}
    assert not (work / "out" / ".xtrain-run.lock").exists()  # the run lock goes with the run
    cfg.run.resume = str(outside / "step-1")  # incomplete: refused, nothing there removed
    with pytest.raises(XtrainError, match="is incomplete"):
        train(cfg, cpu_plan(), build=build_tiny)
    assert sorted(p.name for p in outside.iterdir()) == ["step-1"]
