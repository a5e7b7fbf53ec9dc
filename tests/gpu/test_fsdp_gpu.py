"""accelerate's real FSDP2 (and DeepSpeed) path on CUDA: what tests/test_fsdp_cpu.py can only
reach on the CPU through a patched accelerate state. World size 1 already exercises the
wrapping (``fully_shard`` per decoder layer), the sharded state dicts (torch.distributed.checkpoint
folders), save/resume, and the adapter gathered on save; two GPUs add the real sharding.

Written by review on a machine without a GPU (the session that wrote it had none): run it with
``python -m pytest -q tests/gpu/test_fsdp_gpu.py`` on a CUDA machine."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest
from support.jobs import Job, assert_same_training, make_job, python_run, run_xtrain

from xtrain.launch import sharding

XTRAIN = [sys.executable, "-m", "xtrain"]


def accelerate_fsdp(processes: int = 1) -> list[str]:
    """`accelerate launch` with xtrain's FSDP2 settings (what `xtrain train --fsdp` passes)."""
    return [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", str(processes),
            "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
            *sharding.launch_flags("fsdp", from_options=True), "-m", "xtrain.run"]  # fmt: skip


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Job:
    return make_job(tmp_path_factory.mktemp("fsdp-gpu"), steps=4, save_every=2)


def run(job: Job, cmd: list[str], out: Path, *overrides: str) -> dict:
    proc = run_xtrain([*cmd, "--config", str(job.config), f"run.output_dir={out}", *overrides], job.env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads((out / "train_result.json").read_text())


@pytest.fixture(scope="module")
def plain(job: Job) -> Path:
    """One GPU without FSDP: the reference."""
    out = job.root / "plain"
    run(job, python_run(), out, "run.mixed_precision=no")
    return out


def test_lora_under_fsdp2_on_one_gpu_saves_resumes_and_gathers_the_adapter(job: Job, plain: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    out = job.root / "fsdp-one"
    r = run(job, accelerate_fsdp(), out)
    assert r["run_info"]["device"].startswith("cuda")
    assert_same_training(plain, out)  # world size 1: FSDP2 must not change the math
    step2 = out / "checkpoints" / "step-2"
    assert (step2 / "pytorch_model_fsdp_0").is_dir() and (step2 / "optimizer_0").is_dir()
    config = json.loads((out / "adapter" / "adapter_config.json").read_text())
    base = AutoModelForCausalLM.from_pretrained(config["base_model_name_or_path"])
    PeftModel.from_pretrained(base, out / "adapter")  # the gathered adapter is a plain peft adapter
    straight = job.root / "fsdp-one-straight"
    shutil.copytree(out, straight)
    run(job, accelerate_fsdp(), out, f"run.resume={step2}")
    assert_same_training(straight, out, exact=True)  # one process on a GPU: bitwise


def test_full_finetune_under_fsdp2_writes_a_loadable_model(job: Job) -> None:
    from transformers import AutoModelForCausalLM

    out = job.root / "fsdp-full"
    run(job, accelerate_fsdp(), out, "lora.enabled=false", "optim.lr=1e-4", "run.eval_every=2",
        "run.best_metric=eval_loss")  # fmt: skip
    for folder in (out / "model", out / "best"):
        AutoModelForCausalLM.from_pretrained(folder)


def test_save_merged_is_refused_under_fsdp_before_training(job: Job) -> None:
    out = job.root / "fsdp-merged"
    proc = run_xtrain([*accelerate_fsdp(), "--config", str(job.config), f"run.output_dir={out}",
                       "run.save_merged=true"], job.env)  # fmt: skip
    assert proc.returncode == 2
    assert "run.save_merged does not work under FSDP" in proc.stderr
    assert not (out / "checkpoints").exists()


def test_xtrain_train_fsdp_launches_through_accelerate(job: Job, plain: Path) -> None:
    out = job.root / "xtrain-train-fsdp"
    proc = run_xtrain([*XTRAIN, "train", str(job.config), f"run.output_dir={out}", "run.mixed_precision=no",
                       "--fsdp", "--processes", "1"], job.env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert (out / "checkpoints" / "step-2" / "pytorch_model_fsdp_0").is_dir()
    assert_same_training(plain, out)


@pytest.mark.two_gpus
def test_two_gpus_under_fsdp2_train_like_one(job: Job, plain: Path) -> None:
    out = job.root / "fsdp-two"
    run(job, accelerate_fsdp(2), out)
    assert_same_training(plain, out)
    # resume the 2-GPU sharded checkpoint on one GPU (torch.distributed.checkpoint reshards)
    again = job.root / "fsdp-two-then-one"
    shutil.copytree(out, again)
    run(job, accelerate_fsdp(1), again, f"run.resume={again / 'checkpoints' / 'step-2'}")
    assert_same_training(out, again)


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="deepspeed is not installed")
@pytest.mark.parametrize("stage", ["zero2", "zero3"])
def test_deepspeed_lora_trains_saves_and_resumes(job: Job, plain: Path, stage: str) -> None:
    out = job.root / f"ds-{stage}"
    proc = run_xtrain([*XTRAIN, "train", str(job.config), f"run.output_dir={out}", "run.mixed_precision=no",
                       "--deepspeed", stage, "--processes", "1"], job.env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert (out / "adapter" / "adapter_model.safetensors").is_file()
    assert_same_training(plain, out)
    straight = job.root / f"ds-{stage}-straight"
    shutil.copytree(out, straight)
    step2 = out / "checkpoints" / "step-2"
    proc = run_xtrain([*XTRAIN, "train", str(job.config), f"run.output_dir={out}", "run.mixed_precision=no",
                       f"run.resume={step2}", "--deepspeed", stage, "--processes", "1"], job.env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert_same_training(straight, out)
