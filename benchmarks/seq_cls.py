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

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from image_to_text import ROOT, Setup, measure_job  # noqa: E402

TASK = "seq-cls"
JOB = ROOT / "xtrain" / "data" / "quickstart.yaml"


def measure(repeats: int = 3, steps: int = 30, warmup: int = 5, log: Any = None) -> dict[str, Any]:
    """For benchmarks/run_all.py: seq-cls's job, both loops, sentences/s."""
    return measure_job(Setup(JOB, steps, warmup), TASK, "sentences", repeats, log, worker=False)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    result = measure(a.repeats, a.steps, a.warmup, log=lambda m: print(m, file=sys.stderr))
    if a.json:
        print(json.dumps(result, indent=1))
        return
    for name, d in result["samples_per_s"].items():
        print(f"{name}: {d['median']:.1f} sentences/s")
    print(f"xtrain / hand-written: {result['ratio']:.2f}x")


if __name__ == "__main__":
    main()
