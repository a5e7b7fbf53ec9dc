"""How a training run fails or stops, as one line each: divergence, out of memory, a stop signal
(with what the output folder then holds: ``stopped_error``), a process group that never formed."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from xtrain.errors import XtrainError
from xtrain.runtime.signals import exit_code, signal_name
from xtrain.train.checkpoint import list_checkpoints
from xtrain.train.checkpoint.layout import partial_checkpoints

if TYPE_CHECKING:
    import torch

# Consecutive optimizer steps with a non-finite loss (on any rank) that stop a run. A few in a
# row happen with fp16 while the scaler finds its scale (those steps are skipped, not applied);
# more is a diverged run. Checked at the logging interval's host sync, never per step.
NONFINITE_LIMIT = 3


class NonFiniteLoss(XtrainError):
    """The loss stayed NaN/inf: the run stops without writing the non-finite weights."""

    def __init__(self, first_bad: int, step: int, last_good: Path | None, reason: str) -> None:
        where = f"last good checkpoint: {last_good}" if last_good else "no checkpoint was saved"
        super().__init__(
            f"training diverged: the loss is not finite since step {first_bad} ({reason}); "
            f"stopped at step {step}, nothing written; {where}",
            "lower optim.lr, keep optim.max_grad_norm set, or use bf16 instead of fp16; "
            "run.resume=auto continues from the last good checkpoint",
            exit_code=3,
        )
        self.first_bad = first_bad
        self.step = step
        self.last_good = last_good


def last_good(output_dir: Path) -> Path | None:
    """The newest complete checkpoint: what a diverged run names (and resumes from)."""
    found = list_checkpoints(output_dir)
    return found[-1][1] if found else None


def check_streak(streak: int, step: int, output_dir: Path) -> None:
    """At a window's sync: ``NONFINITE_LIMIT`` non-finite losses in a row (on any rank) stop the run."""
    if streak >= NONFINITE_LIMIT:
        raise NonFiniteLoss(step - streak + 1, step, last_good(output_dir), f"{streak} steps in a row")


def check_finite(params: list[torch.Tensor], step: int, streak: torch.Tensor, output_dir: Path) -> None:
    """No NaN/inf weights ever reach a checkpoint or the adapter (one host sync per save; all ranks
    hold the same weights, so all agree). ``streak``: the window's device counter, read only here."""
    import torch

    if not bool(torch.stack([torch.isfinite(p.detach()).all() for p in params]).all()):
        bad = int(streak)
        first = step - bad + 1 if bad else step
        raise NonFiniteLoss(first, step, last_good(output_dir), "the weights are NaN/inf")


def out_of_memory_error(
    device: torch.device, per_device: int, world: int, accumulation: int, global_batch: int
) -> XtrainError:
    """Out of device memory: name the batch arithmetic and a smaller per-device batch that keeps
    the global batch (the accumulation grows instead)."""
    procs = f"{world} process{'es' if world != 1 else ''}"
    message = (
        f"out of memory on {device} with batch.per_device={per_device} "
        f"(global batch {global_batch} = {per_device} per device x {procs} x accumulation {accumulation})"
    )
    smaller = [d for d in range(per_device - 1, 0, -1) if per_device % d == 0]
    if not smaller:
        return XtrainError(
            message,
            "the per-device batch is already 1: lower data.max_length, set "
            "model.gradient_checkpointing=true, or use run.mixed_precision=bf16/fp16",
        )
    new = smaller[0] if per_device % 2 else per_device // 2
    new_acc = global_batch // (new * world)
    return XtrainError(
        message,
        f"batch.per_device={new} batch.global_batch={global_batch} keeps the global batch "
        f"{global_batch}; accumulation becomes {new_acc}",
    )


class TrainingStopped(XtrainError):
    """SIGINT/SIGTERM: the run stopped at a step boundary after saving a checkpoint."""

    def __init__(self, step: int, path: Path, signum: int) -> None:
        super().__init__(
            f"stopped at step {step}; checkpoint saved to {path}",
            "run the same command again to resume",
            exit_code=exit_code(signum),
        )
        self.step = step
        self.path = path


# torch's messages when a process group's peers never come (c10d TCPStore):
# DistStoreError "Timed out after 9 seconds waiting for clients. 1/2 clients joined." (rank 0,
# the store's server) and DistNetworkError "The client socket has timed out after 8000ms while
# trying to connect to (127.0.0.1, 29556)." (any other rank, no server to reach).
_STORE_ERRORS = ("DistStoreError", "DistNetworkError")


class NoPeers(XtrainError):
    """The process group never formed: every rank says so (none of them knows a rank 0 that
    would speak for it)."""


def rendezvous_error(e: BaseException, rank: int, world: int, address: str) -> XtrainError | None:
    """One line for a process group that never formed (a rank whose peers never came: the
    environment names a world the launch did not start); None for any other failure.
    ``address``: MASTER_ADDR:MASTER_PORT as this process read them."""
    if type(e).__name__ not in _STORE_ERRORS:
        return None
    reason = str(e).strip().splitlines()[0].rstrip(".")[:200] if str(e).strip() else type(e).__name__
    who = f"rank {rank} of {world}"
    if type(e).__name__ == "DistStoreError":
        what = f"{who} waited for the other processes at {address}, and they never joined ({reason})"
    else:
        what = f"{who} could not reach rank 0 at {address} ({reason})"
    return NoPeers(
        what,
        f"start all {world} processes together (torchrun, accelerate launch or xtrain train do), with the "
        "same MASTER_ADDR and MASTER_PORT; for one process, unset RANK, WORLD_SIZE and LOCAL_RANK",
        exit_code=2,
    )


def remove_killed_writes(output_dir: str | Path | None) -> None:
    """After a second Ctrl+C killed every worker (launcher side, the workers are gone): a stop
    checkpoint cut off mid-write (``step-N.tmp``) is removed, so the folder holds complete
    checkpoints only. (A resume would remove it too; the folder should not wait for one.)"""
    if not output_dir:
        return
    import shutil

    for path in partial_checkpoints(output_dir):
        shutil.rmtree(path, ignore_errors=True)


def stopped_error(output_dir: str | Path | None, signum: int, at_once: bool = False) -> XtrainError:
    """The one line for a stop that wrote no stop checkpoint: names the newest complete
    checkpoint (what a resume continues from), or says that there is none."""
    from xtrain.train.checkpoint.layout import list_checkpoints

    found = list_checkpoints(output_dir) if output_dir else []
    how = "second Ctrl+C: stopped at once" if at_once else f"stopped on {signal_name(signum)}"
    if found:
        step, path = found[-1]
        where = f"no stop checkpoint was written; the newest complete checkpoint is {path} (step {step})"
        hint = "run the same command again to resume from it"
    else:
        where = "no checkpoint was written"
        hint = "run the same command again to start over"
    return XtrainError(f"{how}; {where}", hint, exit_code=exit_code(signum))
