"""image-classification: xtrain's loop vs a hand-written loop on the same ViT job, in one process:
images per second, and the share of step time spent waiting for data (reading PNGs + the image
processor).

The measurement is ``image_to_text.py``'s code (``measure_job``: the same timed data set and
collator, the same hand-written loop), given this benchmark's own job explicitly: ``xtrain
quickstart --task image-classification``'s (``builtin:tiny-vit`` on ``builtin:color-shapes``,
LoRA on the attention, the classifier head trained whole).

    .venv/bin/python benchmarks/image_classification.py            # CPU defaults, a few minutes
    .venv/bin/python benchmarks/image_classification.py --json
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from image_to_text import ROOT, Setup, measure_job, task_main  # noqa: E402

TASK = "image-classification"
JOB = ROOT / "xtrain" / "builtin" / "jobs" / "quickstart-image-classification.yaml"


def measure(repeats: int = 3, steps: int = 30, warmup: int = 5, log: Any = None) -> dict[str, Any]:
    """For benchmarks/run_all.py: image-classification's job, every loop, images/s."""
    out = measure_job(Setup(JOB, steps, warmup), TASK, "images", repeats, log)
    out["images_per_s"] = out.pop("samples_per_s")
    return out


def main() -> None:
    task_main(__doc__, measure, "images_per_s", "images")


if __name__ == "__main__":
    main()
