"""xtrain's loop under accelerate's DeepSpeed ZeRO-2/3 path, on CPU: two real processes over
gloo, DeepSpeed's own CPU accelerator underneath. Skipped where deepspeed is not installed (it
is not a dev dependency: `pip install deepspeed` to run these).

As for FSDP (tests/test_fsdp_cpu.py), accelerate 1.15 sets DeepSpeed up only on CUDA; the
worker builds xtrain's Accelerator as usual, then sets accelerate's state to DEEPSPEED with a
``DeepSpeedPlugin`` (a test seam, not a supported mode). From there every call is accelerate's
and DeepSpeed's own: ``deepspeed.initialize`` in ``prepare``, the engine's backward and step,
its checkpoint in ``save_state`` / ``load_state``, ZeRO-3's 16-bit consolidation when the
adapter is saved."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
import textwrap
from pathlib import Path

import pytest
from support.jobs import Job, assert_same_training, make_job, python_run, run_xtrain

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="deepspeed is not installed"),
]

WORKER = textwrap.dedent(
    """
    import os, runpy, sys

    import xtrain.train.loop as loop

    real = loop.build_accelerator
    STAGE = int(os.environ["TEST_ZERO_STAGE"])

    def deepspeed_accelerator(*args, **kwargs):
        from accelerate.state import PartialState
        from accelerate.utils import DeepSpeedPlugin, DistributedType

        acc = real(*args, **kwargs)
        # accelerate's defaults (zero3_init_flag on for ZeRO-3: sharded.whole_model_loading)
        plugin = DeepSpeedPlugin(zero_stage=STAGE, zero3_save_16bit_model=True)
        PartialState().distributed_type = DistributedType.DEEPSPEED
        acc.state.distributed_type = DistributedType.DEEPSPEED
        acc.state.deepspeed_plugins = {"default": plugin}
        plugin.select(_from_accelerator_state=True)
        acc.deepspeed_engine_wrapped = None  # what Accelerator.__init__ sets under DeepSpeed
        return acc

    loop.build_accelerator = deepspeed_accelerator
    sys.argv = ["xtrain.run", *sys.argv[1:]]
    runpy.run_module("xtrain.run", run_name="__main__")
    """
)


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Job:
    return make_job(tmp_path_factory.mktemp("deepspeed"), steps=4, save_every=2)


@pytest.fixture(scope="module")
def plain(job: Job) -> Path:
    out = job.root / "one"
    args = ("--config", str(job.config), f"run.output_dir={out}", "batch.per_device=2")
    proc = run_xtrain(python_run(*args), job.env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def deepspeed_run(job: Job, stage: int, out: Path, *overrides: str) -> None:
    from xtrain.launch.rendezvous import free_port

    worker = job.root / "deepspeed_worker.py"
    worker.write_text(WORKER)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr",
           "127.0.0.1", "--master_port", str(free_port()), str(worker), "--config", str(job.config),
           f"run.output_dir={out}", "batch.per_device=2", *overrides]  # fmt: skip
    proc = run_xtrain(cmd, {**job.env, "TEST_ZERO_STAGE": str(stage)})
    assert proc.returncode == 0, proc.stderr[-4000:]


@pytest.mark.parametrize("stage", [2, 3])
def test_lora_under_deepspeed_trains_saves_and_resumes_like_one_process(
    job: Job, plain: Path, stage: int
) -> None:
    """Two ZeRO ranks, two micro-batches each, train as one plain process with four; the
    checkpoint is DeepSpeed's, and resuming from it ends at the same adapter."""
    out = job.root / f"zero{stage}"
    deepspeed_run(job, stage, out)
    assert_same_training(plain, out)
    step2 = out / "checkpoints" / "step-2"
    assert (step2 / "pytorch_model").is_dir() and not (step2 / "model.safetensors").exists()
    assert json.loads((out / "train_result.json").read_text())["accumulation"] == 2
    straight = job.root / f"zero{stage}-straight"
    shutil.copytree(out, straight)
    deepspeed_run(job, stage, out, f"run.resume={step2}")
    assert_same_training(straight, out)
