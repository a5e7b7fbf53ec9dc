"""Checkpoints, resume and the final outputs.

Layout under ``output_dir``::

    checkpoints/step-N/      accelerate's save_state (model, optimizer, scheduler, scaler,
                             per-rank RNG) + xtrain_state.json (step, data position, config)
    checkpoints/step-N.tmp/  a checkpoint being written: renamed to step-N only when complete,
                             so a crash mid-write never leaves a step-N that cannot be loaded
    adapter/                 the final PEFT adapter (+ tokenizer): PeftModel.from_pretrained
    model/                   the final full model instead, when LoRA is off
    merged/                  the LoRA-merged full model (run.save_merged)
    train_result.json        losses, eval metrics, throughput, output paths

Every write goes to a temporary name first and is renamed into place, and errors a user can
cause are raised before anything is written.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from xtrain.errors import XtrainError

CHECKPOINTS = "checkpoints"
STATE_FILE = "xtrain_state.json"
STATE_VERSION = 1
_STEP_DIR = re.compile(r"^step-(\d+)$")
_TMP_DIR = re.compile(r"^step-(\d+)\.tmp$")

# Config values that decide the shape of the trained weights: a checkpoint only fits a run
# whose values here are the same. (model.name_or_path may change: a model folder can move.)
_MUST_MATCH = (
    ("model", "task"),
    ("model", "custom"),
    ("lora", "enabled"),
    ("lora", "r"),
    ("lora", "target_modules"),
    ("lora", "modules_to_save"),
    ("lora", "apply_to"),  # image-to-text: which half holds adapters
    ("model", "freeze_encoder"),  # speech-to-text: which weights the optimizer holds
)


@dataclass
class TrainState:
    """What xtrain itself adds to accelerate's state: the position and the run's history."""

    step: int  # optimizer steps done
    epoch: int  # epoch of the next step
    step_in_epoch: int  # position of the next step inside its epoch
    samples_seen: int
    seed: int
    global_batch: int
    per_device: int
    world_size: int
    accumulation: int
    num_samples: int
    total_steps: int
    config: dict[str, Any] = field(default_factory=dict)
    losses: list[list[float]] = field(default_factory=list)  # [[step, loss], ...] at log points
    eval_history: list[dict[str, float]] = field(default_factory=list)
    skipped_steps: int = 0  # fp16 overflow steps the scaler skipped
    version: int = STATE_VERSION

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, default=str)

    @classmethod
    def from_file(cls, path: Path) -> TrainState:
        data = json.loads(path.read_text(encoding="utf-8"))
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})


# -- finding checkpoints ---------------------------------------------------------------------
def checkpoints_dir(output_dir: str | Path) -> Path:
    return Path(output_dir) / CHECKPOINTS


def is_complete(path: Path) -> bool:
    return path.is_dir() and _STEP_DIR.match(path.name) is not None and (path / STATE_FILE).is_file()


def list_checkpoints(output_dir: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints, oldest first, as (step, path)."""
    root = checkpoints_dir(output_dir)
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = _STEP_DIR.match(p.name)
        if m and is_complete(p):
            found.append((int(m.group(1)), p))
    return sorted(found)


def partial_checkpoints(output_dir: str | Path) -> list[Path]:
    """Checkpoints whose write did not finish (``step-N.tmp``)."""
    root = checkpoints_dir(output_dir)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if _TMP_DIR.match(p.name))


def check_output_dir(output_dir: str | Path) -> Path:
    """``run.output_dir`` must be a folder or not exist yet (checked before anything starts)."""
    out = Path(output_dir).expanduser()
    for p in (out, *out.parents):
        if p.exists() and not p.is_dir():
            raise XtrainError(
                f"run.output_dir {out} cannot be a folder: {p} is a file", "choose another run.output_dir"
            )
    return out


