"""Preflight: what would fail after hours of training is checked before the first step.

The checks are data: ``CHECKS``, one tuple of small functions ``(run, where) -> notes``, each
returning the lines it has to say (``Note``: plain data) or raising the one ``XtrainError`` line
that refuses the run. ``run_checks`` runs them, in order, in two places: the launcher
(``xtrain train``, also ``--dry-run``) before any process starts, and every training process
(``python -m xtrain.run``, a spawned rank, ``xtrain.train.loop.train``) before its model loads.
``where`` (``Where``) says which, and a check that has nothing to do there returns no note; the
commands only render the notes (``xtrain.commands.train``), a worker prints its warnings. The
checks that need the built model or the Accelerator (free disk for the outputs, sharding against
the outputs, early stopping against the eval set) run in the recipe's setup.

The checks live by what they look at:

- ``disk.py``: the output folder and the caches can be written (``check_paths``, before anything
  is written; the one line names the variable to set), its checkpoints fit this run (the launcher:
  ``checkpoint.resume_point``), and the outputs fit the free space
  (``check_disk``, once the model is built: ``keep_checkpoints + 1`` checkpoints, the final
  adapter and the merged model; refused when they cannot fit, a note when it is tight).
- ``inputs.py``: where the model is (a local path that is not there, a hub model neither cached
  nor reachable: one line at once, ``model.hub``), and in a dry run the config against the
  model's config and the task's data check on the first rows.
- ``plan.py``: what the workers train with and why (precision, data loading, attention, loss),
  and the memory estimate against the smallest GPU.
- ``software.py``: the installed software against the plan (Windows gloo, FSDP/DeepSpeed,
  bitsandbytes, the experiment trackers: ``check_trackers``, accelerate's default config,
  lm-evaluation-harness and the tasks of ``eval.benchmarks``).
- ``notes.py``: ``Note``, ``Where`` and ``Check``, what they all share.
"""

from __future__ import annotations

from xtrain.planning.run import Run
from xtrain.train.preflight.disk import _output, _resume, _size, check_disk, check_paths, estimate_bytes
from xtrain.train.preflight.inputs import _data, _model, _model_source, _start
from xtrain.train.preflight.notes import WORKER, Check, Note, Where
from xtrain.train.preflight.plan import _attention, _loading, _loss, _memory, _precision, _sequence
from xtrain.train.preflight.software import (
    _accelerate_default,
    _benchmarks,
    _optimizer,
    _quantization,
    _sharding,
    _trackers,
    _windows_gloo,
    check_trackers,
)

__all__ = [
    "CHECKS",
    "WORKER",
    "Check",
    "Note",
    "Where",
    "_size",
    "check_disk",
    "check_paths",
    "check_trackers",
    "estimate_bytes",
    "run_checks",
]

# In this order: a training process writes nothing before its paths are checked, nor loads
# anything before its model is found; the launcher's lines read as the plan (precision, loading,
# attention, weights, memory), then what a dry run adds (the model and data checks), then what
# only a real launch needs (trackers, accelerate's file).
CHECKS: tuple[Check, ...] = (
    _output,
    _sharding,
    _model_source,
    _start,
    _resume,
    _precision,
    _loading,
    _attention,
    _sequence,
    _loss,
    _windows_gloo,
    _optimizer,
    _quantization,
    _memory,
    _model,
    _data,
    _benchmarks,
    _trackers,
    _accelerate_default,
)


def run_checks(run: Run, where: Where = WORKER) -> list[Note]:
    """Every check of ``CHECKS`` for ``run`` at ``where``, in order: their notes, or the first
    refusal raised (``XtrainError``)."""
    return [note for check in CHECKS for note in check(run, where)]
