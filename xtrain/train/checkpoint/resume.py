"""Resuming: which checkpoint (``run.resume``), whether it fits this run's config, what changed,
and loading it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xtrain import tasks
from xtrain.errors import XtrainError
from xtrain.train.checkpoint.layout import (
    STATE_FILE,
    TMP_DIR,
    TrainState,
    checkpoints_dir,
    list_checkpoints,
    written_by,
)
from xtrain.train.checkpoint.manifest import damage

if TYPE_CHECKING:
    from accelerate import Accelerator

# The one rule for config changes on resume. Values that live in what the checkpoint restores
# (the shape and scale of the trained weights, the optimizer's hyper-parameters, which
# accelerate loads back with its state) must match: a different value is refused, naming the
# key. These are the keys below, and the task's own (``Task.resume_keys``: which half holds
# adapters, which weights are frozen, the head's size). Every other value may change: it applies
# from the resumed step on, with a note naming the key and both values. (model.name_or_path may
# change: a model folder can move.)
_MUST_MATCH = (
    ("model", "task"),
    ("lora", "enabled"),
    ("lora", "r"),
    ("lora", "alpha"),
    ("lora", "target_modules"),
    ("lora", "modules_to_save"),
    ("lora", "use_dora"),  # the variant: the same weights mean another model under another one
    ("lora", "use_rslora"),
    ("lora", "init_weights"),  # PiSSA/OLoRA rebuild their residual base at resume
    ("optim", "name"),  # torch's and bitsandbytes' optimizer states do not load into each other
    ("optim", "lr"),
    ("optim", "betas"),
    ("optim", "eps"),
    ("optim", "weight_decay"),
    ("optim", "lr_scaling"),
    ("optim", "base_global_batch"),
)


def must_match(config: dict[str, Any]) -> list[tuple[str, str]]:
    """The ``(section, key)`` pairs a resume must keep: the common ones and the task's own."""
    task = (config.get("model") or {}).get("task")
    own = tasks.all_tasks().get(task) if isinstance(task, str) else None
    extra = [tuple(k.split(".", 1)) for k in own.resume_keys] if own is not None else []
    return [*_MUST_MATCH, *(pair for pair in extra if pair not in _MUST_MATCH)]


# keys whose change has its own note below (or that only say where this run is)
_OWN_NOTE = {
    "model.name_or_path",
    "batch.global_batch",
    "run.max_steps",
    "run.epochs",
    "run.resume",
    "run.output_dir",
}


@dataclass(frozen=True)
class ResumePoint:
    """Where a run starts: the checkpoint to resume from (None: a new run), its xtrain state
    (checked against this run's config) and a note for each damaged checkpoint skipped for it."""

    path: Path | None
    saved: TrainState | None
    damaged: list[str]


def resume_point(output_dir: str | Path, resume: str | None, config: dict[str, Any]) -> ResumePoint:
    """Everything a user can get wrong about resuming, checked before anything starts
    (``find_resume``, ``read_state``); nothing is loaded or written."""
    damaged: list[str] = []  # a note for each damaged checkpoint that resume=auto skipped
    path = find_resume(output_dir, resume, damaged)
    return ResumePoint(path, read_state(path, config) if path is not None else None, damaged)


def find_resume(output_dir: str | Path, resume: str | None, notes: list[str] | None = None) -> Path | None:
    """The checkpoint to resume from, or None to start fresh. Reads only; raises XtrainError
    for a resume request that cannot be honoured (before anything is written). With ``auto``
    a damaged checkpoint is skipped for the newest intact one (a note for each goes to
    ``notes``); when none is intact the run stops with the reasons."""
    out = Path(output_dir)
    mode = (resume or "off").strip()
    existing = list_checkpoints(out)
    if mode.lower() == "auto":
        if existing:
            reasons = []
            for _, path in reversed(existing):
                why = damage(path)
                if why is None:
                    if notes is not None:
                        notes += [
                            f"checkpoint {p} is damaged ({r}): resuming from {path.name}" for p, r in reasons
                        ]
                    return path
                reasons.append((path, why))
            raise XtrainError(
                f"no checkpoint in {checkpoints_dir(out)} is intact: "
                + "; ".join(f"{p.name}: {r}" for p, r in reasons),
                "start again in a new run.output_dir (nothing was changed)",
            )
        if (out / "adapter").exists() or (out / "model").exists():
            raise XtrainError(
                f"{out} already holds a finished training's output but no checkpoint to resume from",
                "choose a new run.output_dir (nothing was changed)",
            )
        return None
    if mode.lower() in ("off", "no", "false", "none", ""):
        if existing or (out / "adapter").exists() or (out / "model").exists():
            what = f"checkpoints up to step-{existing[-1][0]}" if existing else "a finished training"
            raise XtrainError(
                f"{out} already holds {what}; resume=off would overwrite them",
                "use run.resume=auto to continue, or a new run.output_dir",
            )
        return None
    path = Path(mode).expanduser()
    if not path.exists():
        raise XtrainError(f"checkpoint {path} does not exist", "use run.resume=auto, or a step-N folder")
    if not path.is_dir():
        raise XtrainError(
            f"run.resume={path} is a file, not a checkpoint folder", "point it at a step-N folder"
        )
    if TMP_DIR.match(path.name) or not (path / STATE_FILE).is_file():
        raise XtrainError(
            f"checkpoint {path} is incomplete (its write did not finish)",
            f"resume from an earlier step-N folder in {path.parent}",
        )
    why = damage(path)
    if why is not None:
        raise XtrainError(
            f"checkpoint {path} is damaged: {why}", f"resume from another step-N folder in {path.parent}"
        )
    return path


