"""speech-to-text: xtrain's loop vs a hand-written loop on the same Whisper job, in one process:
audio seconds trained per second, and the share of step time spent waiting for data (reading
WAV files, resampling 8 -> 16 kHz, log-mel features).

The measurement is ``image_to_text.py``'s code (``measure_job``: the same timed data set and
collator, the same hand-written loop: micro-batches, accumulation, AdamW, cosine schedule,
clipping), given this benchmark's own job explicitly: ``xtrain quickstart --task
speech-to-text``'s (``builtin:tiny-whisper`` on ``builtin:spoken-words``, full fine-tune).
Audio seconds/s = clips/s x the mean clip length of the training set.

    .venv/bin/python benchmarks/speech_to_text.py            # CPU defaults, a few minutes
    .venv/bin/python benchmarks/speech_to_text.py --json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from image_to_text import ROOT, Setup, measure_job  # noqa: E402

TASK = "speech-to-text"
JOB = ROOT / "xtrain" / "builtin" / "jobs" / "quickstart-speech-to-text.yaml"


def mean_clip_seconds() -> float:
    """The mean length of the built-in training clips (file headers only)."""
    import soundfile

    from xtrain import builtin

    train = builtin.builtin_data_file("builtin:spoken-words", "train")
    rows = [json.loads(line) for line in train.read_text(encoding="utf-8").splitlines()]
    return statistics.fmean(soundfile.info(str(train.parent / r["audio"])).duration for r in rows)


def _scale(spread: dict[str, float], factor: float) -> dict[str, float]:
    return {k: (v * factor if k != "n" else v) for k, v in spread.items()}


def measure(repeats: int = 3, steps: int = 30, warmup: int = 5, log: Any = None) -> dict[str, Any]:
    """For benchmarks/run_all.py: speech-to-text's job, both loops, ``repeats`` interleaved runs,
    one compute thread."""
    seconds = mean_clip_seconds()
    out = measure_job(Setup(JOB, steps, warmup), TASK, "clips", repeats, log)
    clips = out.pop("samples_per_s")
    out["clips_per_s"] = clips
    out["audio_s_per_s"] = {k: _scale(v, seconds) for k, v in clips.items()}
    out["mean_clip_s"] = seconds
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    result = measure(repeats=args.repeats, steps=args.steps)
    if args.json:
        print(json.dumps(result, indent=1))
        return
    print(f"{TASK} ({JOB.name})")
    for label, key in (("hand-written loop", "plain"), ("xtrain loop", "xtrain")):
        print(
            f"{label + ':':19}{result['audio_s_per_s'][key]['median']:.1f} audio s/s "
            f"({result['clips_per_s'][key]['median']:.1f} clips/s), "
            f"data {100 * result['data_share'][key]['median']:.0f}% of step time"
        )
    print(
        f"ratio xtrain/plain: {result['ratio']:.3f} (median of {args.repeats}; mean clip "
        f"{result['mean_clip_s']:.2f} s, {torch.get_num_threads()} thread(s))"
    )


if __name__ == "__main__":
    main()
