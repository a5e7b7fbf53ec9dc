"""``custom``: ``model.custom: module:function``, returns a Workload.

The user's builder is the ``build`` of a Task like every built-in one; it may read any key. It
receives what every task's ``build`` receives, this process's ``Run`` (``run.cfg``,
``run.device``, ``run.precision``, ...) and ``main_process_first``, when its first parameter is
named ``run``: ``def build(run, main_process_first)``. A builder written for the config keeps
working: ``def build(cfg)`` or ``def build(cfg, main_process_first)`` gets ``run.cfg`` (and
``main_process_first=`` when it names it)."""

from __future__ import annotations

import contextlib
import importlib
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from xtrain.errors import XtrainError
from xtrain.tasks.contract import EVERY_KEY, MainProcessFirst, Task, Workload

if TYPE_CHECKING:
    from xtrain.config.schema import TrainConfig
    from xtrain.planning.run import Run


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


def _parameters(function: Callable[..., Any]) -> list[str]:
    try:
        return list(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return []


def build(run: Run, main_process_first: MainProcessFirst = contextlib.nullcontext) -> Workload:
    """Calls the user's ``function(run, main_process_first)`` (its first parameter named ``run``),
    else ``function(cfg)`` (and passes ``main_process_first=`` when the function takes it)."""
    cfg = run.cfg
    if not cfg.model.custom:
        raise XtrainError(
            "model.task is custom but model.custom is not set", "set model.custom=module:function"
        )
    function = load_custom(cfg.model.custom)
    parameters = _parameters(function)
    from transformers import set_seed

    set_seed(cfg.run.seed)  # the custom builder starts from the same RNG state in every process
    if parameters[:1] == ["run"]:
        workload = function(run, main_process_first)
    elif "main_process_first" in parameters:
        workload = function(cfg, main_process_first=main_process_first)
    else:
        workload = function(cfg)
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
    about="model.custom: module:function, called with the Run (or the config), returns a Workload",
    build=build,
    keys=frozenset({EVERY_KEY, "model.custom"}),
    validate=validate,
    resume_keys=("model.custom", "lora.apply_to"),
)
