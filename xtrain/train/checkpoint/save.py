"""Writing checkpoints: ``step-N.tmp`` renamed when complete, the rotation, the model hooks that
keep only the trainable weights, and removing what a killed run left half-written."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from xtrain import atomic
from xtrain.errors import XtrainError
from xtrain.train.checkpoint.layout import (
    STATE_FILE,
    TrainState,
    checkpoints_dir,
    list_checkpoints,
    partial_checkpoints,
)
from xtrain.train.checkpoint.manifest import write_manifest
from xtrain.train.checkpoint.write_faults import WriteFailed, disk_fault, resume_hint

if TYPE_CHECKING:
    from collections.abc import Callable

    from accelerate import Accelerator
    from torch.nn import Module

    T = TypeVar("T")
    from torch import Tensor


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


def save(
    accelerator: Accelerator,
    output_dir: str | Path,
    state: TrainState,
    keep: int,
    result: Callable[[Path], None] | None = None,
) -> Path:
    """Write ``checkpoints/step-N`` on all ranks together: save_state into ``step-N.tmp``, then
    (main process) ``result(folder)`` (a LoRA run's adapter as a start of its own:
    ``outputs.checkpoint_result``), the xtrain state file, the rename, and the rotation. The
    filesystem failing on any rank (disk full, permission lost) stops every rank with the same one line
    (``faults.WriteFailed``), ``step-N.tmp`` removed and the earlier checkpoints as they were."""
    root = checkpoints_dir(output_dir)
    final = root / f"step-{state.step}"
    tmp = root / f"step-{state.step}.tmp"
    main = accelerator.is_main_process

    def start() -> None:
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)

    def complete() -> None:
        if result is not None:
            result(tmp)
        write_manifest(tmp)
        atomic.write_text(tmp / STATE_FILE, state.to_json())  # last: marks the checkpoint complete
        if final.exists():  # the same step saved before (e.g. a finished run re-exported)
            shutil.rmtree(final)
        atomic.replace(tmp, final)
        rotate(output_dir, keep)

    fault = _agree(accelerator, _attempt(start) if main else None)
    if fault is None:
        fault = _agree(accelerator, _attempt(lambda: accelerator.save_state(str(tmp))))
    if fault is None:
        fault = _agree(accelerator, _attempt(complete) if main else None)
    if fault is not None:
        if main:
            shutil.rmtree(tmp, ignore_errors=True)
        found = list_checkpoints(output_dir)
        intact = f"checkpoint {found[-1][1]} is intact" if found else "no earlier checkpoint was written"
        raise WriteFailed(f"checkpoint step-{state.step}", root, fault, intact, resume_hint(root, fault))
    accelerator.wait_for_everyone()
    return final


def write_on_main(
    accelerator: Accelerator, what: str, output_dir: str | Path, write: Callable[[], T]
) -> T | None:
    """``write()`` on the main process (its result; None elsewhere), every rank waiting for it.
    Any failure stops every rank (no rank waits for the others until the collective timeout):
    the filesystem failing under it is one line (``faults.WriteFailed``, the unfinished
    ``NAME.tmp`` outputs removed, the checkpoints as they were); a user's ``XtrainError`` keeps
    its line; anything else raises as it is on the main process, one line on the others."""
    result: T | None = None
    error: BaseException | None = None
    if accelerator.is_main_process:
        try:
            result = write()
        except Exception as e:
            error = e
            fault = disk_fault(e)
            if fault is not None:
                remove_partial(output_dir)
                found = list_checkpoints(output_dir)
                intact = f"checkpoint {found[-1][1]} is intact" if found else "no checkpoint was written"
                out = Path(output_dir)
                error = WriteFailed(what, out, fault, intact, resume_hint(out, fault))
    if accelerator.num_processes > 1:
        said = None
        if isinstance(error, XtrainError):
            said = (error.message, error.hint, error.exit_code)
        elif error is not None:
            said = (f"the main process failed to write {what}", None, 1)
        said = _agree(accelerator, said)
        if error is None and said is not None:
            error = XtrainError(*said[:2], exit_code=said[2])
    if error is not None:
        raise error
    return result


def _attempt(write: Callable[[], object]) -> str | None:
    """``write()``; what the filesystem did when it failed for that (other errors propagate)."""
    try:
        write()
    except Exception as e:
        reason = disk_fault(e)
        if reason is None:
            raise
        return reason
    return None


def _agree(accelerator: Accelerator, fault: T) -> T:
    """Any rank's fault, on every rank (one all-gather; also the barrier between the phases)."""
    if accelerator.num_processes == 1:
        return fault
    import torch.distributed as dist

    everyone: list[str | None] = [None] * accelerator.num_processes
    dist.all_gather_object(everyone, fault)
    return next((f for f in everyone if f is not None), None)


def rotate(output_dir: str | Path, keep: int) -> list[Path]:
    """Keep the newest ``keep`` complete checkpoints (``keep < 1``: keep all)."""
    if keep < 1:
        return []
    old = [p for _, p in list_checkpoints(output_dir)[:-keep]]
    for p in old:
        shutil.rmtree(p, ignore_errors=True)
    return old


def install_model_hooks(accelerator: Accelerator) -> None:
    """Make checkpoints hold the trainable weights only, under the unwrapped model's names.

    accelerate's own save_state writes the whole model under the wrapper's names ("module." with
    DDP). For LoRA that is the full base model in every checkpoint, and names that do not load
    when the process count changes (1 process has no DDP wrapper). With these hooks a checkpoint
    holds the adapter (or, for full fine-tuning, the whole state dict) and loads into any
    process count.

    Under FSDP and DeepSpeed accelerate saves and loads the model itself, sharded (FSDP: a
    ``torch.distributed.checkpoint`` folder ``pytorch_model_fsdp_0/`` with the optimizer's in
    ``optimizer_0/``, which loads into another process count too; DeepSpeed: its engine's
    checkpoint). It then passes no weights to these hooks and has already loaded the model, so
    the hooks leave both alone: the checkpoint holds the whole model, frozen base included."""
    from accelerate.utils import DistributedType

    def sharded() -> bool:
        return accelerator.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED)

    def model_file(folder: str | Path, i: int) -> Path:
        return Path(folder) / ("model.safetensors" if i == 0 else f"model_{i}.safetensors")

    def on_save(models: list[Module], weights: list[dict[str, Tensor]], output_dir: str) -> None:
        if sharded():  # saved by accelerate already; ``weights`` is empty
            return
        for i, m in enumerate(models):
            inner = accelerator.unwrap_model(m, keep_torch_compile=False)
            named = dict(inner.named_parameters())
            trainable = {n for n, p in named.items() if p.requires_grad}
            state = inner.state_dict()
            weights[i] = (
                state if len(trainable) == len(named) else {n: state[n] for n in trainable if n in state}
            )

    def on_load(models: list[Module], input_dir: str) -> None:
        if sharded():  # loaded by accelerate already (``models`` is empty then)
            return
        from safetensors.torch import load_file

        for i, m in enumerate(models):
            inner = accelerator.unwrap_model(m, keep_torch_compile=False)
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
