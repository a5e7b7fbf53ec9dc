"""xtrain's loop under accelerate's FSDP2 path, on CPU: two real processes over gloo.

accelerate 1.15 has no supported switch for FSDP on CPU (``Accelerator(cpu=True, fsdp_plugin=...)``
becomes MULTI_CPU, ``accelerate launch --cpu --use_fsdp`` is refused: FIELD_NOTES). torch's
``fully_shard`` itself runs on CPU over gloo, so the worker below builds xtrain's Accelerator as
usual and then sets accelerate's state to FSDP with an FSDP2 plugin (its state's
``distributed_type``: NOT a supported switch, a test seam). From there on every call is
accelerate's own FSDP2 code: ``prepare`` (``fully_shard`` per decoder layer, the optimizer's
parameters swapped for the DTensors), ``no_sync``, ``clip_grad_norm_``, ``save_state`` /
``load_state`` (torch.distributed.checkpoint folders), and xtrain's gather-then-write of the
adapter (``xtrain.train.sharded``). The real accelerate FSDP path on CUDA is
tests/gpu/test_fsdp_gpu.py."""

from __future__ import annotations

import json
import shutil
import sys
import textwrap
from pathlib import Path

import pytest
from support.jobs import Job, assert_same_training, make_job, python_run, run_xtrain

pytestmark = pytest.mark.slow

# xtrain.run with the Accelerator's state switched to FSDP2 (see the module docstring)
WORKER = textwrap.dedent(
    """
    import runpy, sys

    import xtrain.train.loop as loop

    real = loop.build_accelerator

    def fsdp_accelerator(*args, **kwargs):
        from accelerate.state import PartialState
        from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

        acc = real(*args, **kwargs)
        plugin = FullyShardedDataParallelPlugin(
            fsdp_version=2, state_dict_type="SHARDED_STATE_DICT", reshard_after_forward=True,
            auto_wrap_policy="transformer_based_wrap",  # the model's _no_split_modules
        )
        PartialState().distributed_type = DistributedType.FSDP
        acc.state.distributed_type = DistributedType.FSDP
        acc.state.fsdp_plugin = plugin
        return acc

    loop.build_accelerator = fsdp_accelerator
    sys.argv = ["xtrain.run", *sys.argv[1:]]
    runpy.run_module("xtrain.run", run_name="__main__")
    """
)


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Job:
    return make_job(tmp_path_factory.mktemp("fsdp"), steps=4, save_every=2)


def fsdp_run(job: Job, out: Path, *overrides: str) -> None:
    worker = job.root / "fsdp_worker.py"
    worker.write_text(WORKER)
    from xtrain.launch.rendezvous import free_port

    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr",
           "127.0.0.1", "--master_port", str(free_port()), str(worker), "--config", str(job.config),
           f"run.output_dir={out}", *overrides]  # fmt: skip
    proc = run_xtrain(cmd, job.env)
    assert proc.returncode == 0, proc.stderr[-4000:]


def test_lora_under_fsdp2_trains_saves_and_resumes_like_one_process(job: Job) -> None:
    """Two FSDP2 ranks train the same as one plain process (same losses, eval loss, adapter);
    the checkpoint is accelerate's sharded one, and resuming from it ends at the same adapter."""
    ref = job.root / "one"
    proc = run_xtrain(python_run("--config", str(job.config), f"run.output_dir={ref}"), job.env)
    assert proc.returncode == 0, proc.stderr[-3000:]

    out = job.root / "fsdp"
    fsdp_run(job, out)
    assert_same_training(ref, out)  # the adapter was gathered from the shards and written by rank 0
    step2 = out / "checkpoints" / "step-2"
    assert (step2 / "pytorch_model_fsdp_0").is_dir() and (step2 / "optimizer_0").is_dir()
    assert not (step2 / "model.safetensors").exists()  # accelerate's sharded save, not xtrain's hook
    assert json.loads((out / "adapter" / "adapter_config.json").read_text())["r"] == 4

    # resume from step 2 on two FSDP ranks: the same end as the run that never stopped
    straight = job.root / "fsdp-straight"
    shutil.copytree(out, straight)
    fsdp_run(job, out, f"run.resume={step2}")
    assert_same_training(straight, out)
