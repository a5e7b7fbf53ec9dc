"""Resuming: which checkpoint (``run.resume``), whether it fits this run's config (the same
training: model, task, data; the same weights' shape), whether its run already finished, what
changed, and loading it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xtrain import tasks
from xtrain.errors import XtrainError, shown
from xtrain.train.checkpoint.layout import (
    RESULT_FILE,
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
# from the resumed step on, with a note naming the key and both values. What the checkpoint was
# trained on (``_SAME_TRAINING``: the model, the data and how its rows are read) is refused too
# under ``run.resume=auto``, all differences in one line: going on from a checkpoint with another
# model or data set is another training, asked for by naming the checkpoint (``run.resume=PATH``:
# then a note, as a model folder that moved needs).
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


_SAME_TRAINING = (
    ("model", "name_or_path"),
    ("data", "train"),
    ("data", "eval"),
    ("data", "eval_fraction"),  # which rows train
    ("data", "row_format"),  # how they are read: also what ``xtrain predict --data`` reads (xtrain_run.json)
    ("data", "text_column"),
    ("data", "text_pair_column"),
    ("data", "messages_column"),
    ("data", "prompt_column"),
    ("data", "response_column"),
    ("data", "label_column"),
    ("data", "image_column"),
    ("data", "audio_column"),
)

# how long a run trains: the same values on a folder whose run finished leave nothing to train
_LENGTH = (
    ("run", "max_steps"),
    ("run", "epochs"),
    ("batch", "global_batch"),
    ("run", "early_stopping_patience"),
    ("run", "early_stopping_threshold"),
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
    (checked against this run's config) and a note for each damaged checkpoint skipped for it.
    ``finished``: the run in this folder already ended at that checkpoint with this config's
    length (its ``train_result.json``, as written): nothing to train and nothing to write."""

    path: Path | None
    saved: TrainState | None
    damaged: list[str]
    finished: dict[str, Any] | None = None


def resume_point(output_dir: str | Path, resume: str | None, config: dict[str, Any]) -> ResumePoint:
    """Everything a user can get wrong about resuming, checked before anything starts
    (``find_resume``, ``read_state``, ``finished_result``); nothing is loaded or written."""
    damaged: list[str] = []  # a note for each damaged checkpoint that resume=auto skipped
    path = find_resume(output_dir, resume, damaged)
    if path is None:
        return ResumePoint(None, None, damaged)
    named = (resume or "").strip().lower() != "auto"  # run.resume=PATH: this checkpoint, asked for
    saved = read_state(path, config, named=named)
    return ResumePoint(path, saved, damaged, finished_result(output_dir, saved, config))


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


def read_state(path: Path, config: dict[str, Any], named: bool = False) -> TrainState:
    """xtrain's state of checkpoint ``path``; raises when the checkpoint cannot fit this run's
    config (another task or LoRA shape) or, unless the checkpoint was ``named`` (run.resume=PATH),
    was trained on another model or data (``trained_on``), before anything is loaded or written."""
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
    differ = [] if named else trained_on(state.config, config)
    if not named and not differ and state.start != start_hashes(config):
        name = (config.get("model") or {}).get("name_or_path")
        raise XtrainError(
            f"checkpoint {path} was trained from another result: the adapters of {name} changed since "
            "it was written (that run trained on)",
            f"train from the start in a new run.output_dir, or name the checkpoint (run.resume={path}) "
            "to go on from it anyway",
        )
    if differ:
        raise XtrainError(
            f"checkpoint {path} was trained on another "
            + ("model" if differ[0].startswith("model.") else "data set")
            + ": "
            + "; ".join(differ),
            f"train on it from the start in a new run.output_dir, or name the checkpoint "
            f"(run.resume={path}) to go on from it anyway",
        )
    return state


def start_hashes(config: dict[str, Any]) -> list[str]:
    """The sha256 of each adapter ``model.name_or_path`` starts from (``model.start``; [] for a
    base model), as a checkpoint records them."""
    from xtrain.model.start import start_of

    name = (config.get("model") or {}).get("name_or_path")
    return [a.sha256 for a in start_of(name).adapters] if isinstance(name, str) else []


def trained_on(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """How this run's model and data (``_SAME_TRAINING``) differ from a checkpoint's config, one
    ``key='old', this run 'new'`` each; a key either config lacks (older checkpoints) is not
    compared. A path spelt otherwise that names the same file is the same."""
    differ = []
    for section, key in _SAME_TRAINING:
        before, now = old.get(section) or {}, new.get(section) or {}
        if not isinstance(before, dict) or not isinstance(now, dict) or key not in before or key not in now:
            continue
        if not _same_source(before[key], now[key]):
            differ.append(f"{section}.{key}={shown(before[key], 120)}, this run has {shown(now[key], 120)}")
    return differ


def _same_source(old: Any, new: Any) -> bool:
    if _normal(old) == _normal(new):
        return True
    if not isinstance(old, str) or not isinstance(new, str):
        return False
    try:
        a, b = Path(old).expanduser(), Path(new).expanduser()
        return a.exists() and b.exists() and a.resolve() == b.resolve()
    except (OSError, ValueError):
        return False


def finished_result(
    output_dir: str | Path, saved: TrainState, config: dict[str, Any]
) -> dict[str, Any] | None:
    """The ``train_result.json`` of the run that already finished in ``output_dir`` at checkpoint
    ``saved``, when this config asks for the same length (``_LENGTH``); None when there is more to
    train (a longer run), or no finished run here (no final outputs, no readable result)."""
    out = Path(output_dir)
    if not ((out / "adapter").is_dir() or (out / "model").is_dir()):
        return None
    try:
        result = json.loads((out / RESULT_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(result, dict) or result.get("final_step") != saved.step:
        return None
    for section, key in _LENGTH:
        before, now = saved.config.get(section) or {}, config.get(section) or {}
        if isinstance(before, dict) and key in before and _normal(before[key]) != _normal(now.get(key)):
            return None
    return result


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
