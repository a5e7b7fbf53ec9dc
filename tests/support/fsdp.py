"""xtrain.run under accelerate's FSDP2 path on CPU (two gloo ranks under torchrun): the test seam
of tests/test_fsdp_cpu.py (its module docstring says why it is a seam), shared with the tasks
that check their jobs under FSDP2 (test_preference.py)."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

from support.jobs import Job, run_xtrain

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


def fsdp_run(job: Job, out: Path, *overrides: str) -> None:
    """``job`` on two FSDP2 ranks into ``out``; it must succeed."""
    worker = job.root / "fsdp_worker.py"
    worker.write_text(WORKER)
    from xtrain.launch.rendezvous import free_port

    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr",
           "127.0.0.1", "--master_port", str(free_port()), str(worker), "--config", str(job.config),
           f"run.output_dir={out}", *overrides]  # fmt: skip
    proc = run_xtrain(cmd, job.env)
    assert proc.returncode == 0, proc.stderr[-4000:]
