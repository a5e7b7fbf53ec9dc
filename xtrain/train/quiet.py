"""Keep a training run's terminal readable: xtrain's own banner, progress and results only.

transformers, datasets and peft print progress bars, load reports ("classifier.weight |
MISSING", expected for a new task head) and deprecation warnings that say nothing to an xtrain
user. Set ``XTRAIN_VERBOSE=1`` to see them all again (debugging a model that will not load).
Errors are never hidden.
"""

from __future__ import annotations

import os
import warnings

VERBOSE_ENV = "XTRAIN_VERBOSE"


def quiet_libraries() -> None:
    if os.environ.get(VERBOSE_ENV, "").strip() not in ("", "0"):
        return
    import datasets
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    # transformers 5 deprecations triggered inside peft/transformers, not by xtrain's calls
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"transformers\..*")
    warnings.filterwarnings("ignore", message=r".*is_gradient_checkpointing.*")
