"""data.group_by_length on ``xtrain quickstart --task speech-to-text``'s job: the padding share of
the micro-batches (audio seconds and label tokens) with the plain and the grouped data order,
and the model's forward+backward time per optimizer step for both orders.

Padding share = 1 - sum(lengths) / sum(longest in its micro-batch x batch size), over the
quickstart's 600 steps (deterministic: a property of the data order). Step time: the same steps
of both orders interleaved (the load of a shared machine hits both alike), one compute thread,
median after 5 warm-up steps; collation is not timed. It uses ``DataOrder`` directly, so it does
not depend on how the loop builds it.

    .venv/bin/python benchmarks/group_by_length.py            # about a minute on 2 cores
    .venv/bin/python benchmarks/group_by_length.py --json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "xtrain" / "builtin" / "jobs" / "quickstart-speech-to-text.yaml"


def measure(steps: int = 60, warmup: int = 5) -> dict[str, Any]:
    from common import build_alone

    from xtrain.data.sampler import DataOrder, padding_fraction, train_lengths
    from xtrain.tasks.validation import load_config

    torch.set_num_threads(1)
    cfg = load_config(JOB, [])
    work = build_alone(cfg)
    rows = work.train_dataset
    n, size, per = len(rows), cfg.batch.global_batch, cfg.batch.per_device
    seconds = train_lengths(work)
    tokens = [len(ids) for ids in work.collator.labels([rows.ds[i][cfg.data.text_column] for i in range(n)])]
    orders = {
        "plain": DataOrder(n, size, per, 1, cfg.run.seed),
        "grouped": DataOrder(n, size, per, 1, cfg.run.seed, lengths=seconds),
    }
    run = range(cfg.run.max_steps or 600)
    out: dict[str, Any] = {
        "clips": n,
        "mean_clip_s": statistics.fmean(seconds),
        "steps_timed": steps - warmup,
    }
    model = work.model.train()
    timed: dict[str, list[float]] = {k: [] for k in orders}
    for step in range(steps):
        for name, order in orders.items():
            batches = [work.collator([rows[i] for i in mb]) for mb in order.rank_batches(step, 0)]
            start = time.perf_counter()
            for batch in batches:
                model(**batch).loss.backward()
            model.zero_grad(set_to_none=True)
            if step >= warmup:
                timed[name].append(time.perf_counter() - start)
    for name, order in orders.items():
        median = statistics.median(timed[name])
        out[name] = {
            "audio_padding": padding_fraction(order, seconds, run),
            "label_padding": padding_fraction(order, tokens, run),
            "step_ms": median * 1000,
            "clips_per_s": size / median,
        }
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true")
    p.add_argument("--steps", type=int, default=60)
    args = p.parse_args()
    result = measure(args.steps)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for name in ("plain", "grouped"):
        r = result[name]
        print(
            f"{name:8s} audio padding {r['audio_padding']:.1%}  label padding {r['label_padding']:.1%}  "
            f"fwd+bwd {r['step_ms']:.1f} ms/step ({r['clips_per_s']:.0f} clips/s)"
        )


if __name__ == "__main__":
    main()
