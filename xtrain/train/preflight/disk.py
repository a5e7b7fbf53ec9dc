"""The checks that look at the disk: the output folder and the caches can be written
(``check_paths``, before anything is written), and the outputs fit the free space (``check_disk``,
once the model is built)."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from xtrain.builtin import cache_root
from xtrain.config.loading import config_to_dict
from xtrain.errors import XtrainError
from xtrain.planning.run import Run
from xtrain.train.checkpoint.layout import check_output_dir
from xtrain.train.checkpoint.resume import resume_point
from xtrain.train.preflight.notes import Note, Where

if TYPE_CHECKING:
    from collections.abc import Mapping

    from xtrain.config.schema import TrainConfig

SPECIAL_ROOTS = ("/proc", "/sys", "/dev")
TIGHT_FACTOR = 2.0  # less than this many times the estimate left: a note
BYTES_PER_TRAINABLE = 4 * 3  # fp32 weights + AdamW's two moments, per checkpoint


def _nearest_existing(path: Path) -> Path:
    for p in (path, *path.parents):
        if p.exists():
            return p
    return path


def _writable(folder: Path) -> str | None:
    """None when a file can be created in ``folder`` (or, when missing, in its nearest existing
    parent); else the OS's reason."""
    where = _nearest_existing(folder)
    if not where.is_dir():
        return f"{where} is not a folder"
    try:
        with tempfile.NamedTemporaryFile(dir=where, prefix=".xtrain-preflight-"):
            pass
    except OSError as e:
        return e.strerror or str(e)
    return None


def _special(path: Path) -> bool:
    if sys.platform == "win32":
        return False
    resolved = str(path.resolve())
    return any(resolved == r or resolved.startswith(r + "/") for r in SPECIAL_ROOTS)


def _hf_datasets_cache(env: Mapping[str, str]) -> Path:
    if env.get("HF_DATASETS_CACHE"):
        return Path(env["HF_DATASETS_CACHE"]).expanduser()
    home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(home).expanduser() / "datasets"


def check_paths(cfg: TrainConfig, environ: Mapping[str, str] | None = None) -> None:
    """Raise XtrainError (one line) when the output folder or a cache the run needs cannot be
    written. Writes nothing that stays (a probe file is created and removed)."""
    env = os.environ if environ is None else environ
    out = Path(cfg.run.output_dir).expanduser()
    if _special(out):
        raise XtrainError(
            f"run.output_dir {out} is on a special filesystem", "choose a folder on a disk, e.g. runs/my-run"
        )
    why = _writable(out)
    if why:
        raise XtrainError(
            f"run.output_dir {out} cannot be written: {why}", "choose a writable run.output_dir"
        )
    caches = [("HF_DATASETS_CACHE or HF_HOME", _hf_datasets_cache(env))]
    names = (str(cfg.model.name_or_path), *cfg.data.train_sources(), str(cfg.data.eval or ""))
    if any(n.startswith("builtin:") for n in names):
        caches.append(("XTRAIN_CACHE", cache_root().parent))
    for var, folder in caches:
        why = _writable(folder)
        if why:
            raise XtrainError(
                f"the cache folder {folder} cannot be written: {why}",
                f"set {var} to a writable folder (HOME may be read-only here)",
            )


def estimate_bytes(trainable: int, total: int, keep: int, save_merged: bool, saves: int = 1) -> int:
    """What a run writes under its output folder, roughly (checkpoints dominate). ``saves``:
    how many checkpoints the run writes in all (what ``keep=0``, keep all, keeps)."""
    kept = min(keep + 1, saves) if keep > 0 else saves
    checkpoint = trainable * BYTES_PER_TRAINABLE + 2**20
    final = trainable * 4 + (total * 4 if save_merged else 0)
    return kept * checkpoint + final


def check_disk(
    output_dir: str | Path, trainable: int, total: int, keep: int, save_merged: bool, saves: int = 1
) -> list[str]:
    """Refuse a run whose outputs cannot fit on the output folder's disk; a note when tight."""
    need = estimate_bytes(trainable, total, keep, save_merged, saves)
    try:
        free = shutil.disk_usage(_nearest_existing(Path(output_dir).expanduser())).free
    except OSError:
        return []
    if free < need:
        raise XtrainError(
            f"not enough disk space for run.output_dir {output_dir}: {_size(free)} free, "
            f"about {_size(need)} needed for the checkpoints and the final outputs",
            "free some space, lower run.keep_checkpoints, or choose another run.output_dir",
        )
    if free < TIGHT_FACTOR * need:
        return [f"disk space is tight: {_size(free)} free for about {_size(need)} of outputs"]
    return []


def _size(n: int) -> str:
    """``1.25 GiB``; below a GiB in MiB (a small disk or a tiny model would read "0.00 GiB")."""
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def _output(run: Run, where: Where) -> list[Note]:
    """``run.output_dir`` a folder (or not there yet) on a writable disk, the caches writable
    (``check_paths``): in the training process, before anything is written."""
    if not where.launcher:
        check_output_dir(run.cfg.run.output_dir)
        check_paths(run.cfg)
    return []


def _resume(run: Run, where: Where) -> list[Note]:
    """The launcher's look at ``run.output_dir``'s checkpoints (``checkpoint.resume_point``, read
    only): a resume that cannot be honoured (another model or data set, another LoRA shape, a
    damaged checkpoint) is refused before any process starts, and a dry run says where the run
    would start. A training process checks the same in its recipe; another machine's plan
    (``--facts``) has its output folder there."""
    if not where.launcher or not where.here:
        return []
    cfg = run.cfg
    point = resume_point(cfg.run.output_dir, cfg.run.resume, config_to_dict(cfg))
    if not where.dry_run or point.saved is None:
        return []
    if point.finished is not None:
        return [
            Note(
                "Resume", f"{cfg.run.output_dir} already finished, nothing to train (step {point.saved.step})"
            )
        ]
    return [Note("Resume", f"from {point.path} (step {point.saved.step})")]
