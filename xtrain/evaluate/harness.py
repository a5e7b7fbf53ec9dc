"""lm-evaluation-harness itself: found (``require``: one line naming the extra when it is missing),
its log lines and bars quieted (``quiet``), and ``run``: one model scored on the benchmarks by
``lm_eval.simple_evaluate``, lm-eval's own entry, so the numbers are the ones its CLI prints for
the same model, adapter, tasks, dtype and chat template setting.

Two of ``simple_evaluate``'s extras are made once per process instead of once per model: the
environment report it adds to every result (torch's ``collect_env``: subprocesses, seconds) and the
git hash of the working folder (``git describe``, whose "not a git repository" would be printed
on the user's terminal). Both are metadata of the results file, not scores.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from xtrain.errors import XtrainError

if TYPE_CHECKING:
    from lm_eval.tasks import TaskManager

PACKAGE = "lm_eval"
VERSION = ">=0.4.13,<0.5"
INSTALL = 'pip install -e ".[eval]" in xtrain\'s folder (or pip install "lm-eval[hf,api]>=0.4.13,<0.5")'
VERBOSE_ENV = "XTRAIN_VERBOSE"


def require(what: str = "xtrain eval") -> None:
    """lm-eval importable, else one line naming the extra."""
    try:
        import lm_eval  # noqa: F401
    except ImportError:
        raise XtrainError(
            f"{what} scores models with lm-evaluation-harness, which is not installed",
            f"install the eval extra: {INSTALL}",
        ) from None


def quiet() -> None:
    """lm-eval's info and warning lines off (its per-task notes on default aggregations, its git
    and environment probing) and its progress bars off where stderr is no terminal (a log gets
    no bar redrawn as lines), unless ``XTRAIN_VERBOSE`` is set; its errors still show."""
    if os.environ.get(VERBOSE_ENV, "").strip() not in ("", "0"):
        return
    logging.getLogger(PACKAGE).setLevel(logging.ERROR)
    _once_per_process()
    if not sys.stderr.isatty():
        _no_bars()


def _no_bars() -> None:
    """tqdm's bars off in this process, also those a library asks for with ``disable=False``
    (lm-eval shows its request bars on rank 0 that way)."""
    from tqdm import std

    init = std.tqdm.__init__
    if getattr(init, "_xtrain_quiet", False):
        return

    def quiet_init(self: Any, *args: Any, **kwargs: Any) -> None:
        kwargs["disable"] = True
        init(self, *args, **kwargs)

    quiet_init._xtrain_quiet = True  # type: ignore[attr-defined]
    std.tqdm.__init__ = quiet_init  # type: ignore[method-assign]


def _once_per_process() -> None:
    """``simple_evaluate``'s environment report and git hash, made once in this process (see the
    module's docstring)."""
    from lm_eval import evaluator
    from lm_eval.loggers import utils

    if getattr(evaluator.add_env_info, "_xtrain_once", False):
        return
    made: dict[str, Any] = {}

    def add_env_info(storage: dict[str, Any]) -> None:
        if not made:
            utils.add_env_info(made)
        storage.update(made)

    add_env_info._xtrain_once = True  # type: ignore[attr-defined]
    evaluator.add_env_info = add_env_info
    evaluator.get_git_commit_hash = functools.cache(_git_hash)


def _git_hash() -> str | None:
    """lm-eval's ``get_git_commit_hash`` with git's complaint about a folder that is no repository
    kept off the terminal."""
    from lm_eval.loggers.utils import get_commit_from_path

    try:
        done = subprocess.run(["git", "describe", "--always"], capture_output=True, text=True, check=False)  # noqa: S607
    except OSError:
        done = None
    if done is not None and done.returncode == 0:
        return done.stdout.strip()
    return get_commit_from_path(os.getcwd())


def stage_gathers_on_cpu() -> None:
    """lm-eval's HF model gathers through CPU copies in this process: its ``all_gather`` (the
    per-rank request counts it pads to, its batch sizes) is an all-gather of device tensors, and
    gloo's collectives of CUDA tensors fail on Windows (FIELD_NOTES: no kCUDA creator); the
    counts are a few integers, so the copy costs nothing and the numbers are the same."""
    from lm_eval.models.huggingface import HFLM

    if getattr(HFLM.all_gather, "_xtrain_staged", False):
        return

    def all_gather(self: Any, tensor: Any) -> Any:
        if self.world_size <= 1:
            return tensor
        return self.accelerator.gather(tensor.cpu()).to(tensor.device)

    all_gather._xtrain_staged = True  # type: ignore[attr-defined]
    HFLM.all_gather = all_gather  # type: ignore[method-assign]


@dataclass(frozen=True)
class Options:
    """How every model is scored: rows per task (``limit``: a count, or a fraction below 1),
    few-shot examples (None: each task's own), the batch (``batch_size``: a number or lm-eval's
    ``auto``), the weights' dtype (``auto``: the checkpoint's, as lm-eval's default), whether
    lm-eval logs each row's answer (``samples``: ``xtrain eval --samples``)."""

    limit: float | None = None
    num_fewshot: int | None = None
    batch_size: int | str = 8
    dtype: str = "auto"
    samples: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Options:
        return cls(**data)

    @property
    def lm_limit(self) -> int | float | None:
        """``limit`` as lm-eval takes it: a whole count as an int, a fraction as a float."""
        if self.limit is None:
            return None
        return int(self.limit) if self.limit >= 1 else float(self.limit)


def task_manager(include: list[str], defaults: bool) -> TaskManager:
    """lm-eval's task index over the user's task folders (``include``), and over its own tasks
    when a name needs them (``defaults``: thousands of YAML files read, seconds)."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=list(include) or None, include_defaults=defaults)


def run(
    model: str,
    model_args: dict[str, Any],
    tasks: list[str],
    manager: TaskManager,
    options: Options,
    *,
    device: str | None,
    chat: bool,
) -> dict[str, Any] | None:
    """``lm_eval.simple_evaluate`` of one model on ``tasks`` (names and YAML paths ``manager``
    knows): its results as JSON-safe data on the main process (its samples on request), None on
    the others. ``chat``: prompts rendered through the tokenizer's chat template
    (lm-eval's ``apply_chat_template``)."""
    import lm_eval
    from lm_eval.utils import handle_non_serializable

    quiet()
    found = lm_eval.simple_evaluate(
        model=model,
        model_args=model_args,
        tasks=list(tasks),
        num_fewshot=options.num_fewshot,
        batch_size=options.batch_size,
        device=device,
        limit=options.lm_limit,
        task_manager=manager,
        apply_chat_template=chat,
        log_samples=options.samples,
    )
    if found is None:
        return None
    return json.loads(json.dumps(found, default=handle_non_serializable))
