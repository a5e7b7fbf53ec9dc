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

The primitives they call:

- ``check_paths`` (before anything is written): the output folder is not on a special
  filesystem (/proc, /sys, /dev) and can be written; the caches the run will write to
  (the datasets cache under HF_HOME / HF_DATASETS_CACHE, XTRAIN_CACHE for built-in models and
  data, both under HOME by default) are writable, or the one line names the variable to set.
- ``check_trackers`` (with the plan, before any process starts): every experiment tracker the
  run reports to (``run.report_to``) is installed, or the one line names the pip command of its
  extra in the user's shell.
- ``check_disk`` (once the model is built, before the first step): the free space of the output
  folder against what the run will write: ``keep_checkpoints + 1`` checkpoints (a new one is
  complete before the oldest goes), the final adapter and the merged model. Refused when it
  cannot fit, a note when it is tight.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from xtrain import tasks
from xtrain.builtin import cache_root
from xtrain.errors import XtrainError
from xtrain.launch import sharding
from xtrain.machine.facts import Facts
from xtrain.model import attention, memory, quantization
from xtrain.planning.checks.comms import windows_gloo_refusal
from xtrain.planning.checks.fixes import pip_line
from xtrain.planning.run import Run
from xtrain.runtime.quiet import quiet_libraries
from xtrain.shell import pip_command
from xtrain.tasks import model_checks
from xtrain.tasks.sizes import offline_sizes
from xtrain.train import optim
from xtrain.train.checkpoint.layout import check_output_dir
from xtrain.train.levers import loss_words
from xtrain.train.tracking import PACKAGES, missing

if TYPE_CHECKING:
    from collections.abc import Mapping

    from xtrain.config.schema import TrainConfig
    from xtrain.launch.sharding import Kind
    from xtrain.tasks.data_report import DataReport

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
    names = (str(cfg.model.name_or_path), str(cfg.data.train or ""), str(cfg.data.eval or ""))
    if any(n.startswith("builtin:") for n in names):
        caches.append(("XTRAIN_CACHE", cache_root().parent))
    for var, folder in caches:
        why = _writable(folder)
        if why:
            raise XtrainError(
                f"the cache folder {folder} cannot be written: {why}",
                f"set {var} to a writable folder (HOME may be read-only here)",
            )


