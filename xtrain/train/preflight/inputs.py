"""The checks that look at the run's inputs: where the model is (``_model_source``: a local path
that is not there, a hub model neither cached nor reachable), the config against the model's
config (``--dry-run``) and the task's data check on the first rows (``--dry-run``: refused where
no checked row has anything left to learn)."""

from __future__ import annotations

from xtrain import tasks
from xtrain.model import hub
from xtrain.planning.run import Run
from xtrain.runtime.quiet import quiet_libraries
from xtrain.tasks import model_checks
from xtrain.train.preflight.notes import Note, Where


def _model_source(run: Run, where: Where) -> list[Note]:
    """Where ``model.name_or_path`` is (``model.hub.locate``), before anything loads it: a local
    path that is not there, or a hub model neither in the cache nor reachable, is one line at once
    (for another machine's plan, ``--facts``, a warning); a hub that cannot be reached while the
    cache holds the model is said, and nothing waits for the network after."""
    source = hub.locate(run.cfg.model.name_or_path, here=where.here)
    if source.note is None or not where.launcher:
        return []
    return [
        Note("Model", source.note) if source.kind == "cached" else Note("warning", source.note, "warning")
    ]


def _model(run: Run, where: Where) -> list[Note]:
    """``--dry-run``: the checks a worker runs on the loaded model (lengths, LoRA targets), on the
    model's config where it is on this machine (nothing is downloaded); a failure is the run's own
    line. A plan without CUDA checks the lengths from config.json only (no transformers import)."""
    if not where.dry_run:
        return []
    light = run.plan.device != "cuda"
    if not light:
        quiet_libraries()  # building the model's skeleton: no library chatter
    return [Note("Model checks", model_checks.check_offline(run.cfg, light))]


def _data(run: Run, where: Where) -> list[Note]:
    """``--dry-run``: the task's data check on the first rows of this machine's data, also for
    another machine's plan (``Task.check_data``; a bad row raises its line). A worker's task checks
    the rows it loaded in its build (``Workload.data_report``)."""
    if not where.dry_run:
        return []
    from xtrain.tasks.data_check import ROWS
    from xtrain.tasks.data_report import cut_warnings, nothing_to_learn

    task = tasks.get(run.cfg.model.task)
    if task.check_data is None:
        return [Note("Data", "", data=f"skipped: task {task.name} reads its own data")]
    quiet_libraries()  # tokenizer and builder chatter
    report = task.check_data(run.cfg, ROWS)
    if (refused := nothing_to_learn(report)) is not None:  # the run would stop after loading it all
        raise refused
    report.notes += cut_warnings(report)
    return [Note("Data", "", data=report)]
