"""Evaluation over the whole eval set, gathered from every rank in data order.

A task evaluates either forward-only (``Workload.eval_batch`` per-example statistics, reduced by
``Workload.reduce_metrics``; the batch's mean loss without one) or by generating
(``Workload.evaluate``, see ``xtrain.train.generation``).
"""

from __future__ import annotations

from typing import Any

import torch

from xtrain.train.workload import Workload


def default_eval_batch(outputs: Any, batch: Any) -> dict[str, torch.Tensor]:
    """Without a task-specific eval: the batch's mean loss, weighted by its examples."""
    n = next(v for v in batch.values() if torch.is_tensor(v)).shape[0]
    loss = outputs.loss.detach().float()
    return {"loss_sum": loss.expand(n), "count": torch.ones(n, device=loss.device)}


def evaluate(
    accelerator: Any, model: Any, loader: Any, workload: Workload, samples: list[Any] | None = None
) -> dict[str, float]:
    """Eval loss (and the task's metrics) over the whole eval set, gathered from all ranks.
    A task that evaluates by generation (``workload.evaluate``) runs that instead; its sample
    predictions are appended to ``samples``."""
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
            stats = eval_batch(model(**batch), batch)
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
