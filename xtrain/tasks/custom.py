"""``custom``: ``model.custom: module:function``, called with the config, returns a Workload.

The user's builder is the ``build`` of a Task like every built-in one; it may read any key."""

from __future__ import annotations

import contextlib
import importlib
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from xtrain.errors import XtrainError
from xtrain.tasks.contract import EVERY_KEY, MainProcessFirst, Task

if TYPE_CHECKING:
    from xtrain.config.schema import TrainConfig
    from xtrain.tasks.contract import Workload


def load_custom(spec: str) -> Callable[..., Any]:
    """The function named by ``module:function`` (the module must be importable)."""
    module_name, _, function_name = spec.partition(":")
    if not module_name or not function_name:
        raise XtrainError(f"model.custom must look like module:function, got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise XtrainError(
            f"cannot import the custom task module '{module_name}': {e}",
            "run from the folder that holds it, or add that folder to PYTHONPATH",
        ) from None
    function = getattr(module, function_name, None)
    if not callable(function):
        raise XtrainError(f"module '{module_name}' has no function '{function_name}' (model.custom={spec})")
    return function


def build(cfg: TrainConfig, main_process_first: MainProcessFirst = contextlib.nullcontext) -> Workload:
    """Calls ``function(cfg)`` (and passes ``main_process_first=`` when the function takes it)."""
    if not cfg.model.custom:
        raise XtrainError(
            "model.task is custom but model.custom is not set", "set model.custom=module:function"
        )
    function = load_custom(cfg.model.custom)
    try:
        takes_mpf = "main_process_first" in inspect.signature(function).parameters
    except (TypeError, ValueError):
        takes_mpf = False
    from transformers import set_seed

    set_seed(cfg.run.seed)  # the custom builder starts from the same RNG state in every process
    workload = function(cfg, main_process_first=main_process_first) if takes_mpf else function(cfg)
    from xtrain.tasks.contract import Workload

    if not isinstance(workload, Workload):
        raise XtrainError(
            f"{cfg.model.custom} returned {type(workload).__name__}, not an xtrain Workload",
            "return xtrain.tasks.contract.Workload(model=..., train_dataset=..., collator=...)",
        )
    return workload


def validate(cfg: TrainConfig) -> None:
    m = cfg.model
    if not m.custom:
        raise XtrainError(
            "model.task is custom but model.custom is not set", "set model.custom=module:function"
        )
    mod, _, fn = m.custom.partition(":")
    if not mod or not fn:
        raise XtrainError(
            f"model.custom must look like module:function, got {m.custom!r}",
            "e.g. model.custom=my_tasks:build",
        )


TASK = Task(
    name="custom",
    about="model.custom: module:function, called with the config, returns a Workload",
    build=build,
    keys=frozenset({EVERY_KEY, "model.custom"}),
    validate=validate,
    resume_keys=("model.custom", "lora.apply_to"),
)
