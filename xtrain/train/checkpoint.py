"""Checkpoints, resume and the final outputs.

Layout under ``output_dir``::

    checkpoints/step-N/      accelerate's save_state (model, optimizer, scheduler, scaler,
                             per-rank RNG) + manifest.json (every file's size, and sha256 up to
                             HASH_LIMIT) + xtrain_state.json (step, data position, config),
                             written last: it marks the checkpoint complete
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
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from xtrain import atomic
from xtrain.errors import XtrainError

CHECKPOINTS = "checkpoints"
STATE_FILE = "xtrain_state.json"
MANIFEST_FILE = "manifest.json"
HASH_LIMIT = 64 * 2**20  # files up to this size are hashed too (LoRA checkpoints: all of them)
# per-rank RNG states: optional on load (accelerate keeps the seeded RNG without them), and on
# several machines without a shared disk each machine has only its own
_OPTIONAL = re.compile(r"^random_states_\d+\.pkl$")
STATE_VERSION = 1
_STEP_DIR = re.compile(r"^step-(\d+)$")
_TMP_DIR = re.compile(r"^step-(\d+)\.tmp$")

# The one rule for config changes on resume. Values that live in what the checkpoint restores
# (the shape and scale of the trained weights, the optimizer's hyper-parameters, which
# accelerate loads back with its state) must match: a different value is refused, naming the
# key. Every other value may change: it applies from the resumed step on, with a note naming
# the key and both values. (model.name_or_path may change: a model folder can move.)
_MUST_MATCH = (
    ("model", "task"),
    ("model", "custom"),
    ("model", "num_labels"),
    ("lora", "enabled"),
    ("lora", "r"),
    ("lora", "alpha"),
    ("lora", "target_modules"),
    ("lora", "modules_to_save"),
    ("optim", "lr"),
    ("optim", "betas"),
    ("optim", "eps"),
    ("optim", "weight_decay"),
    ("optim", "lr_scaling"),
    ("optim", "base_global_batch"),
    ("lora", "apply_to"),  # image-to-text: which half holds adapters
    ("model", "freeze_encoder"),  # speech-to-text: which weights the optimizer holds
)
# keys whose change has its own note below (or that only say where this run is)
_OWN_NOTE = {
    "model.name_or_path",
    "batch.global_batch",
    "run.max_steps",
    "run.epochs",
    "run.resume",
    "run.output_dir",
}


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


def _sha256(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_manifest(folder: Path) -> None:
    """Record every file of a checkpoint being written (sizes, and hashes of the small ones)."""
    files: dict[str, dict[str, Any]] = {}
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder).as_posix()
        if not p.is_file() or rel in (STATE_FILE, MANIFEST_FILE) or _OPTIONAL.match(rel):
            continue
        size = p.stat().st_size
        files[rel] = {"size": size, **({"sha256": _sha256(p)} if size <= HASH_LIMIT else {})}
    atomic.write_text(folder / MANIFEST_FILE, json.dumps({"version": 1, "files": files}, indent=1))


def damage(path: Path) -> str | None:
    """Why checkpoint ``path`` cannot be resumed from (None: intact). Checks that the state file
    parses and, when a manifest was written (every checkpoint since manifests exist), that each
    file it lists is there with its size and hash."""
    try:
        state = json.loads((path / STATE_FILE).read_text(encoding="utf-8"))
        if not isinstance(state, dict):
            return f"{STATE_FILE} is not a JSON object"
    except OSError as e:
        return f"{STATE_FILE} cannot be read ({e.strerror or e})"
    except ValueError:
        return f"{STATE_FILE} is not valid JSON"
    manifest = path / MANIFEST_FILE
    if not manifest.exists():
        return None  # written before manifests existed: the state file is all there is to check
    try:
        files = json.loads(manifest.read_text(encoding="utf-8"))["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"{MANIFEST_FILE} cannot be read"
    for rel, want in files.items():
        p = path / rel
        if not p.is_file():
            return f"{rel} is missing"
        size = p.stat().st_size
        if size != want.get("size"):
            return f"{rel} has {size} bytes, {want.get('size')} were written"
        if "sha256" in want and _sha256(p) != want["sha256"]:
            return f"{rel} does not match the hash written with it"
    return None


def find_resume_checked(output_dir: str | Path, resume: str | None) -> tuple[Path | None, list[str]]:
    """``find_resume`` plus a note for each damaged checkpoint that ``resume=auto`` skipped."""
    notes: list[str] = []
    return find_resume(output_dir, resume, notes), notes


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
    if _TMP_DIR.match(path.name) or not (path / STATE_FILE).is_file():
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
    for section, key in _MUST_MATCH:
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
    must = {f"{s}.{k}" for s, k in _MUST_MATCH}
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


# -- writing -------------------------------------------------------------------------------------
def remove_partial(output_dir: str | Path) -> list[Path]:
    """Delete unfinished writes: checkpoints (``step-N.tmp``) and final outputs (``adapter.tmp``,
    ``adapter.old``, ``train_result.json.tmp``, ...) of a run that was killed (main process)."""
    out = Path(output_dir)
    gone = partial_checkpoints(out)
    for name in ("adapter", "model", "merged"):
        gone += [p for p in (out / f"{name}.tmp", out / f"{name}.old") if p.is_dir()]
    for p in gone:
        shutil.rmtree(p, ignore_errors=True)
    leftover = out / "train_result.json.tmp"
    if leftover.is_file():
        leftover.unlink(missing_ok=True)
        gone.append(leftover)
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
        write_manifest(tmp)
        atomic.write_text(tmp / STATE_FILE, state.to_json())  # last: marks the checkpoint complete
        if final.exists():  # the same step saved before (e.g. a finished run re-exported)
            shutil.rmtree(final)
        atomic.replace(tmp, final)
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
        atomic.replace(final, old)
        atomic.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        atomic.replace(tmp, final)


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


def write_result(output_dir: str | Path, result: dict[str, Any], keep: bool = False) -> Path:
    """Write train_result.json; with ``keep`` an existing one stays as it is."""
    path = Path(output_dir) / "train_result.json"
    if keep and path.is_file():
        return path
    atomic.write_text(path, json.dumps(result, indent=1, default=str))
    return path