def find_resume(output_dir: str | Path, resume: str | None) -> Path | None:
    """The checkpoint to resume from, or None to start fresh. Reads only; raises XtrainError
    for a resume request that cannot be honoured (before anything is written)."""
    out = Path(output_dir)
    mode = (resume or "off").strip()
    existing = list_checkpoints(out)
    if mode.lower() == "auto":
        if existing:
            return existing[-1][1]
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
    if _TMP_DIR.match(path.name) or not (path / STATE_FILE).is_file():
        raise XtrainError(
            f"checkpoint {path} is incomplete (its write did not finish)",
            f"resume from an earlier step-N folder in {path.parent}",
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
    for section, key in _MUST_MATCH:
        if key not in (state.config.get(section) or {}):
            continue  # a key newer than the checkpoint: it had the default then
        old = (state.config.get(section) or {}).get(key)
        new = (config.get(section) or {}).get(key)
        if state.config and old != new:
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
    return notes


# -- writing -------------------------------------------------------------------------------------
def _write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def remove_partial(output_dir: str | Path) -> list[Path]:
    """Delete unfinished checkpoint writes (call on the main process only)."""
    gone = partial_checkpoints(output_dir)
    for p in gone:
        shutil.rmtree(p, ignore_errors=True)
    return gone


def save(accelerator: Any, output_dir: str | Path, state: TrainState, keep: int) -> Path:
    """Write ``checkpoints/step-N`` on all ranks together: save_state into ``step-N.tmp``, then
    (main process) the xtrain state file, the rename, and the rotation."""
    root = checkpoints_dir(output_dir)
    final = root / f"step-{state.step}"
    tmp = root / f"step-{state.step}.tmp"
    if accelerator.is_main_process:
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp))
    accelerator.wait_for_everyone()  # every rank's files (RNG states) are in tmp
    if accelerator.is_main_process:
        _write_text_atomic(tmp / STATE_FILE, state.to_json())
        if final.exists():  # the same step saved before (e.g. a finished run re-exported)
            shutil.rmtree(final)
        os.replace(tmp, final)
        rotate(output_dir, keep)
    accelerator.wait_for_everyone()
    return final


def rotate(output_dir: str | Path, keep: int) -> list[Path]:
    """Keep the newest ``keep`` complete checkpoints (``keep < 1``: keep all)."""
    if keep < 1:
        return []
    old = [p for _, p in list_checkpoints(output_dir)[:-keep]]
    for p in old:
        shutil.rmtree(p, ignore_errors=True)
    return old


def install_model_hooks(accelerator: Any) -> None:
    """Make checkpoints hold the trainable weights only, under the unwrapped model's names.

    accelerate's own save_state writes the whole model under the wrapper's names ("module." with
    DDP). For LoRA that is the full base model in every checkpoint, and names that do not load
    when the process count changes (1 process has no DDP wrapper). With these hooks a checkpoint
    holds the adapter (or, for full fine-tuning, the whole state dict) and loads into any
    process count."""

    def model_file(folder: str | Path, i: int) -> Path:
        return Path(folder) / ("model.safetensors" if i == 0 else f"model_{i}.safetensors")

    def on_save(models: list[Any], weights: list[dict[str, Any]], output_dir: str) -> None:
        for i, m in enumerate(models):
            inner = accelerator.unwrap_model(m)
            named = dict(inner.named_parameters())
            trainable = {n for n, p in named.items() if p.requires_grad}
            state = inner.state_dict()
            weights[i] = (
                state if len(trainable) == len(named) else {n: state[n] for n in trainable if n in state}
            )

    def on_load(models: list[Any], input_dir: str) -> None:
        from safetensors.torch import load_file

        for i, m in enumerate(models):
            inner = accelerator.unwrap_model(m)
            path = model_file(input_dir, i)
            if not path.is_file():
                raise XtrainError(
                    f"checkpoint {input_dir} has no {path.name}", "resume from another step-N folder"
                )
            state = {k.removeprefix("module."): v for k, v in load_file(str(path)).items()}
            trainable = {n for n, p in inner.named_parameters() if p.requires_grad}
            result = inner.load_state_dict(state, strict=False)
            missing = trainable & set(result.missing_keys)
            if result.unexpected_keys or missing:
                raise XtrainError(
                    f"checkpoint {input_dir} does not fit this model "
                    f"({len(missing)} missing, {len(result.unexpected_keys)} unexpected weights)",
                    "resume with the model and LoRA settings the checkpoint was trained with",
                )
        models.clear()  # loaded here: accelerate skips its own model loading

    accelerator.register_save_state_pre_hook(on_save)
    accelerator.register_load_state_pre_hook(on_load)


