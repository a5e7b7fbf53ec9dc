"""xtrain's loop under accelerate's DeepSpeed ZeRO-2/3 path, on CPU: two real processes over
gloo, DeepSpeed's own CPU accelerator underneath. deepspeed is in the `dev` extra on Linux (on
Windows it installs by compiling); skipped where it is not installed.

As for FSDP (tests/test_fsdp_cpu.py), accelerate 1.15 sets DeepSpeed up only on CUDA; the
worker builds xtrain's Accelerator as usual, then sets accelerate's state to DEEPSPEED with a
``DeepSpeedPlugin`` (a test seam, not a supported mode). From there every call is accelerate's
and DeepSpeed's own: ``deepspeed.initialize`` in ``prepare``, the engine's backward and step,
its checkpoint in ``save_state`` / ``load_state``, ZeRO-3's 16-bit consolidation when the
adapter is saved. One thing is left out: DeepSpeed's CPU accelerator compiles a shared-memory
all-reduce (``deepspeed_shm_comm``, about 40 s of one core, once per machine) that only its
inference all-reduce uses; the worker marks it unbuildable, so the collectives are gloo's.

The gradient check (issue 32: every training path against a plain reference): the whole
gradients DeepSpeed holds in its partitioned buffers at the first step, read its own way, are
one plain process's (tests/support/gradients.py)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from support.jobs import Job, assert_same_training, make_job, python_run, run_xtrain

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="deepspeed is not installed"),
]

WORKER = textwrap.dedent(
    """
    import os, runpy, sys

    import deepspeed.ops

    import xtrain.train.loop as loop

    # the CPU accelerator's shared-memory all-reduce: a 40 s compile, used by inference only
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
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
    if os.environ.get("TEST_GRADIENTS"):
        import torch
        import torch.distributed as dist
        from deepspeed.runtime.engine import DeepSpeedEngine
        from deepspeed.utils import safe_get_full_grad

        def first_step(engine, *args, **kwargs):
            # accelerate calls it after the backward of the last micro-batch (ZeRO's reduce or
            # reduce-scatter done), before DeepSpeed's own step; safe_get_full_grad gathers each
            # trained weight's whole gradient from the partitions (a collective: every rank, in order)
            grads = {n: safe_get_full_grad(p) for n, p in engine.module.named_parameters() if p.requires_grad}
            grads = {n: None if g is None else g.detach().float().cpu().clone() for n, g in grads.items()}
            torch.save(grads, os.path.join(os.environ["TEST_GRADIENTS"], f"grads-{dist.get_rank()}.pt"))
            dist.barrier()
            sys.stdout.flush()
            os._exit(0)  # the gradients are all this run is for

        DeepSpeedEngine.step = first_step
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


def deepspeed_run(
    job: Job, stage: int, out: Path, *overrides: str, env: dict[str, str] | None = None
) -> None:
    from xtrain.launch.rendezvous import free_port

    worker = job.root / "deepspeed_worker.py"
    worker.write_text(WORKER)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr",
           "127.0.0.1", "--master_port", str(free_port()), str(worker), "--config", str(job.config),
           f"run.output_dir={out}", "batch.per_device=2", *overrides]  # fmt: skip
    proc = run_xtrain(cmd, {**job.env, "TEST_ZERO_STAGE": str(stage), **(env or {})})
    assert proc.returncode == 0, proc.stderr[-4000:]


# ZeRO-3 by default (it shards the weights too: the harder save and resume); ZeRO-2, whose
# gradients the check below covers, with `pytest -m soak`
@pytest.mark.parametrize("stage", [pytest.param(2, marks=pytest.mark.soak), 3])
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


@pytest.mark.parametrize(
    ("stage", "per_device"), [(2, 4), (3, 2)], ids=["zero2-one-micro-batch", "zero3-accumulation-2"]
)
def test_two_zero_ranks_average_to_one_processs_gradient(
    job: Job, stage: int, per_device: int, tmp_path: Path, private_caches: Path
) -> None:
    """Two ZeRO ranks over gloo with the global batch of 8 (ZeRO-2: one micro-batch of 4 each;
    ZeRO-3: two of 2 each, DeepSpeed's own accumulation): the whole gradient DeepSpeed holds for
    every trained weight at the first step (``safe_get_full_grad`` over its partitions) is one
    plain process's accumulating the same micro-batches, which is the reference's (the model's
    class, peft and the same weights, no xtrain: support/gradients.py; LoRA dropout on, seeded
    per sample position, not per rank). No clipping: DeepSpeed clips inside its step, after
    this reading."""
    from support.gradients import assert_same_gradients, reference_gradients, xtrain_gradients

    from xtrain.tasks.validation import load_config

    common = ["run.max_steps=1", "optim.max_grad_norm=null", "optim.warmup_steps=0",
              f"batch.per_device={per_device}"]  # fmt: skip
    one = xtrain_gradients(load_config(job.config, [*common, f"run.output_dir={tmp_path / 'one'}"]))
    assert len(one.inputs) == 8 // per_device  # one process accumulates what two ranks share
    assert_same_gradients(one.grads, reference_gradients(one))
    deepspeed_run(job, stage, tmp_path / "zero", *common, env={"TEST_GRADIENTS": str(tmp_path)})
    for rank in (0, 1):
        assert_same_gradients(torch.load(tmp_path / f"grads-{rank}.pt"), one.grads, rtol=1e-4)
