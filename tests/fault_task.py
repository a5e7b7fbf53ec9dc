"""A custom task (``model.task: custom``, ``model.custom: fault_task:build``) that is the plain
causal-lm task plus one injected fault, chosen by environment variables. Test code only: the
library has no fault switches; the faults enter through the public custom-task hook.

    FAULT=kill         SIGKILL this rank inside its FAULT_AT-th training forward pass
    FAULT=nan          the loss is NaN from the FAULT_AT-th training forward pass on
    FAULT=oom          the FAULT_AT-th training forward raises torch.cuda.OutOfMemoryError
    FAULT=stall-save   the checkpoint write of step FAULT_AT stops after accelerate's files are
                       written (before xtrain's state file and the rename): it touches
                       FAULT_MARKER and sleeps, so the test can SIGKILL it mid-save
    FAULT=slow         from the FAULT_AT-th training forward on, touch FAULT_MARKER and sleep
                       FAULT_SLEEP seconds (default 0.2) per forward: a run that is inside the
                       loop and stays there while a test signals or kills it
    FAULT=stall-build  touch FAULT_MARKER while the task is being built and sleep: a run that is
                       stopped before its training loop runs
    FAULT_RANK         the rank that fails (default 0)
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import torch

from xtrain.tasks.text.causal_lm import build as build_causal_lm


def build(run: Any, main_process_first: Any) -> Any:
    """The custom-task builder of the Run's shape (its first parameter named ``run``)."""
    workload = build_causal_lm(run, main_process_first)
    mode = os.environ.get("FAULT", "")
    at = int(os.environ.get("FAULT_AT", "0") or 0)
    mine = int(os.environ.get("RANK", "0") or 0) == int(os.environ.get("FAULT_RANK", "0") or 0)
    if not mode or not mine:
        return workload
    if mode == "stall-build":
        Path(os.environ["FAULT_MARKER"]).touch()
        time.sleep(600)  # the test signals the process here
    calls = [0]

    def before(module: Any, args: Any, kwargs: Any) -> None:
        if not module.training:
            return  # evaluation passes do not count
        calls[0] += 1
        if mode == "slow" and calls[0] > at:
            time.sleep(float(os.environ.get("FAULT_SLEEP", "0.2")))
        if calls[0] != at:
            return
        if mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if mode == "slow":
            Path(os.environ["FAULT_MARKER"]).touch()
        if mode == "oom":
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB")

    def after(module: Any, args: Any, kwargs: Any, output: Any) -> Any:
        if mode == "nan" and module.training and calls[0] >= at:
            output.loss = output.loss * float("nan")
        return output

    workload.model.register_forward_pre_hook(before, with_kwargs=True)
    workload.model.register_forward_hook(after, with_kwargs=True)
    if mode == "stall-save":
        _stall_in_save(at, Path(os.environ["FAULT_MARKER"]))
    return workload


def _stall_in_save(step: int, marker: Path) -> None:
    import accelerate

    original = accelerate.Accelerator.save_state

    def save_state(self: Any, output_dir: str | None = None, *args: Any, **kwargs: Any) -> Any:
        result = original(self, output_dir, *args, **kwargs)
        if str(output_dir).endswith(f"step-{step}.tmp"):
            marker.touch()
            time.sleep(600)  # the test kills the process here
        return result

    accelerate.Accelerator.save_state = save_state
