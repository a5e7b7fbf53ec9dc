"""How each stack of layers a training step runs trains (the memory estimate's activation term):
the task's stacks (``Task.stacks``) read from a model that is not wrapped by peft (built on the
meta device for the plan, or the loop's model unwrapped), with the adapters on each site of a
layer (``activations.site_of``) and whether their own weights train. ``model_size`` calls it for
both the plan's sizes and the loop's."""

from __future__ import annotations

from collections import Counter
from typing import Any

from xtrain.train import activations, tasks
from xtrain.train.config.schema import TrainConfig


def train_only(model: Any, whole: list[str]) -> None:
    """Freeze ``model`` (on the meta device) but the modules kept whole (by name or its last parts,
    as peft matches them): what trains besides the adapters."""
    keep = {id(p) for q, m in model.named_modules() if any(q == k or q.endswith("." + k) for k in whole)
            for p in m.parameters()}  # fmt: skip
    for p in model.parameters():
        p.requires_grad_(id(p) in keep)


def _under(name: str, prefix: str) -> bool:
    return not prefix or name == prefix or name.startswith(prefix + ".")


def step_stacks(model: Any, cfg: TrainConfig, adapted: list[str]) -> tuple[activations.Stack, ...]:
    """The task's stacks of ``model`` (``Task.stacks``, not wrapped by peft) with how each trains:
    ``lora`` with its adapters a layer on each site (``adapted``: the Linear layers that carry
    adapters), ``full`` when its own Linear weights train (a module nested in it that is a stack
    of its own, a VLM's merger inside its vision tower, is that stack's), else ``frozen``. Empty
    when the task's hook cannot read the model (the per-token rule estimates it)."""
    import torch

    from xtrain.train.tasks import stacks as task_stacks

    task = tasks.get(cfg.model.task)
    try:
        found = task.stacks(model, cfg) if task.stacks is not None else task_stacks.text_stacks(model, cfg)
    except Exception:  # noqa: BLE001 - advisory: an estimate must never stop a launch
        return ()
    found = [s for s in found if s.layers > 0 and s.hidden > 0 and s.positions > 0]
    linears = [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    linears = [(n, m) for n, m in linears if "lora_" not in n and "original_module" not in n]
    out = []
    for stack in found:
        inner = [o.module for o in found if o.module != stack.module and _under(o.module, stack.module)]

        def mine(name: str, stack: activations.Stack = stack, inner: list[str] = inner) -> bool:
            return _under(name, stack.module) and not any(_under(name, o) for o in inner)

        sites = Counter(activations.site_of(q) for q in adapted if mine(q))
        sites.pop(None, None)
        per_layer = {site: max(1, round(n / stack.layers)) for site, n in sites.items()}
        trained = any(m.weight.requires_grad for n, m in linears if mine(n))
        trains = "lora" if per_layer else "full" if trained else "frozen"
        out.append(activations.with_training(stack, trains, per_layer))
    return tuple(out)


def lora_fields(cfg: TrainConfig, model: Any, stacks: tuple[activations.Stack, ...]) -> dict[str, Any]:
    """The ``ModelSizes`` fields of the activation term: the stacks, whether the output head
    trains, LoRA's rank and dropout."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    weight = getattr(head, "weight", None)
    return {
        "stacks": stacks,
        "head_trains": bool(stacks) and weight is not None and bool(weight.requires_grad),
        "lora_rank": cfg.lora.r if cfg.lora.enabled else 0,
        "lora_dropout": cfg.lora.enabled and cfg.lora.dropout > 0,
    }
