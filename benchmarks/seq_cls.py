"""seq-cls: xtrain's loop vs a hand-written loop on the same text-classification job, in one
process: sentences per second.

The measurement is ``image_to_text.py``'s code (``measure_job``: the same timed data set and
collator, the same hand-written loop), given this benchmark's own job explicitly: ``xtrain
quickstart``'s default (``builtin:tiny-bert`` on ``builtin:sentiment``, LoRA, the head trained
whole). Tokenised text needs no DataLoader worker, so there is no worker row.

    .venv/bin/python benchmarks/seq_cls.py            # CPU defaults, a minute or two
    .venv/bin/python benchmarks/seq_cls.py --json
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from image_to_text import ROOT, Setup, measure_job, task_main  # noqa: E402

TASK = "seq-cls"
JOB = ROOT / "xtrain" / "builtin" / "jobs" / "quickstart.yaml"


def measure(repeats: int = 3, steps: int = 30, warmup: int = 5, log: Any = None) -> dict[str, Any]:
    """For benchmarks/run_all.py: seq-cls's job, both loops, sentences/s."""
    return measure_job(Setup(JOB, steps, warmup), TASK, "sentences", repeats, log, worker=False)


def main() -> None:
    task_main(__doc__, measure, "samples_per_s", "sentences")


if __name__ == "__main__":
    main()
