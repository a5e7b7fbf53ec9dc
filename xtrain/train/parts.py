"""The recipe's builders (``train/loop.py``'s ``Recipe.setup``), one part each: plain functions
of what they need, handed in by the recipe, so that ``setup`` reads as the list of parts and the
order they need each other in."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch.utils.data import DataLoader

from xtrain.config.loading import flat_config
from xtrain.data.sampler import DataOrder, RankBatchSampler, train_lengths
from xtrain.model import quantization
from xtrain.model.sharding import prepare_generation
from xtrain.train import checkpoint, preflight, tracking
from xtrain.train.distributed import sharded
from xtrain.train.distributed.collective import on_main
from xtrain.train.precision import upcast_trainable

if TYPE_CHECKING:
    import torch
    from accelerate import Accelerator
    from accelerate.optimizer import AcceleratedOptimizer
    from accelerate.scheduler import AcceleratedScheduler
    from torch.nn import Module
    from torch.optim import Optimizer
    from torch.optim.lr_scheduler import LRScheduler

    from xtrain.config.schema import RunConfig, TrainConfig
    from xtrain.planning.resolve import RunSettings
    from xtrain.tasks.contract import Workload


def data_order(workload: Workload, settings: RunSettings, cfg: TrainConfig, world: int) -> DataOrder:
    """The samples of every step, the same for any process count (``data.sampler``), in items of
    ``Workload.samples_per_item`` samples (GRPO: a prompt's completions);
    ``data.group_by_length``: one length per sample (a task without lengths: one line)."""
    lengths = train_lengths(workload) if cfg.data.group_by_length else None
    size, k = len(workload.train_dataset), workload.samples_per_item  # k samples an item (GRPO)
    batch, per_device = settings.global_batch // k, settings.per_device // k
    return DataOrder(size, batch, per_device, world, cfg.run.seed, lengths=lengths)


def trainable_model(workload: Workload, precision: str) -> Module:
    """The task's model as training needs it: 4-bit weights kept in their training layout
    through evaluations, trainable weights in fp32 under autocast."""
    model = workload.model
    quantization.keep_training_layout(model)
    upcast_trainable(model, precision)  # fp32 master weights under autocast
    return model


def disk_notes(out: Path, run: RunConfig, total_steps: int, trainable: int, total_params: int) -> list[str]:
    """Free disk for the outputs (``preflight.check_disk``): a run whose outputs cannot fit
    stops here, before the first step; the notes of one that fits tightly."""
    saves = total_steps // run.save_every + 1 if run.save_every else 1
    return preflight.check_disk(out, trainable, total_params, run.keep_checkpoints, run.save_merged, saves)


def prepare(
    acc: Accelerator,
    model: Module,
    optimizer: Optimizer,
    scheduler: LRScheduler,
    per_device: int,
    max_grad_norm: float | None,
) -> tuple[Module, AcceleratedOptimizer, AcceleratedScheduler]:
    """accelerate wraps the three (DDP, FSDP, DeepSpeed); generation and the checkpoint's
    model hooks follow the wrapped model."""
    sharded.fill_deepspeed(acc, per_device, max_grad_norm)
    prepared = acc.prepare(model, optimizer, scheduler)
    prepare_generation(acc, prepared[0])  # FSDP2: generate all-gathers like forward
    checkpoint.install_model_hooks(acc)
    return prepared


def loading(workload: Workload, workers: int, pin: bool) -> dict[str, Any]:
    """The DataLoader settings of both loaders: ``workers`` (the task's media decoding picked
    the count), ``pin`` (CUDA)."""
    out: dict[str, Any] = {"collate_fn": workload.collator, "num_workers": workers, "pin_memory": pin}
    if workers:  # started once per run: a spawned worker (Windows, macOS) costs an import
        out["persistent_workers"] = True
    return out


def eval_loader(
    acc: Accelerator, workload: Workload, per_device: int, loading: dict[str, Any]
) -> DataLoader | None:
    """The eval set's loader, prepared (split_batches: per_device on each rank); None without one."""
    evals = workload.eval_dataset
    if evals is None or len(evals) == 0:
        return None
    loader = DataLoader(evals, batch_size=per_device * acc.num_processes, **loading)
    return acc.prepare(loader)


def train_loader(
    workload: Workload, order: DataOrder, rank: int, start: int, total: int, loading: dict[str, Any]
) -> DataLoader[Any]:
    """This rank's share of every step from ``start`` on (``RankBatchSampler``)."""
    sampler = RankBatchSampler(order, rank, start, total)
    return DataLoader(workload.train_dataset, batch_sampler=sampler, **loading)


def start_trackers(
    acc: Accelerator, cfg: TrainConfig, settings: RunSettings, device: torch.device, out: Path
) -> None:
    """The experiment trackers (``run.report_to``), started by the main process with the run's
    settings as their parameters."""
    world = acc.num_processes
    backend = acc.state.backend if world > 1 else None
    values = tracking.params(flat_config(cfg), settings, world, backend, device)
    on_main(acc, lambda: tracking.start(acc, settings.trackers, out, values), "start trackers")
