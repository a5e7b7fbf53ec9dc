"""Keep a training run's terminal readable, and its numbers right.

transformers, datasets and peft print progress bars, load reports ("classifier.weight |
MISSING", expected for a new task head) and deprecation warnings that say nothing to an xtrain
user: ``quiet_libraries`` hides them (tqdm bars of any library too: ``quiet_progress_bars``), and
a library's log line about an error xtrain says itself. Set ``XTRAIN_VERBOSE=1`` to see them all
again (debugging a model that will not load). Errors are never hidden.

Some library warnings are the opposite of noise: they say the gradients are wrong while the run
goes on (the loss may even fall). ``wrong_results_raise`` turns those (``WRONG_RESULTS``) into
exceptions for the duration of a run, and ``wrong_result`` into the one-line error the CLI prints.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partialmethod

from xtrain.errors import XtrainError

VERBOSE_ENV = "XTRAIN_VERBOSE"
# bitsandbytes, imported by `import peft` (so by every run, also one that does not quantize), logs
# a warning at import on CPUs with AVX512-BF16 when the optional `kernels` package is missing:
# "Failed to load CPU gemm_4bit_forward from kernels-community: No module named 'kernels'. ..."
# (bitsandbytes/backends/cpu/ops.py, 0.50). It then uses its own CPU 4-bit kernel: nothing is
# wrong. Only that record is dropped; the logger's other records, and this one when `kernels` is
# installed but fails, still show.
BNB_CPU_LOGGER = "bitsandbytes.backends.cpu.ops"
BNB_KERNELS_HINT = "Failed to load CPU gemm_4bit_forward from kernels-community"


class _NoKernelsPackageHint(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        missing = bool(record.args) and isinstance(record.args[0], ModuleNotFoundError)  # type: ignore[index]
        return not (missing and str(record.msg).startswith(BNB_KERNELS_HINT))


def quiet_bitsandbytes() -> None:
    """Drop bitsandbytes' hint about the optional ``kernels`` package: call before bitsandbytes
    (or peft, which imports it) is imported; the record is logged once, at import. Idempotent;
    nothing with ``XTRAIN_VERBOSE=1``."""
    if os.environ.get(VERBOSE_ENV, "").strip() not in ("", "0"):
        return
    logger = logging.getLogger(BNB_CPU_LOGGER)
    if not any(isinstance(f, _NoKernelsPackageHint) for f in logger.filters):
        logger.addFilter(_NoKernelsPackageHint())


# deepspeed, wherever it is installed, is imported by accelerate's `unwrap_model` and so by
# transformers' `save_pretrained` (accelerate/utils/other.py: an isinstance check), in every run
# that saves, DeepSpeed or not. On a machine without a GPU its import logs, to stdout (DeepSpeed's
# logger has a stdout handler of its own): "Setting accelerator to CPU. If you have GPU or other
# accelerator, we were unable to detect it." (deepspeed/accelerator/real_accelerator.py, 0.19).
# xtrain never runs DeepSpeed without CUDA GPUs (launch/sharding.py refuses it), so there the line
# only says a package is installed. Only that record is dropped.
DS_LOGGER = "DeepSpeed"
DS_CPU_HINT = "Setting accelerator to CPU"


class _NoDeepSpeedCpuHint(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(DS_CPU_HINT)


def quiet_deepspeed() -> None:
    """Drop DeepSpeed's "Setting accelerator to CPU" line: call before deepspeed is imported
    (the record is logged once, at import; DeepSpeed's logger keeps filters added before).
    Idempotent; nothing with ``XTRAIN_VERBOSE=1``."""
    if os.environ.get(VERBOSE_ENV, "").strip() not in ("", "0"):
        return
    logger = logging.getLogger(DS_LOGGER)
    if not any(isinstance(f, _NoDeepSpeedCpuHint) for f in logger.filters):
        logger.addFilter(_NoDeepSpeedCpuHint())


# Progress bars of the libraries that do not go through their library's switch: transformers'
# GGUF reader ("Converting and de-quantizing GGUF tensors...", a bare `tqdm.auto` in
# modeling_gguf_pytorch_utils.py), peft's and gguf's writers. tqdm's own switch is its
# environment (`TQDM_DISABLE=1`, read when tqdm is imported, inherited by the workers); a tqdm
# imported before is given the same default. xtrain's own progress is rich's.
TQDM_ENV = "TQDM_DISABLE"


def quiet_progress_bars() -> None:
    """Third-party tqdm bars off, in this process and the ones it starts (``TQDM_DISABLE=1``);
    a bar asked for with ``disable=False`` still shows. Idempotent; nothing with
    ``XTRAIN_VERBOSE=1``, or where the user set TQDM_DISABLE."""
    if os.environ.get(VERBOSE_ENV, "").strip() not in ("", "0") or TQDM_ENV in os.environ:
        return
    os.environ[TQDM_ENV] = "1"
    std = sys.modules.get("tqdm.std")
    if std is None:
        return  # tqdm reads it when imported
    # imported already: the default tqdm would have taken from the variable (its `envwrap`)
    init = std.tqdm.__dict__["__init__"]
    func, given = (init.func, dict(init.keywords)) if isinstance(init, partialmethod) else (init, {})
    std.tqdm.__init__ = partialmethod(func, **{**given, "disable": True})


def quiet_data_read_errors() -> None:
    """Drop datasets' own log line about a data file it cannot parse ("Failed to load JSON from
    file ... with error ..."): it always raises next, and xtrain says that error in one line
    naming the file and the line (``xtrain.data.read_errors``). Idempotent; nothing with
    ``XTRAIN_VERBOSE=1``."""
    if os.environ.get(VERBOSE_ENV, "").strip() not in ("", "0"):
        return
    logger = logging.getLogger(DATASETS_JSON_LOGGER)
    if not any(isinstance(f, _NoDataReadError) for f in logger.filters):
        logger.addFilter(_NoDataReadError())


DATASETS_JSON_LOGGER = "datasets.packaged_modules.json.json"
DATASETS_READ_ERRORS = ("Failed to load JSON from file", "Failed to convert pandas DataFrame")


class _NoDataReadError(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(DATASETS_READ_ERRORS)


def quiet_libraries() -> None:
    if os.environ.get(VERBOSE_ENV, "").strip() not in ("", "0"):
        return
    quiet_progress_bars()  # first: before transformers and datasets import tqdm
    quiet_bitsandbytes()  # first: transformers' and datasets' imports may import peft
    quiet_deepspeed()
    quiet_data_read_errors()
    import datasets
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    # transformers 5 deprecations triggered inside peft/transformers, not by xtrain's calls
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"transformers\..*")
    warnings.filterwarnings("ignore", message=r".*is_gradient_checkpointing.*")


@dataclass(frozen=True)
class WrongResult:
    """A library warning that means wrong numbers: its message (a regex, matched from the start
    as ``warnings`` does) and what xtrain says instead (``{0}``: the warning's first words)."""

    pattern: str
    message: str
    hint: str


REPORT = "report it to xtrain with the output of `xtrain doctor`"
WRONG_RESULTS = (
    # torch's autograd fallback: an operator without a backward ran on inputs that need gradients
    # (bitsandbytes' CPU gemv_4bit after an evaluation's repack: docs/fitting-big-models.md)
    WrongResult(
        r".*an autograd kernel was not registered",
        "{0} has no gradient (torch: an autograd kernel was not registered): the weights before it "
        "would train on wrong gradients, so the run stopped",
        f"{REPORT}; model.quantization=null trains without bitsandbytes' 4/8-bit layers",
    ),
    # reentrant activation checkpointing with no input that needs a gradient: the adapters inside
    # get none (xtrain's own checkpointing is non-reentrant; a custom task's may not be)
    WrongResult(
        r"None of the inputs have requires_grad=True\. Gradients will be None",
        "activation checkpointing got no input that needs a gradient: the weights inside it would "
        "not train, so the run stopped",
        "model.gradient_checkpointing=true sets it up right; a custom task that checkpoints itself: "
        "use_reentrant=False, or model.enable_input_require_grads()",
    ),
)


@contextmanager
def wrong_results_raise() -> Iterator[None]:
    """Within: the ``WRONG_RESULTS`` warnings are raised as exceptions (every time, not once per
    place as a warning is shown), each other filter as it was; restored on the way out."""
    with warnings.catch_warnings():
        for wrong in WRONG_RESULTS:
            warnings.filterwarnings("error", message=wrong.pattern)
        yield


def wrong_result(raised: Warning) -> XtrainError | None:
    """The one-line error for a ``WRONG_RESULTS`` warning raised by ``wrong_results_raise``
    (None: another warning, raised because a filter of the user's says so)."""
    text = str(raised)
    for wrong in WRONG_RESULTS:
        if re.match(wrong.pattern, text):
            what = text.split(": ")[0].strip()[:80]  # the operator, in torch's words
            # exit 3, as a diverged run's (failures.py): the numbers went wrong, not the input
            return XtrainError(wrong.message.format(what), wrong.hint, exit_code=3)
    return None
