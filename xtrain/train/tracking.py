"""Experiment trackers (``run.report_to``) through accelerate's: which are installed, where each
writes by default, and what the run tells them.

accelerate runs them on the main process only (its ``init_trackers`` and ``log`` are
main-process methods); the loop logs each window's loss, lr and throughput and each eval's
metrics with ``accelerator.log``. xtrain adds:

- a tracker named but not installed is refused before anything starts (``missing``, checked by
  ``preflight.check_trackers``), with the pip line of its extra;
- where each writes unless told otherwise: TensorBoard under ``output_dir/logs``; MLflow a file
  store under ``output_dir/mlruns`` unless ``MLFLOW_TRACKING_URI`` names another (a server,
  ``sqlite:///...``); W&B under ``output_dir/wandb`` (``WANDB_MODE=offline``: nothing leaves the
  machine); trackio in its own local folder (``TRACKIO_DIR``);
- the run's parameters: the config (flat ``section.key``) and the plan as it ran (``plan.*``);
- text (sample predictions) only to the trackers that show it.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xtrain.errors import XtrainError

if TYPE_CHECKING:
    import torch
    from accelerate import Accelerator

    from xtrain.planning.resolve import RunSettings

PROJECT = "xtrain"  # the experiment (MLflow), project (W&B, trackio) and TensorBoard run name
MLFLOW_URI_ENV = "MLFLOW_TRACKING_URI"
# what installs each tracker (pyproject's extra of the same name asks for the same). Install lines
# name these packages, never xtrain with an extra: the `xtrain` on the public index is another project.
PACKAGES = {
    "tensorboard": "tensorboard>=2.14",
    "mlflow": "mlflow-skinny>=2.12",  # the tracking client; `pip install mlflow` adds the UI
    "wandb": "wandb>=0.17",
    "trackio": "trackio>=0.2",
}
# the importable module(s) of each tracker
_MODULES = {
    "tensorboard": ("tensorboard", "tensorboardX"),
    "mlflow": ("mlflow",),
    "wandb": ("wandb",),
    "trackio": ("trackio",),
}
_TEXT = ("tensorboard", "wandb")  # trackers that show text; MLflow's metrics take numbers only


def installed(name: str) -> bool:
    """Whether tracker ``name`` can be imported, asked as accelerate asks (no import: the CLI
    stays fast). MLflow counts only from the ``mlflow`` or ``mlflow-skinny`` distribution,
    as accelerate's ``is_mlflow_available`` (``mlflow-tracing`` alone has no tracking store)."""
    if not any(importlib.util.find_spec(m) is not None for m in _MODULES[name]):
        return False
    if name == "mlflow":
        for dist in ("mlflow", "mlflow-skinny"):
            try:
                importlib.metadata.version(dist)
                return True
            except importlib.metadata.PackageNotFoundError:
                continue
        return False
    return True


def missing(trackers: Iterable[str]) -> list[str]:
    return [t for t in trackers if not installed(t)]


def params(
    config: dict[str, Any], settings: RunSettings, world: int, backend: str | None, device: torch.device
) -> dict:
    """The run's parameters as the trackers record them: the flat config and the plan it ran
    with (scalars only: TensorBoard's hparams and MLflow's params take nothing else)."""
    plan = {
        "processes": world,
        "backend": backend or "none",
        "device": str(device),
        "precision": settings.precision,
        "per_device": settings.per_device,
        "accumulation": settings.accumulation,
        "global_batch": settings.global_batch,
        "lr": settings.lr,
    }
    return {**config, **{f"plan.{k}": v for k, v in plan.items()}}


def start(
    accelerator: Accelerator, trackers: tuple[str, ...], output_dir: Path, values: dict[str, Any]
) -> None:
    """Start the trackers with the run's parameters (main process; a no-op elsewhere).
    A tracker that cannot start (no W&B login, an unreachable MLflow server) ends the run in
    one line before the first step."""
    if not trackers or not accelerator.is_main_process:
        return
    out = Path(output_dir)
    if "mlflow" in trackers:
        _mlflow_store(out)
    if "wandb" in trackers:
        out.mkdir(parents=True, exist_ok=True)  # W&B refuses a dir that does not exist
    init = {
        "mlflow": {"run_name": out.name},
        "wandb": {"dir": str(out), "name": out.name},
        "trackio": {"name": out.name},
    }
    try:
        accelerator.init_trackers(PROJECT, config=values, init_kwargs=init)
    except Exception as e:  # the tracker's own error (login, server): a user's environment
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise XtrainError(
            f"an experiment tracker ({', '.join(trackers)}) could not start: {first}",
            "log in or point it at a reachable server, work offline (WANDB_MODE=offline), "
            "or leave it out of run.report_to",
        ) from e


def _mlflow_store(out: Path) -> None:
    """MLflow's store: ``MLFLOW_TRACKING_URI``, else a file store under ``output_dir/mlruns``
    (set for this process only; MLflow 3 refuses its file store unless
    ``MLFLOW_ALLOW_FILE_STORE`` says yes, so that is said here unless the user said otherwise)."""
    import mlflow

    uri = os.environ.get(MLFLOW_URI_ENV)
    if not uri:
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        uri = (out / "mlruns").resolve().as_uri()
    mlflow.set_tracking_uri(uri)  # every run sets its own: an earlier in-process run's is not kept


def log_text(accelerator: Accelerator, values: dict[str, str], step: int) -> None:
    """Text (sample predictions) to the trackers that show it (main process only)."""
    for tracker in accelerator.trackers if accelerator.is_main_process else []:
        if tracker.name in _TEXT:
            tracker.log(values, step=step)
