"""The training config: one YAML file plus `key=value` overrides, strictly validated.

- ``schema.py``: the dataclasses (one a YAML section) and the valid ``section.key`` names.
- ``values.py``: one value's type, choices, spellings and range; unknown keys refused.
- ``validate.py``: checks that involve more than one field.
- ``loading.py``: ``load_config`` (YAML, overrides, checks), the dict round-trip for checkpoints.
- ``xtrain.planning.batch``: accumulation from the global batch, the LR scaling rule (planning
  decides them; re-exported here).

xtrain's own code imports from those modules. The names below stay importable from
``xtrain.train.config`` because user code does: a custom task (``model.custom``) receives a
``TrainConfig`` and scripts call ``load_config``.
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
