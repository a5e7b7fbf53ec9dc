"""image-to-text: xtrain's loop vs a hand-written loop on the same VisionEncoderDecoder job, in one
process, and the share of step time spent waiting for data (reading PNGs + the image processor).

Same workload for both (xtrain's image-to-text builder on ``builtin:tiny-trocr`` and
``builtin:ocr-lines``: lazy PNG rows, the collator, full fine-tune), same micro-batches,
accumulation, AdamW, cosine schedule and clipping. Images/s = global batch / median step time
after ``--warmup`` steps, best of ``--repeats`` alternating runs (robust on a shared machine).

    .venv/bin/python benchmarks/image_to_text.py            # CPU defaults, a few minutes
    .venv/bin/python benchmarks/image_to_text.py --json

The data share is the time spent inside the data set and the collator over the time of the
training steps, with the DataLoader in the training process (the plan on this 2-core CPU gives no
workers). A third variant, xtrain with one DataLoader worker (what the plan gives image and audio
tasks on GPU machines, ``media_workers``), has its data share from the loop's own count: the time
the training process waited for its next batch (``data_seconds`` of each logging window).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import hand_written_loop, task_config  # noqa: E402

from xtrain.config.schema import TrainConfig  # noqa: E402
from xtrain.machine.facts import Facts  # noqa: E402
from xtrain.planning.rules import make_plan  # noqa: E402
from xtrain.tasks.contract import Workload  # noqa: E402
from xtrain.train.report import NullReporter  # noqa: E402

TASK = "image-to-text"
JOB = ROOT / "xtrain" / "builtin" / "jobs" / "quickstart-image-to-text.yaml"


@dataclass(frozen=True)
class Setup:
    """One measurement's job and settings, passed to every run explicitly (no module state:
    ``speech_to_text.py`` measures its own job with the same code)."""

    job: Path
    steps: int = 30
    warmup: int = 5
    per_device: int = 16
    accum: int = 2


class Timer:
    """Seconds spent in data loading (shared by the timed data set and collator)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.started = time.perf_counter()


class TimedRows:
    def __init__(self, rows: Any, timer: Timer) -> None:
        self.rows, self.timer = rows, timer

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> Any:
        t = time.perf_counter()
        try:
            return self.rows[i]
        finally:
            self.timer.seconds += time.perf_counter() - t


class TimedCollator:
    def __init__(self, collator: Any, timer: Timer) -> None:
        self.collator, self.timer = collator, timer

    def __call__(self, rows: list[Any]) -> Any:
        t = time.perf_counter()
        try:
            return self.collator(rows)
        finally:
            self.timer.seconds += time.perf_counter() - t


def job_config(setup: Setup) -> TrainConfig:
    return task_config(setup.job, setup.per_device, setup.accum, setup.steps)


def local_run(cfg: TrainConfig) -> Any:
    """``cfg``'s Run for this process alone on a CPU plan (the plain loop's model)."""
    from xtrain.planning.context import LaunchContext
    from xtrain.planning.run import for_process

    return for_process(cfg, LaunchContext(), plan=make_plan(Facts(torch_version=torch.__version__)))


def workload(run: Any, timer: Timer) -> Workload:
    from xtrain.tasks import build_workload

    w = build_workload(run)
    w.train_dataset = TimedRows(w.train_dataset, timer)
    w.collator = TimedCollator(w.collator, timer)
    timer.started = time.perf_counter()  # training starts now: the share's denominator
    return w


class StepClock(NullReporter):
    def __init__(self) -> None:
        self.times: dict[int, float] = {}

    def progress(self, step: int, total: int, metrics: dict[str, float] | None = None) -> None:
        self.times[step] = time.perf_counter()


def steady(setup: Setup, times: dict[int, float]) -> float:
    """Median seconds per step after the warm-up."""
    return statistics.median(times[s] - times[s - 1] for s in range(setup.warmup + 1, setup.steps + 1))


def run_xtrain(setup: Setup, workers: int = 0) -> tuple[float, float]:
    """xtrain's loop: (seconds per step, data share). With ``workers`` the rows are read in
    DataLoader workers, and the share is the loop's own count of the wait for batches."""
    from xtrain.train.loop import train

    cfg, timer, clock = job_config(setup), Timer(), StepClock()
    cfg.data.num_workers = workers
    with tempfile.TemporaryDirectory() as out:
        cfg.run.output_dir = out
        plan = make_plan(Facts(torch_version=torch.__version__, gloo_available=True))
        result = train(cfg, plan, clock, build=lambda run, mpf: workload(run, timer))
    if workers:  # the windows after the first (which waits for the workers to start)
        steady_windows = result.windows[1:] or result.windows
        waited = sum(w["data_seconds"] for w in steady_windows) / sum(w["seconds"] for w in steady_windows)
        return steady(setup, clock.times), waited
    return steady(setup, clock.times), timer.seconds / (clock.times[setup.steps] - timer.started)


