"""Every way to start `xtrain.run` with 2 real CPU processes (gloo) gives the result of 1 process
with the same global batch; bad input ends in one line without a traceback.

Tolerances (stated in docs/training.md): loss at every step and final eval loss within 1e-4
relative, adapter weights within 1e-5 absolute. The data order and the dropout masks do not
depend on the process count, so the only differences left are float summation orders (DDP's
gradient average vs accumulation in one process, per-process thread counts).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from support import warm
from support.jobs import TWO_PROCESSES, Job, assert_same_training, make_job, run_xtrain, two_process_command

pytestmark = pytest.mark.slow

SPAWN = [sys.executable, "-m", "xtrain.run"]
MODES = {
    **TWO_PROCESSES,
    "windows": [*SPAWN, "--processes", "2"],  # + XTRAIN_PLATFORM=windows, forced CPU-staged hook
    # the headline command on Windows, with the config `xtrain configure` writes there, under a
    # torch that behaves like a Windows wheel without libuv (tests/nolibuv/sitecustomize.py)
    "accelerate-windows-config": [sys.executable, "-m", "accelerate.commands.launch", "-m", "xtrain.run"],
}
NO_LIBUV = Path(__file__).resolve().parent / "nolibuv"


def no_libuv_env(env: dict[str, str]) -> dict[str, str]:
    """Every TCPStore that does not pass use_libuv=False fails, as with a Windows torch wheel."""
    path = os.pathsep.join(p for p in (str(NO_LIBUV), env.get("PYTHONPATH", "")) if p)
    return {**env, "PYTHONPATH": path, "XTRAIN_TEST_NO_LIBUV": "1"}


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Job:
    return make_job(tmp_path_factory.mktemp("modes"))


@pytest.fixture(scope="module")
def reference(job: Job) -> Path:
    """One process, accumulation 2: what every 2-process mode must reproduce."""
    out = job.root / "ref"
    proc = run_xtrain([*SPAWN, "--config", str(job.config), f"run.output_dir={out}"], job.env)
    assert proc.returncode == 0, proc.stderr
    result = json.loads((out / "train_result.json").read_text())
    assert result["world_size"] == 1 and result["accumulation"] == 2
    return out


# Covered by default elsewhere, so run with `pytest -m soak`: spawn by the `windows` mode (the same
# launcher, plus the Windows plan and the CPU-staged all-reduce), accelerate's --multi_gpu flags by
# test_train_cli (`xtrain train -n 2` against `accelerate launch --multi_gpu` on the seq-cls job)
SOAK_MODES = ("spawn", "accelerate")


@pytest.mark.parametrize(
    "mode", [pytest.param(m, marks=pytest.mark.soak) if m in SOAK_MODES else m for m in MODES]
)
def test_two_processes_match_one(mode: str, job, reference: Path) -> None:
    out = job.root / mode
    env = dict(job.env)
    if mode in ("windows", "accelerate-windows-config"):
        env.update(XTRAIN_PLATFORM="windows", XTRAIN_FORCE_CPU_STAGED="1")
    if mode == "accelerate-windows-config":
        env["HF_HOME"] = str(job.root / "hf-windows")
        configure = run_xtrain(
            [sys.executable, "-m", "xtrain", "configure", "--processes", "2", "--platform", "windows"], env
        )
        assert configure.returncode == 0, configure.stderr
        written = (job.root / "hf-windows/accelerate/default_config.yaml").read_text()
        assert "distributed_type: 'NO'" in written and "num_processes: 2" in written
        # accelerate exports the config's gpu_ids as CUDA_VISIBLE_DEVICES; on a 2-GPU Windows
        # machine that names 2 cards. Here it stands in for them (a CPU torch ignores it).
        env = no_libuv_env({**env, "CUDA_VISIBLE_DEVICES": "0,1"})
    command = MODES[mode]
    if mode in TWO_PROCESSES:
        command, env = two_process_command(mode, job.root, env)
    proc = run_xtrain([*command, "--config", str(job.config), f"run.output_dir={out}"], env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "train_result.json").read_text())
    assert result["world_size"] == 2 and result["accumulation"] == 1 and result["global_batch"] == 8
    info = result["run_info"]
    assert info["backend"] == "gloo" and info["distributed_type"] == "DistributedType.MULTI_CPU"
    if mode == "accelerate-windows-config":
        assert "xtrain.run starts the 2 workers itself" in proc.stderr
    if mode in ("windows", "accelerate-windows-config"):
        assert info["plan_os"] == "windows"
        assert info["cpu_staged_allreduce"] is True
        assert info["use_libuv"] == "0"
    else:
        assert info["cpu_staged_allreduce"] is False
    assert_same_training(reference, out)


def test_no_libuv_simulation_breaks_torchrun(job) -> None:
    """The control for accelerate-windows-config: under the same libuv-less torch, a MULTI_GPU
    launch (torchrun's static rendezvous) fails even with USE_LIBUV=0, as on Windows."""
    env = no_libuv_env({**job.env, "USE_LIBUV": "0"})
    proc = run_xtrain([*MODES["accelerate"], "--config", str(job.config), "run.max_steps=1",
                       f"run.output_dir={job.root / 'no-libuv'}"], env, timeout=120)  # fmt: skip
    assert proc.returncode != 0
    assert "built without libuv support" in proc.stderr


# -- bad input: one line, non-zero exit, no traceback, nothing touched -------------------------------
BAD_INPUTS = {
    "missing data file": (
        ["data.train={root}/nope.jsonl", "run.output_dir={root}/fresh-nope"],
        "data file {root}/nope.jsonl not found",
    ),
    "wrong column": (["data.text_column=body", "run.output_dir={root}/fresh-col"], "text rows need 'body'"),
    "unknown task": (["model.task=translate"], "model.task must be one of"),
    "missing model path": (["model.name_or_path={root}/no-model"], "model path {root}/no-model not found"),
    "global batch not divisible": (["batch.global_batch=10"], "global batch 10 is not divisible"),
    "resume from a missing checkpoint": (
        ["run.resume={root}/step-9"],
        "checkpoint {root}/step-9 does not exist",
    ),
}


@pytest.fixture(scope="module")
def finished_run(job, reference: Path) -> tuple[Path, dict[str, float]]:
    """The reference run's folder with its checkpoints, fingerprinted: a bad run must not touch it."""
    return reference, _fingerprint(reference)


def _fingerprint(folder: Path) -> dict[str, float]:
    return {str(p.relative_to(folder)): p.stat().st_mtime for p in sorted(folder.rglob("*"))}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_one_line(case: str, job, finished_run) -> None:
    out, before = finished_run
    overrides, expected = BAD_INPUTS[case]
    args = [o.format(root=job.root) for o in overrides]
    expected = expected.format(root=job.root)
    proc = run_xtrain([*SPAWN, "--config", str(job.config), f"run.output_dir={out}", *args], job.env)
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and "Warning" not in ln and "warn" not in ln]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ") and expected in lines[0]
    assert "Traceback" not in proc.stderr
    assert _fingerprint(out) == before