def check_trackers(trackers: tuple[str, ...], shell: str, executable: str | None = None) -> None:
    """Refuse a tracker that is not installed, with the line that installs its package (for the
    interpreter that runs xtrain, quoted for ``shell``)."""
    absent = missing(trackers)
    if absent:
        names = " and ".join(absent)
        pip = pip_command(shell, executable or sys.executable, ["install", *(PACKAGES[t] for t in absent)])
        raise XtrainError(
            f"run.report_to names {names}, which {'is' if len(absent) == 1 else 'are'} not installed",
            f"install with: {pip}",
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


# ---------------------------------------------------------------------------------------------
# The checks, as data


@dataclass(frozen=True)
class Note:
    """One line a check says: ``label`` (``Attention``, ``Weights``, ...) and its text, at a
    ``level``: info (the launcher shows it), warning or error (every side shows it), dim (an
    aside); ``data``: the data check's report, which the command renders as a block."""

    label: str
    text: str
    level: str = "info"  # info | warning | error | dim
    data: DataReport | str | None = None


@dataclass(frozen=True)
class Where:
    """Where the checks run: the launcher before any process starts (``launcher``), with a plan
    for this machine (``here``; False: a ``--facts`` snapshot's) and ``dry_run``; else a training
    process. ``sharding``: what the launch options or accelerate's config ask for (fsdp, zero2,
    zero3; ``sharding_from_options``: the options did)."""

    launcher: bool = False
    here: bool = True
    dry_run: bool = False
    sharding: Kind | None = None
    sharding_from_options: bool = False


WORKER = Where()
Check = Callable[[Run, Where], list[Note]]


def _precision(run: Run, where: Where) -> list[Note]:
    """The precision the workers train in and why (the launcher's line), and a precision that
    narrows the weights' range (``checks.precision``), said by the launcher and by a worker that
    planned itself (a plan xtrain's launcher sent has no findings: its command said them)."""
    plan = run.plan
    notes = []
    if where.launcher:
        shown = plan.mixed_precision if plan.mixed_precision != "no" else "fp32"
        why = plan.reasons.get("mixed_precision", "")
        notes.append(Note("Precision", f"{shown} ({why})" if why else shown))
    for f in run.findings:
        if f.code.startswith("precision-"):
            notes.append(Note("warning", f.message + (f"; fix: {f.fix}" if f.fix else ""), "warning"))
    return notes


def _loading(run: Run, where: Where) -> list[Note]:
    """The DataLoader workers each process reads its batches with, and why."""
    if not where.launcher:
        return []
    workers, why = run.settings.workers_for(tasks.get(run.cfg.model.task).decodes_media)
    return [Note("Data loading", f"{workers} worker(s) per process ({why})")]


def _attention(run: Run, where: Where) -> list[Note]:
    """The attention implementation the plan's workers will load with, and why; an explicit
    ``model.attn_implementation`` that cannot work stops here (a worker decides at load)."""
    if not where.launcher:
        return []
    chosen = attention.for_plan(run, tasks.get(run.cfg.model.task).model_class)
    return [Note("Attention", chosen.summary())]


def _loss(run: Run, where: Where) -> list[Note]:
    """Which loss the workers train with and why (``model.chunked_loss``), and whether their
    activations go to host memory (``model.activation_offload``); ``model.chunked_loss=on`` for a
    task without a vocabulary stops here. Each worker checks its model's head (``train/levers.py``:
    a config whose loss the chunked loss does not reproduce runs the plain loss under auto)."""
    if not where.launcher:
        return []
    settings = run.settings
    token_loss = tasks.get(run.cfg.model.task).token_loss
    chunked, why = settings.loss_for(token_loss)
    notes = [Note("Loss", f"{loss_words(token_loss, chunked)} ({why})")]
    if settings.activation_offload:
        moved = "saved for the backward pass in host memory (model.activation_offload)"
        notes.append(Note("Activations", moved))
    return notes


def _windows_gloo(run: Run, where: Where) -> list[Note]:
    """A Windows torch whose gloo cannot form a group (``checks.comms``): refused before any
    process starts; a dry run shows it as an error line."""
    if not where.launcher or run.facts is None:
        return []
    refusal = windows_gloo_refusal(run.facts, run.plan)
    if refusal is None:
        return []
    if not where.dry_run:
        raise refusal
    return [Note("error", refusal.one_line(), "error")]


def _sharding(run: Run, where: Where) -> list[Note]:
    """FSDP/DeepSpeed where they cannot run (``launch.sharding``), refused before any process starts."""
    if not where.launcher or where.sharding is None:
        return []
    pip = pip_line(run.facts or Facts(), run.plan, ["install", "deepspeed"])
    sharding.check(where.sharding, run.plan, where.sharding_from_options, pip, where.here)
    return []


def _optimizer(run: Run, where: Where) -> list[Note]:
    """An 8-bit ``optim.name`` (bitsandbytes) that cannot run on the plan's device: refused
    before any process starts and in the worker before its model loads (the machine that
    refuses is this one: not for a ``--facts`` snapshot's plan)."""
    if where.here:
        optim.check_backend(run.cfg.optim.name, run.plan.device)
    return []


def _quantization(run: Run, where: Where) -> list[Note]:
    """What ``model.quantization`` loads the weights as; refused where this machine's
    bitsandbytes cannot run it on the plan's device."""
    quantization_name = run.cfg.model.quantization
    if quantization_name is None:
        return []
    if where.here:
        quantization.check_backend(quantization_name, run.plan.device)
    return [Note("Weights", quantization.describe(quantization_name) or "")] if where.launcher else []


def _memory(run: Run, where: Where) -> list[Note]:
    """The plan's memory estimate against its smallest GPU, and the warning when it does not fit.
    CUDA plans only: transformers (seconds to import) loads only then. A model whose config is
    not on this machine is skipped in a dim line (nothing is downloaded). A worker checks its
    built model instead (``Recipe``)."""
    if not where.launcher or run.facts is None:
        return []
    plan, cfg = run.plan, run.cfg
    gpus = [(g.index, g.name, g.memory_mib) for g in run.facts.gpus]
    gpu = memory.smallest_gpu(gpus, plan.gpu_ids) if plan.device == "cuda" else None
    if gpu is None:
        return []
    quiet_libraries()  # building the model's skeleton: no library chatter
    sizes = offline_sizes(cfg)
    if isinstance(sizes, str):
        return [Note("", f"memory estimate skipped: {sizes}", "dim")]
    task, settings, facts = tasks.get(cfg.model.task), run.settings, run.facts
    levers = memory.MemoryLevers(  # the chunked loss and offloading as the run has them, and can offer
        chunked=settings.loss_for(task.token_loss)[0],
        chunkable=task.token_loss is not None and settings.chunked_loss == "off" and not cfg.run.compile,
        offload=settings.activation_offload,
        host_gib=facts.memory_mib / 1024 if facts.memory_mib and not cfg.run.compile else None,
        processes=plan.num_processes,
    )
    check = memory.check_memory(
        sizes, cfg.batch.per_device, cfg.data.max_length, cfg.model.gradient_checkpointing, run.precision,
        gpu[1], gpu[0], images=task.image_tokens, windows=facts.os_kind == "windows", levers=levers,
    )  # fmt: skip
    notes = [Note("Memory", check.summary())]
    return notes + ([Note("warning", check.warning, "warning")] if check.warning else [])


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

    task = tasks.get(run.cfg.model.task)
    if task.check_data is None:
        return [Note("Data", "", data=f"skipped: task {task.name} reads its own data")]
    quiet_libraries()  # tokenizer and builder chatter
    return [Note("Data", "", data=task.check_data(run.cfg, ROWS))]


def _output(run: Run, where: Where) -> list[Note]:
    """``run.output_dir`` a folder (or not there yet) on a writable disk, the caches writable
    (``check_paths``): in the training process, before anything is written."""
    if not where.launcher:
        check_output_dir(run.cfg.run.output_dir)
        check_paths(run.cfg)
    return []


def _trackers(run: Run, where: Where) -> list[Note]:
    """Every tracker ``run.report_to`` names is installed (``check_trackers``)."""
    if not where.dry_run:
        check_trackers(run.settings.trackers, run.plan.shell)
    return []


def _accelerate_default(run: Run, where: Where) -> list[Note]:
    """accelerate's launcher reads its default config (under HF_HOME) and dies with a YAML
    traceback when that file is broken: refused first, naming the file (the probe read it)."""
    plan, facts = run.plan, run.facts
    if not where.launcher or where.dry_run or facts is None:
        return []
    if plan.world_size > 1 and plan.launcher != "spawn" and facts.accelerate_config_error:
        raise XtrainError(
            f"accelerate's default config {facts.accelerate_config_path} cannot be read: "
            f"{facts.accelerate_config_error}",
            "fix it, or rewrite it with `xtrain configure --force`, which keeps the old file as a backup",
        )
    return []


# In this order: a training process writes nothing before its paths are checked; the launcher's
# lines read as the plan (precision, loading, attention, weights, memory), then what a dry run
# adds (the model and data checks), then what only a real launch needs (trackers, accelerate's file).
CHECKS: tuple[Check, ...] = (
    _output,
    _sharding,
    _precision,
    _loading,
    _attention,
    _loss,
    _windows_gloo,
    _optimizer,
    _quantization,
    _memory,
    _model,
    _data,
    _trackers,
    _accelerate_default,
)


def run_checks(run: Run, where: Where = WORKER) -> list[Note]:
    """Every check of ``CHECKS`` for ``run`` at ``where``, in order: their notes, or the first
    refusal raised (``XtrainError``)."""
    return [note for check in CHECKS for note in check(run, where)]
