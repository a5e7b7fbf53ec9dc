"""The old import path of the training config, kept because user code imports it from here: a
custom task (``model.custom``) receives a ``TrainConfig``, and scripts call ``load_config``.

xtrain's own code imports from where each name lives: ``xtrain.config.schema`` (the dataclasses),
``xtrain.config.values`` (one value's choices and ranges), ``xtrain.config.loading`` (YAML,
overrides, the dict round-trip), ``xtrain.tasks.validation`` (``load_config``,
``config_from_dict``: read and checked against the task), ``xtrain.planning.batch``
(accumulation from the global batch, the LR scaling rule).
"""

from xtrain.config.loading import QUICKSTART_CONFIG, config_to_dict, flat_config, parse_override
from xtrain.config.schema import (
    BatchConfig,
    DataConfig,
    GenerationConfig,
    LoraConfig,
    ModelConfig,
    OptimConfig,
    RunConfig,
    TrainConfig,
    config_keys,
)
from xtrain.config.values import ALIASES, CHECKS, CHOICES
from xtrain.planning.batch import gradient_accumulation, scaled_lr
from xtrain.tasks.validation import config_from_dict, load_config

__all__ = [
    "ALIASES",
    "CHECKS",
    "CHOICES",
    "QUICKSTART_CONFIG",
    "BatchConfig",
    "DataConfig",
    "GenerationConfig",
    "LoraConfig",
    "ModelConfig",
    "OptimConfig",
    "RunConfig",
    "TrainConfig",
    "config_from_dict",
    "config_keys",
    "config_to_dict",
    "flat_config",
    "gradient_accumulation",
    "load_config",
    "parse_override",
    "scaled_lr",
]
