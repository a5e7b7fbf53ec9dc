"""The facts ``model.attn_implementation`` is decided from (``planning.resolve.choose_attention``
decides): flash-attn installed, the device and its compute capability, the precision, and what
the class transformers builds for the model supports.

- ``for_plan``: before launching (``xtrain train``, also ``--dry-run``): the plan's device,
  precision and GPUs; the model's support read from its config only where it already is, and only
  for a CUDA plan or an explicit choice (transformers takes seconds to import).
- ``for_load``: in each worker, right before ``from_pretrained``: the device and precision of this
  process's ``Run`` (``xtrain.planning.run``), passed in by the task's build.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
from typing import TYPE_CHECKING

from xtrain.config.schema import TrainConfig
from xtrain.model import load as models
from xtrain.model.configs import read_config_offline
from xtrain.planning.resolve import Attention, AttentionFacts, choose_attention
from xtrain.planning.run import Run

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from xtrain.model.load import ModelClass

    # (class name, sdpa, flash attention) of the class a model loads as; None: not known
    Support = tuple[str, bool | None, bool | None]

FLASH_PACKAGE = "flash-attn"


def flash_attn_version() -> str | None:
    """flash-attn's installed version from package metadata (nothing is imported)."""
    for name in (FLASH_PACKAGE, "flash_attn"):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def built_class(model_class: ModelClass, config: PretrainedConfig, trust_remote_code: bool) -> type | None:
    """The class ``model_class`` (an Auto class or a model class) builds for ``config``; None where
    that is not known (custom code, a config no class maps)."""
    if trust_remote_code and getattr(config, "auto_map", None):
        return None  # the repository's own class decides
    mapping = getattr(model_class, "_model_mapping", None)
    if mapping is None:
        return model_class
    try:
        return mapping[type(config)]
    except (KeyError, ValueError):
        return None


def model_support(
    model_class: ModelClass, config: PretrainedConfig, trust_remote_code: bool
) -> tuple[str, bool | None, bool | None]:
    """(class name, sdpa, flash attention) of the class ``model_class`` (an Auto class or a model
    class) builds for ``config``; None where that is not known (custom code, a config no class maps)."""
    cls = built_class(model_class, config, trust_remote_code)
    if cls is None:
        return model_class.__name__, None, None
    flash = getattr(cls, "_supports_flash_attn", False) or getattr(cls, "_supports_flash_attn_2", False)
    return cls.__name__, bool(getattr(cls, "_supports_sdpa", False)), bool(flash)


def _facts(
    cfg: TrainConfig, device: str, precision: str, capability: tuple[int, int] | None, support: Support
) -> AttentionFacts:
    name, sdpa, flash = support
    return AttentionFacts(
        flash_attn=flash_attn_version(),
        device=device,
        precision=precision,
        weights_dtype=cfg.model.dtype,
        model=name,
        sdpa=sdpa,
        flash=flash,
        capability=capability,
    )


def for_load(
    cfg: TrainConfig, model_class: ModelClass, source: str, device: str, precision: str
) -> Attention:
    """The decision for this process, right before ``model_class.from_pretrained(source)``, on
    ``device`` (``Run.device``: cpu, mps, cuda, cuda:N) in ``precision`` (``Run.precision``)."""
    import torch

    where = torch.device(device)
    capability = torch.cuda.get_device_capability(where) if where.type == "cuda" else None
    config = models.load_config(source, cfg.model.trust_remote_code)
    support = model_support(model_class, config, cfg.model.trust_remote_code)
    return choose_attention(
        cfg.model.attn_implementation, _facts(cfg, where.type, precision, capability, support)
    )


def for_plan(run: Run, model_class: str | None) -> Attention:
    """The decision for the ``run``'s plan (the smallest compute capability of its GPUs);
    ``model_class``: the task's transformers class (``Task.model_class``), None for its own."""
    cfg, plan, facts = run.cfg, run.plan, run.facts
    support: Support = ("the model", None, None)
    asked = cfg.model.attn_implementation
    if plan.device == "cuda" or asked == "sdpa":
        support = _offline_support(cfg, model_class, support)
    gpus = [
        g
        for g in (facts.gpus if facts is not None else [])
        if plan.gpu_ids is None or g.index in plan.gpu_ids
    ]
    capabilities = [tuple(g.capability) for g in gpus if g.capability]
    capability = min(capabilities) if capabilities and plan.device == "cuda" else None
    found = _facts(cfg, plan.device, run.precision, capability, support)
    if facts is not None and FLASH_PACKAGE in facts.packages:  # a snapshot that recorded it
        found = dataclasses.replace(found, flash_attn=facts.packages[FLASH_PACKAGE])
    return choose_attention(asked, found)


def _offline_support(cfg: TrainConfig, model_class: str | None, unknown: Support) -> Support:
    """The model's support from its config where it already is (never a download)."""
    import transformers

    if model_class is None:
        return unknown
    config = read_config_offline(cfg)
    if isinstance(config, str):
        return unknown
    return model_support(getattr(transformers, model_class), config, cfg.model.trust_remote_code)
