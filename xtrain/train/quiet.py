"""Keep a training run's terminal readable: xtrain's own banner, progress and results only.

transformers, datasets and peft print progress bars, load reports ("classifier.weight |
MISSING", expected for a new task head) and deprecation warnings that say nothing to an xtrain
user. Set ``XTRAIN_VERBOSE=1`` to see them all again (debugging a model that will not load).
Errors are never hidden.
"""

from __future__ import annotations

import logging
import os
import warnings

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


def quiet_libraries() -> None:
    if os.environ.get(VERBOSE_ENV, "").strip() not in ("", "0"):
        return
    quiet_bitsandbytes()  # first: transformers' and datasets' imports may import peft
    import datasets
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    # transformers 5 deprecations triggered inside peft/transformers, not by xtrain's calls
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"transformers\..*")
    warnings.filterwarnings("ignore", message=r".*is_gradient_checkpointing.*")
