"""Checkpoints, resume and the final outputs.

Layout under ``output_dir``::

    checkpoints/step-N/      accelerate's save_state (model, optimizer, scheduler, scaler,
                             per-rank RNG) + manifest.json (every file's size, and sha256 up to
                             HASH_LIMIT) + xtrain_state.json (step, data position, config),
                             written last: it marks the checkpoint complete. Under FSDP the
                             model and optimizer are accelerate's torch.distributed.checkpoint
                             folders (pytorch_model_fsdp_0/, optimizer_0/), under DeepSpeed its
                             engine's (pytorch_model/); such a checkpoint resumes only under
                             the same kind of launch (``resume.load``)
    checkpoints/step-N/adapter/  a LoRA run's adapter at that step, as the final one is written
                             (tokenizer, record): a start or a predict of its own
    checkpoints/step-N.tmp/  a checkpoint being written: renamed to step-N only when complete,
                             so a crash mid-write never leaves a step-N that cannot be loaded
    adapter/                 the final PEFT adapter (+ tokenizer): PeftModel.from_pretrained
    model/                   the final full model instead, when LoRA is off
    merged/                  the LoRA-merged full model (run.save_merged)
    train_result.json        losses, eval metrics, throughput, output paths

Every write goes to a temporary name first and is renamed into place, and errors a user can
cause are raised before anything is written. A checkpoint is verified against its manifest
before it is resumed from: with ``run.resume=auto`` a damaged newest checkpoint is skipped
(with a note) for the newest intact one.

- ``layout.py``: the names, ``TrainState``, listing complete and unfinished checkpoints.
- ``manifest.py``: the manifest written with a checkpoint, and ``damage`` (the check against it).
- ``save.py``: ``save``, ``rotate``, ``remove_partial``, the model hooks (trainable weights only),
  ``write_on_main`` (a main-process write that every rank sees fail the same way).
- ``faults.py``: the filesystem failing under a write (disk full, permission) as one line.
- ``resume.py``: ``resume_point`` (``find_resume``, ``read_state``: does it fit this config),
  ``changes``, ``load``.
- ``outputs.py``: ``save_final``, ``save_best``, ``write_result`` (a sharded model's weights
  are gathered first: ``xtrain.train.distributed.sharded.save_on_main``).

The loop (``train/loop.py``) reaches all of them as ``checkpoint.NAME``: the names below are that
one interface.
"""

from xtrain.train.checkpoint.layout import (
    CHECKPOINTS,
    MANIFEST_FILE,
    STATE_FILE,
    TrainState,
    check_output_dir,
    checkpoints_dir,
    list_checkpoints,
    partial_checkpoints,
)
from xtrain.train.checkpoint.outputs import (
    BEST,
    checkpoint_result,
    is_new_best,
    save_best,
    save_final,
    write_result,
)
from xtrain.train.checkpoint.resume import ResumePoint, changes, find_resume, load, read_state, resume_point
from xtrain.train.checkpoint.save import install_model_hooks, remove_partial, rotate, save, write_on_main

__all__ = [
    "BEST",
    "CHECKPOINTS",
    "MANIFEST_FILE",
    "ResumePoint",
    "STATE_FILE",
    "TrainState",
    "changes",
    "check_output_dir",
    "checkpoint_result",
    "checkpoints_dir",
    "find_resume",
    "install_model_hooks",
    "is_new_best",
    "list_checkpoints",
    "load",
    "partial_checkpoints",
    "read_state",
    "remove_partial",
    "resume_point",
    "rotate",
    "save",
    "save_best",
    "save_final",
    "write_on_main",
    "write_result",
]
