"""A task's workload built outside a training run (the tests of one task's build): this
process's ``Run`` alone on this machine (``local_run``), as ``python -m xtrain.run`` would build it
for one process, and ``tasks.build_workload`` with it."""

from __future__ import annotations

import contextlib
import functools
from typing import Any

from xtrain.config.schema import TrainConfig
from xtrain.planning.context import LaunchContext
from xtrain.planning.plan import Plan
from xtrain.planning.run import Run, for_process


@functools.cache
def this_machine() -> Plan:
    """The plan for one process on this machine (one quick probe per test process)."""
    from xtrain.planning.resolve import resolve

    return resolve(processes=1).plan


def local_run(cfg: TrainConfig, plan: Plan | None = None) -> Run:
    """``cfg``'s Run for one process alone (no launcher), on ``plan`` or this machine's."""
    return for_process(cfg, LaunchContext(), plan=plan or this_machine())


def build_workload(cfg: TrainConfig, main_process_first: Any = contextlib.nullcontext) -> Any:
    """``xtrain.tasks.build_workload`` for ``cfg`` alone on this machine, with its ``shared_pass``
    run as the loop runs it after the build (one process)."""
    from xtrain import tasks

    workload = tasks.build_workload(local_run(cfg), main_process_first)
    if workload.shared_pass is not None:
        workload.shared_pass(None)
    return workload
