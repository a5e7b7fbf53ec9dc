"""xtrain's DPO against TRL's DPOTrainer on the same job: the built-in tiny llama, the built-in
preference pairs (400 train, 100 eval), LoRA r=8 / alpha 16 on q/k/v/o (the reference: the
adapters off), 8 pairs per micro-batch x 2 accumulation, 30 steps, lr 5e-3 cosine with 5 warm-up
steps, beta 0.1, max_length 64, one thread each, on CPU. Each side runs in a fresh process
(TRL in its own environment, ``--trl-python``; never a dependency of xtrain), alternating, and
stamps every optimizer step with torch's global optimizer-step pre-hook; the steps after the
first ``--skip`` are timed by wall clock and by the process's CPU time (the steadier figure on a
shared machine). Prints a markdown table (docs/performance.md, "Preference tuning").

    python -m venv .venv-trl && .venv-trl/bin/pip install torch==2.13.0 trl peft
    .venv/bin/python benchmarks/preference_vs_trl.py --trl-python .venv-trl/bin/python --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
STEPS, PER_DEVICE, ACCUMULATION, LR, BETA, MAX_LENGTH = 30, 8, 2, 5e-3, 0.1, 64


def xtrain_side(out: str) -> None:
    """This process: xtrain's loop on the quickstart-shaped job (on the random tiny llama, as TRL's
    side), stamps at every optimizer step."""
    import torch
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    from xtrain.planning.resolve import resolve
    from xtrain.tasks.validation import load_config
    from xtrain.train.loop import train

    torch.set_num_threads(1)
    stamps: list[tuple[float, float]] = []
    register_optimizer_step_pre_hook(lambda *_: stamps.append((time.perf_counter(), time.process_time())))
    job = HERE.parent / "xtrain" / "builtin" / "jobs" / "quickstart-preference.yaml"
    cfg = load_config(job, [
        "model.name_or_path=builtin:tiny-llama", f"run.output_dir={out}", f"run.max_steps={STEPS}",
        "run.eval_every=null", "run.eval_at_start=false",
        "run.log_every=10", "run.report_to=none", f"batch.per_device={PER_DEVICE}",
        f"batch.global_batch={PER_DEVICE * ACCUMULATION}", f"optim.lr={LR}", "optim.schedule=cosine",
        "optim.warmup_steps=5", f"preference.beta={BETA}", f"data.max_length={MAX_LENGTH}",
    ])  # fmt: skip
    result = train(cfg, resolve(cfg, processes=1).plan)
    accuracy = result.eval_metrics["rewards/accuracy"]
    print("RESULT " + json.dumps({"stamps": stamps, "reward_accuracy": accuracy}))


def _run(cmd: list[str]) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        raise SystemExit(f"{cmd[:3]} failed:\n{proc.stderr[-3000:]}")
    return json.loads(line.removeprefix("RESULT "))


def per_step(stamps: list[list[float]], skip: int) -> tuple[float, float]:
    """(median wall seconds, median CPU seconds) between consecutive steps after the first ``skip``."""
    kept = stamps[skip:]
    walls = [b[0] - a[0] for a, b in zip(kept, kept[1:], strict=False)]
    cpus = [b[1] - a[1] for a, b in zip(kept, kept[1:], strict=False)]
    return statistics.median(walls), statistics.median(cpus)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--trl-python", default=str(HERE.parent / ".venv-trl" / "bin" / "python"))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--skip", type=int, default=5)
    p.add_argument("--xtrain-side", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.xtrain_side:
        return xtrain_side(a.xtrain_side)

    from xtrain import builtin

    model = builtin.ensure_builtin_model("builtin:tiny-llama")
    data = builtin.ensure_builtin_data("builtin:preference-pairs")
    rows: dict[str, list[tuple[float, float, float]]] = {"xtrain": [], "TRL DPOTrainer": []}
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(a.repeats):
            sides = {
                "xtrain": [sys.executable, __file__, "--xtrain-side", f"{tmp}/x{k}"],
                "TRL DPOTrainer": [
                    a.trl_python, str(HERE / "preference_trl_job.py"), "--model", str(model),
                    "--train", str(data / "train.jsonl"), "--eval", str(data / "eval.jsonl"),
                    "--out", f"{tmp}/t{k}", "--steps", str(STEPS), "--per-device", str(PER_DEVICE),
                    "--accumulation", str(ACCUMULATION), "--lr", str(LR), "--beta", str(BETA),
                    "--max-length", str(MAX_LENGTH),
                ],
            }  # fmt: skip
            for name, cmd in sides.items():
                found = _run(cmd)
                wall, cpu = per_step(found["stamps"], a.skip)
                rows[name].append((wall, cpu, float(found["reward_accuracy"])))
                print(f"# {name} run {k + 1}: {wall:.3f} s/step wall, {cpu:.3f} s/step CPU, "
                      f"reward accuracy {found['reward_accuracy']:.3f}", file=sys.stderr)  # fmt: skip
    print("| trainer | s/step (wall, median) | s/step (CPU, median) | final eval reward accuracy |")
    print("|---|---|---|---|")
    for name, runs in rows.items():
        wall = statistics.median(r[0] for r in runs)
        cpu = statistics.median(r[1] for r in runs)
        acc = ", ".join(f"{r[2]:.2f}" for r in runs)
        print(f"| {name} | {wall:.3f} | {cpu:.3f} | {acc} |")
    x, t = (statistics.median(r[1] for r in rows[n]) for n in rows)
    print(f"\nxtrain / TRL, CPU time per step: {x / t:.2f}x")


if __name__ == "__main__":
    main()