def test_bad_input_under_spawn_is_one_line(job) -> None:
    out = job.root / "bad-spawn"
    proc = run_xtrain(
        [*SPAWN, "--processes", "2", "--config", str(job.config), f"run.output_dir={out}",
         f"data.train={job.root}/nope.jsonl"],
        job.env,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and "nope.jsonl" in errors[0]
    assert not (out / "checkpoints").exists()


def test_processes_conflicting_with_the_launcher(job) -> None:
    env = {**job.env, "WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0"}
    proc = run_xtrain([*SPAWN, "--processes", "2", "--config", str(job.config)], env)
    assert proc.returncode == 2 and "conflicts" in proc.stderr and "Traceback" not in proc.stderr


def test_run_help_is_fast_and_plain() -> None:
    proc = warm.run(
        [sys.executable, "-m", "xtrain.run", "--help"], capture_output=True, text=True, timeout=60,
        env={**os.environ},
    )  # fmt: skip
    assert proc.returncode == 0 and "--processes" in proc.stdout and "--platform" not in proc.stdout


def test_saved_adapter_reloads_with_peft_and_reproduces_eval_loss(
    job: Job, reference: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The adapter of a real run (a pretrained checkpoint on disk) loads with PeftModel and its
    tokenizer, and gives the run's final eval loss on the eval set."""
    import torch
    from peft import PeftModel
    from support.workloads import build_workload
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from xtrain.tasks.validation import load_config

    for key in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HF_HOME", "XTRAIN_CACHE"):
        monkeypatch.setenv(key, job.env[key])
    cfg = load_config(job.config, ["lora.enabled=false"])  # the eval set and collator, base model only
    workload = build_workload(cfg)
    base = AutoModelForCausalLM.from_pretrained(cfg.model.name_or_path)
    model = PeftModel.from_pretrained(base, str(reference / "adapter")).eval()
    assert AutoTokenizer.from_pretrained(str(reference / "adapter")).pad_token_id is not None
    rows = [workload.eval_dataset[i] for i in range(len(workload.eval_dataset))]
    loss_sum = count = 0.0
    with torch.no_grad():
        for i in range(0, len(rows), 4):
            batch = workload.collator(rows[i : i + 4])
            stats = workload.eval_batch(model(**batch), batch)
            loss_sum += float(stats["loss_sum"].sum())
            count += float(stats["count"].sum())
    expected = json.loads((reference / "train_result.json").read_text())["eval_metrics"]["eval_loss"]
    assert loss_sum / count == pytest.approx(expected, rel=1e-5)