def run_plain(setup: Setup) -> tuple[float, float]:
    """The floor: a plain PyTorch loop over the same workload."""
    from transformers import get_scheduler

    cfg, timer = job_config(setup), Timer()
    torch.manual_seed(0)
    w = workload(local_run(cfg), timer)
    params = [p for p in w.model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.optim.lr)
    sched = get_scheduler("cosine", opt, num_warmup_steps=2, num_training_steps=setup.steps)
    loader = torch.utils.data.DataLoader(
        w.train_dataset, batch_size=setup.per_device, shuffle=True, collate_fn=w.collator
    )
    times = hand_written_loop(
        w.model, iter(loader), steps=setup.steps, accum=setup.accum, optimizer=opt, scheduler=sched,
        max_grad_norm=1.0,
    )  # fmt: skip
    steps = dict(enumerate(times))
    steps[0] = timer.started
    return steady(setup, steps), timer.seconds / (times[-1] - timer.started)


def measure_job(
    setup: Setup, task: str, unit: str, repeats: int = 3, log: Any = None, worker: bool = True
) -> dict[str, Any]:
    """The loops on ``setup.job`` (``worker``: also xtrain with one DataLoader worker), ``repeats``
    interleaved runs in this process, one compute thread; log lines and the result name ``task``
    (rates in ``unit``/s: samples per second)."""
    from common import Spread

    say = log or (lambda m: None)
    torch.set_num_threads(1)
    samples = setup.per_device * setup.accum
    runs = {"plain": run_plain, "xtrain": run_xtrain}
    if worker:
        runs["xtrain_worker"] = lambda s: run_xtrain(s, workers=1)
    rates: dict[str, list[float]] = {name: [] for name in runs}
    shares: dict[str, list[float]] = {name: [] for name in runs}
    for r in range(repeats):
        for name in list(runs) if r % 2 == 0 else list(runs)[::-1]:
            step_s, share = runs[name](setup)
            rates[name].append(samples / step_s)
            shares[name].append(share)
            say(f"{task}: repeat {r + 1}/{repeats} {name}: {samples / step_s:.1f} {unit}/s "
                f"({setup.job.name}, data {share:.0%} of step time)")  # fmt: skip
    return {
        "task": task,
        "job": setup.job.name,
        "setup": {
            "steps": setup.steps,
            "repeats": repeats,
            "per_device": setup.per_device,
            "accum": setup.accum,
            "warmup": setup.warmup,
        },
        "samples_per_s": {k: Spread.of(v).to_dict() for k, v in rates.items()},
        "data_share": {k: Spread.of(v).to_dict() for k, v in shares.items()},
        "ratio": statistics.median(rates["xtrain"]) / statistics.median(rates["plain"]),
    }


def measure(repeats: int = 3, steps: int = 30, warmup: int = 5, log: Any = None) -> dict[str, Any]:
    """For benchmarks/run_all.py: image-to-text's job, both loops, images/s."""
    out = measure_job(Setup(JOB, steps, warmup), TASK, "images", repeats, log)
    out["images_per_s"] = out.pop("samples_per_s")
    return out


def task_main(doc: str, measure: Any, rate_key: str, unit: str) -> None:
    """The command line of a task benchmark built on ``measure_job`` (image-classification,
    seq-cls): ``--steps --warmup --repeats --json``, then one line a loop and the ratio."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    result = measure(a.repeats, a.steps, a.warmup, log=lambda m: print(m, file=sys.stderr))
    if a.json:
        print(json.dumps(result, indent=1))
        return
    for name, d in result[rate_key].items():
        share = result["data_share"][name]["median"]
        print(f"{name}: {d['median']:.1f} {unit}/s, data {share:.0%} of step time")
    print(f"xtrain / hand-written: {result['ratio']:.2f}x")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--per-device", type=int, default=16)
    p.add_argument("--accum", type=int, default=2)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    setup = Setup(JOB, a.steps, a.warmup, a.per_device, a.accum)

    runs: dict[str, list[tuple[float, float]]] = {"plain": [], "xtrain": []}
    for _ in range(a.repeats):  # alternate, so drifting machine load hits both alike
        runs["plain"].append(run_plain(setup))
        runs["xtrain"].append(run_xtrain(setup))
    images = a.per_device * a.accum
    best = {k: min(v) for k, v in runs.items()}  # the fastest run (smallest step time)
    result = {
        "task": TASK,
        "job": JOB.name,
        "plain_images_per_s": images / best["plain"][0],
        "xtrain_images_per_s": images / best["xtrain"][0],
        "ratio": best["plain"][0] / best["xtrain"][0],
        "data_share_plain": best["plain"][1],
        "data_share_xtrain": best["xtrain"][1],
        "runs": runs,
        "setup": {k: v for k, v in vars(a).items() if k != "json"},
        "threads": torch.get_num_threads(),
    }
    if a.json:
        print(json.dumps(result, indent=1))
        return
    print(
        f"{TASK} ({JOB.name})\n"
        f"hand-written loop: {result['plain_images_per_s']:.1f} images/s, "
        f"data {100 * result['data_share_plain']:.0f}% of step time\n"
        f"xtrain loop:       {result['xtrain_images_per_s']:.1f} images/s, "
        f"data {100 * result['data_share_xtrain']:.0f}% of step time\n"
        f"ratio xtrain/plain: {result['ratio']:.3f} (best of {a.repeats}; global batch "
        f"{a.per_device}x{a.accum}, {torch.get_num_threads()} thread(s))"
    )


if __name__ == "__main__":
    main()