def load(accelerator: Any, path: Path) -> None:
    """Restore model, optimizer, scheduler, scaler and RNG from ``path`` (all ranks).

    A rank that did not exist when the checkpoint was written has no RNG file there: accelerate
    then keeps the seeded RNG, which is fine because xtrain reseeds from (seed, step,
    micro-batch) before every forward pass anyway."""
    accelerator.load_state(str(path))


# -- final outputs -----------------------------------------------------------------------------
def _replace_dir(tmp: Path, final: Path) -> None:
    if final.exists():
        old = final.with_name(final.name + ".old")
        if old.exists():
            shutil.rmtree(old)
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)


def save_final(model: Any, tokenizer: Any, output_dir: str | Path, save_merged: bool) -> dict[str, str]:
    """Write the trained result (main process only). ``model`` is the unwrapped model.

    Returns {"adapter" | "model": path, "merged": path}."""
    out = Path(output_dir)
    paths: dict[str, str] = {}
    is_peft = hasattr(model, "peft_config") and hasattr(model, "merge_and_unload")
    name = "adapter" if is_peft else "model"
    tmp = out / f"{name}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    model.save_pretrained(str(tmp))
    if tokenizer is not None:
        tokenizer.save_pretrained(str(tmp))
    _replace_dir(tmp, out / name)
    paths[name] = str(out / name)
    if save_merged and is_peft:
        merged = model.merge_and_unload()  # changes the model: do it last
        tmp = out / "merged.tmp"
        if tmp.exists():
            shutil.rmtree(tmp)
        merged.save_pretrained(str(tmp))
        if tokenizer is not None:
            tokenizer.save_pretrained(str(tmp))
        _replace_dir(tmp, out / "merged")
        paths["merged"] = str(out / "merged")
    return paths


# -- the best model by an eval metric (run.best_metric) ------------------------------------------
BEST = "best"
_LOWER_IS_BETTER = ("loss", "cer", "wer", "perplexity", "error")


def lower_is_better(metric: str) -> bool:
    """Losses and error rates fall as a model improves; accuracies and scores rise."""
    return any(part in metric.lower() for part in _LOWER_IS_BETTER)


def is_new_best(metric: str, value: float, history: list[dict[str, float]]) -> bool:
    """Whether ``value`` beats every earlier eval in ``history`` (ties keep the earlier model)."""
    earlier = [h[metric] for h in history if metric in h]
    if not earlier:
        return True
    return value < min(earlier) if lower_is_better(metric) else value > max(earlier)


def save_best(
    model: Any, tokenizer: Any, output_dir: str | Path, step: int, metric: str, value: float
) -> Path:
    """``output_dir/best``: the model (adapter, or full model without LoRA) of the best eval so far,
    with ``best.json`` naming the step and the value (main process only; replaced atomically)."""
    out = Path(output_dir)
    tmp = out / f"{BEST}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    model.save_pretrained(str(tmp))
    if tokenizer is not None:
        tokenizer.save_pretrained(str(tmp))
    (tmp / "best.json").write_text(
        json.dumps({"step": step, "metric": metric, "value": value}), encoding="utf-8"
    )
    _replace_dir(tmp, out / BEST)
    return out / BEST


def write_result(output_dir: str | Path, result: dict[str, Any]) -> Path:
    path = Path(output_dir) / "train_result.json"
    _write_text_atomic(path, json.dumps(result, indent=1, default=str))
    return path
