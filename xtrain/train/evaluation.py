"""Evaluation over the whole eval set, gathered from every rank in data order.

A task evaluates either forward-only (``Workload.eval_batch`` per-example statistics, reduced by
``Workload.reduce_metrics``; the batch's mean loss without one) or by generating
(``Workload.evaluate``, see ``xtrain.tasks.generation``).

Evaluation never changes training: the random generators are as they were before it (iterating
the eval loader draws a DataLoader seed from the default generator, which the train loader's
workers would otherwise be seeded from), and 4-bit weights keep their training layout
(``quantization.keep_training_layout``, set up by the loop). tests/test_gradients.py checks both.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch

from xtrain.tasks.contract import Workload
from xtrain.train import checkpoint
from xtrain.train.distributed import sharded

if TYPE_CHECKING:
    from pathlib import Path

    from accelerate import Accelerator
    from torch.nn import Module
    from torch.utils.data import DataLoader
    from transformers.utils import ModelOutput

    from xtrain.config.schema import TrainConfig
    from xtrain.tasks.contract import Batch, Prediction


def default_eval_batch(outputs: ModelOutput, batch: Batch) -> dict[str, torch.Tensor]:
    """Without a task-specific eval: the batch's mean loss, weighted by its examples."""
    n = next(v for v in batch.values() if torch.is_tensor(v)).shape[0]
    loss = outputs.loss.detach().float()
    return {"loss_sum": loss.expand(n), "count": torch.ones(n, device=loss.device)}


@contextmanager
def rng_kept(device: torch.device) -> Iterator[None]:
    """The CPU generator (and this GPU's) as they were on entry, whatever ran inside."""
    cuda = device.type == "cuda"
    index = device.index if device.index is not None else (torch.cuda.current_device() if cuda else 0)
    with torch.random.fork_rng(devices=[index] if cuda else [], device_type="cuda"):
        yield


def evaluate(
    accelerator: Accelerator,
    model: Module,
    loader: DataLoader,
    workload: Workload,
    samples: list[Prediction] | None = None,
) -> dict[str, float]:
    """Eval loss (and the task's metrics) over the whole eval set, gathered from all ranks.
    A task that evaluates by generation (``workload.evaluate``) runs that instead; its sample
    predictions are appended to ``samples``. The random generators are left as they were."""
    with rng_kept(accelerator.device):
        return _evaluate(accelerator, model, loader, workload, samples)


def _evaluate(
    accelerator: Accelerator,
    model: Module,
    loader: DataLoader,
    workload: Workload,
    samples: list[Prediction] | None,
) -> dict[str, float]:
    if workload.evaluate is not None:
        metrics, predictions = workload.evaluate(accelerator, model, loader)
        if samples is not None:
            samples.extend(predictions)
        return metrics
    eval_batch = workload.eval_batch or default_eval_batch
    parts: dict[str, list[torch.Tensor]] = {}
    model.eval()
    with torch.no_grad():
        for batch in loader:
            stats = eval_batch(workload.forward(model, batch) if workload.forward else model(**batch), batch)
            stats = accelerator.gather_for_metrics({k: v.detach() for k, v in stats.items()})
            for k, v in stats.items():
                parts.setdefault(k, []).append(v)
    model.train()
    if not parts:
        return {}
    gathered = {k: torch.cat([t.reshape(-1) for t in v]).float().cpu() for k, v in parts.items()}
    metrics = {"eval_loss": float(gathered["loss_sum"].sum() / gathered["count"].sum().clamp(min=1))}
    if workload.reduce_metrics is not None:
        metrics.update({k: float(v) for k, v in workload.reduce_metrics(gathered).items()})
    return metrics


def keep_best(
    acc: Accelerator,
    model: Module,
    workload: Workload,
    out: Path,
    step: int,
    metrics: dict[str, float],
    history: list[dict[str, float]],
    cfg: TrainConfig,
    record: dict[str, str],
) -> str | None:
    """The best model so far (``run.best_metric``) kept in ``out/best`` when this evaluation (the
    last of ``history``) beats the ones before it: gathered from a sharded model, written by the
    main process. Returns the line to say, else None."""
    best = cfg.run.best_metric
    if not (best and best in metrics and checkpoint.is_new_best(best, metrics[best], history[:-1])):
        return None
    sharded.save_on_main(
        acc,
        model,
        lambda model, state: checkpoint.save_best(
            model, workload.tokenizer, out, step, best, metrics[best], record, state
        ),
        ("the best model", out),
        trainable_only=cfg.lora.enabled,
    )
    return f"best {best} so far ({metrics[best]:.4f} at step {step}) -> {out / checkpoint.BEST}"
