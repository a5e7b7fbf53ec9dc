"""The trained built-ins (``builtin.STAGES``: ``builtin:tiny-llama-sft``, ``builtin:tiny-llama-grpo``,
``builtin:tiny-agent-grpo``), trained by xtrain's own loop: each is the result of a built-in SFT
job (``xtrain/builtin/jobs/sft-*.yaml``), built once per built-in cache, and the quickstart that
names it starts from that result (a chain, docs/chains.md).

Why here: ``xtrain/builtin`` sits below everything and cannot run training, so it only knows where
such a result is kept and whether it is there (``builtin.stage_folder``, ``stage_result``). This
module, in the training layer, builds it where a run starts, before any worker: ``xtrain train``,
``xtrain quickstart``, ``python -m xtrain.run`` and the library's ``train`` call ``ensure_config``:
the config's ``model.name_or_path`` and the other models its task loads (a distillation teacher),
a stage started from another built first.

Once: the build holds a lock next to the result's place (``runtime.lock.waiting``), so processes
that start together (two ranks of a user's torchrun, two quickstarts) train it once; the others
wait and read it. It trains into a private folder, renamed into place when whole
(``builtin.keep_stage``): a killed build leaves nothing a later run would read. In a process that
is itself a rank of a launch, the stage runs as a process of its own without the launch
variables (one process: it must not join the rank's process group).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from xtrain import builtin
from xtrain.errors import XtrainError
from xtrain.planning.context import LaunchContext, alone
from xtrain.planning.run import Run, for_process
from xtrain.runtime import lock
from xtrain.runtime.quiet import quiet_libraries
from xtrain.tasks.validation import load_config
from xtrain.train.preflight import run_checks

if TYPE_CHECKING:
    from xtrain.config.schema import TrainConfig

# one compute thread: a tiny model's steps gain nothing from more, a busy machine's second thread
# made such a build several times slower (docs/grpo.md), and the weights are the same on any machine
THREADS = 1
Say = Callable[[str], None]
Trainer = Callable[[Run], object]  # train.loop.train_run (passed in: the loop calls ensure too)


def ensure_config(cfg: TrainConfig, trainer: Trainer, say: Say | None = None) -> None:
    """``ensure`` for every model a config names: ``model.name_or_path`` and the other models its
    task loads beside it (``Task.other_models``: a distillation teacher)."""
    from xtrain import tasks

    ensure(cfg.model.name_or_path, trainer, say)
    others = tasks.get(cfg.model.task).other_models
    for other in others(cfg) if others is not None else ():
        ensure(other.name, trainer, say)


def ensure(name: str, trainer: Trainer, say: Say | None = None) -> Path | None:
    """The result of the trained built-in ``name`` (None for any other name), trained first by
    ``trainer`` when this cache lacks it; ``say`` hears one line before a build and one after."""
    if not builtin.is_stage(name):
        return None
    if builtin.stage_built(name):
        return builtin.stage_result(name)
    place = builtin.stage_folder(name)
    with lock.waiting(place.parent / f".{place.name}.lock"):
        if builtin.stage_built(name):  # another process built it while this one waited
            return builtin.stage_result(name)
        job = builtin.stage_job(name)
        tmp = place.parent / f".tmp-{place.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        cfg = load_config(job, [f"run.output_dir={tmp}"])
        ensure(cfg.model.name_or_path, trainer, say)  # a built-in stage that starts from another
        if say is not None:
            say(f"{name}: training it once with xtrain's SFT stage ({job.name}, {cfg.run.max_steps} steps)")
        started = time.perf_counter()
        try:
            _train(job, tmp, trainer)
            shutil.rmtree(tmp / "checkpoints", ignore_errors=True)  # its result is the model
            final = builtin.keep_stage(name, tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        if say is not None:
            say(f"{name}: trained in {time.perf_counter() - started:.0f} s -> {final}")
        return final


def _train(job: Path, out: Path, trainer: Trainer) -> None:
    """``job`` trained into ``out``: in this process by ``trainer``, as one process; a rank of a
    launch starts ``python -m xtrain.run`` without its launch variables instead."""
    overrides = [f"run.output_dir={out}"]
    if not LaunchContext.from_env().launched:
        import torch

        quiet_libraries()  # (the run's own workers quiet them too)
        run = for_process(load_config(job, overrides), LaunchContext(), processes=1)
        run_checks(run)
        threads = torch.get_num_threads()
        torch.set_num_threads(THREADS)
        try:
            trainer(run)
        finally:
            torch.set_num_threads(threads)
        return
    argv = [sys.executable, "-m", "xtrain.run", "--config", str(job), *overrides]
    env = {**alone(), "OMP_NUM_THREADS": str(THREADS)}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise XtrainError(f"training the built-in stage {job.name} failed: {said}")