def read_state(path: Path, config: dict[str, Any]) -> TrainState:
    """xtrain's state of checkpoint ``path``; raises when the checkpoint cannot fit this run's
    config (another model or LoRA shape), before anything is loaded or written."""
    try:
        state = TrainState.from_file(path / STATE_FILE)
    except (OSError, ValueError, TypeError) as e:
        raise XtrainError(
            f"checkpoint {path} cannot be read: {e}",
            f"resume from another step-N folder in {path.parent}, or use a new run.output_dir",
        ) from None
    for section, key in must_match(config):
        if key not in (state.config.get(section) or {}):
            continue  # a key newer than the checkpoint: it had the default then
        old = (state.config.get(section) or {}).get(key)
        new = (config.get(section) or {}).get(key)
        if state.config and key in (state.config.get(section) or {}) and _normal(old) != _normal(new):
            raise XtrainError(
                f"checkpoint {path.name} was trained with {section}.{key}={old!r}, this run has {new!r}",
                f"set {section}.{key}={old!r} to resume, or use a new run.output_dir",
            )
    return state


def changes(
    state: TrainState, config: dict[str, Any], global_batch: int, num_samples: int, total_steps: int
) -> list[str]:
    """What differs from the run that wrote the checkpoint (shown as notes, not errors)."""
    notes = [f"resuming at step {state.step} (epoch {state.epoch}, {state.samples_seen} samples seen)"]
    if state.world_size:
        notes[0] += f", written by {state.world_size} process{'es' if state.world_size != 1 else ''}"
    if state.global_batch != global_batch:
        notes.append(
            f"global batch changed from {state.global_batch} to {global_batch}: the data order after "
            f"step {state.step} differs from the original run"
        )
    if state.num_samples != num_samples:
        notes.append(
            f"the training set changed from {state.num_samples} to {num_samples} samples: the data "
            "order differs from the original run"
        )
    old_model = (state.config.get("model") or {}).get("name_or_path")
    new_model = (config.get("model") or {}).get("name_or_path")
    if old_model and old_model != new_model:
        notes.append(f"model.name_or_path changed from {old_model} to {new_model}")
    if state.total_steps != total_steps:
        notes.append(f"the run length changed from {state.total_steps} to {total_steps} steps")
    must = {f"{s}.{k}" for s, k in must_match(config)}
    for section, values in sorted(config.items()):
        old_section = state.config.get(section) or {}
        if not isinstance(values, dict) or not isinstance(old_section, dict):
            continue
        for key, new in sorted(values.items()):
            name = f"{section}.{key}"
            if name in must or name in _OWN_NOTE or key not in old_section:
                continue
            old = old_section[key]
            if _normal(old) != _normal(new):
                notes.append(f"{name} changed from {old!r} to {new!r}: applied from step {state.step} on")
    return notes


def _normal(value: Any) -> Any:
    """JSON round trip: a tuple read back from a checkpoint is a list."""
    return json.loads(json.dumps(value, default=str))


def load(accelerator: Accelerator, path: Path) -> None:
    """Restore model, optimizer, scheduler, scaler and RNG from ``path`` (all ranks).

    A rank that did not exist when the checkpoint was written has no RNG file there: accelerate
    then keeps the seeded RNG, which is fine because xtrain reseeds from (seed, step,
    micro-batch) before every forward pass anyway.

    Sharded checkpoints (FSDP, DeepSpeed) load only under the same kind of launch: each writes
    the model in its own format. FSDP's loads into another process count (torch.distributed.
    checkpoint reshards)."""
    from accelerate.utils import DistributedType

    running = {DistributedType.FSDP: "FSDP", DistributedType.DEEPSPEED: "DeepSpeed"}.get(
        accelerator.distributed_type, "plain"
    )
    written = written_by(path)
    if written != running:
        how = {"FSDP": "with FSDP", "DeepSpeed": "with DeepSpeed", "plain": "without FSDP/DeepSpeed"}
        raise XtrainError(
            f"checkpoint {path.name} was written {how[written]}; this run is launched {how[running]}",
            f"resume it launched {how[written]} (xtrain train --fsdp / --deepspeed, or the accelerate "
            "config), or start in a new run.output_dir",
        )
    accelerator.load_state(str(path))
