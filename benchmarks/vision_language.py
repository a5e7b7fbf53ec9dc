"""vision-language: samples/s and tokens/s of xtrain's loop vs a hand-written loop on the same
tiny VLM job (issue 13).

The job is ``xtrain quickstart --task vision-language``'s: ``builtin:tiny-qwen2-vl`` (a 2-block
vision tower, a 2-layer Qwen2 language model) on ``builtin:shapes-vqa`` (56x56 PNGs read per row,
one question, a one-word answer), LoRA r=16 on the language model with the merger trained whole,
the vision tower frozen. Both loops get the workload from xtrain's task builder (same model, same
LoRA, same processor and collator) and draw the same micro-batches in the same order (xtrain's
data order, ``DataOrder`` + ``RankBatchSampler``, with the plan's DataLoader workers), for the
same number of optimizer steps at the same global batch (``--per-device`` x ``--accum``, one
process). The hand-written loop is ``common.hand_written_loop``: AdamW (the job's lr, betas, eps,
weight decay), the job's schedule, clipping, autocast where the plan picks mixed precision, one
host sync per ``--log-every`` steps.

Rates: xtrain's are its own logging windows, read back from ``train_result.json`` (``windows``)
as ``xtrain bench`` reads them; the hand-written loop's are windows of the same length from its
step times; both leave out the first window (warm-up) and divide the remaining samples (tokens)
by the remaining seconds (``xtrain.bench.rates.steady_rates``). **Tokens are non-padding input tokens
(the attention mask's sum), the image tokens included**: what xtrain's loop counts for this
task. The same samples are also divided by the process's CPU time over the same steps, which
other jobs on a shared machine disturb less than wall time (meaningful on CPU; on CUDA it leaves
out the GPU and any DataLoader workers). **Data wait** is the time the training process spends
blocked on the train loader's next batch (reading PNGs, the processor and collator, in the
process itself when the plan has no DataLoader workers, as on CPU) over the same measured
steps' wall time: in the hand-written loop around ``next()`` on its loader, in xtrain's loop
around the iterator of the loader it builds (``torch.utils.data.DataLoader``, timed by a
subclass in this benchmark's worker process). Every run is a fresh process (``--threads`` compute
threads, 1 by default); the loops alternate ``--repeats`` times (A B, B A, ...); the result has
medians with the min-max, and paired ratios (runs next to each other), so the noise shows.

    .venv/bin/python benchmarks/vision_language.py                    # CPU, ~6 min on 2 busy cores
    .venv/bin/python benchmarks/vision_language.py --device cuda      # a GPU (the plan's precision)
    .venv/bin/python benchmarks/vision_language.py --json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    PYTHON,
    REPO,
    Spread,
    bench_env,
    build_alone,
    emit,
    hand_written_loop,
    machine,
    run_json,
    set_threads_from_env,
    task_config,
)

TASK = "vision-language"
JOB = REPO / "xtrain" / "builtin" / "jobs" / "quickstart-vision-language.yaml"
LOOPS = ("plain", "xtrain")
# per run, in the result
KEPT = ("samples_per_s", "tokens_per_s", "cpu_samples_per_s", "data_wait_share", "threads")


# -- worker side ----------------------------------------------------------------------------------------
def _plan(a: argparse.Namespace) -> Any:
    from xtrain.machine import probe
    from xtrain.planning import rules
    from xtrain.planning.plan import Overrides

    plan = rules.make_plan(probe.collect(quick=True), Overrides(num_processes=1))
    if plan.device != a.device:  # --device cuda on a machine without one (cpu hides CUDA below)
        raise SystemExit(f"--device {a.device}: the plan here runs on {plan.device}")
    return plan


def timed_batches(batches: Any, waits: list[float]) -> Any:
    """``batches``, with the seconds each ``next()`` took appended to ``waits``."""
    while True:
        t = time.perf_counter()
        try:
            batch = next(batches)
        except StopIteration:
            return
        waits.append(time.perf_counter() - t)
        yield batch


def run_xtrain(a: argparse.Namespace, cpu: list[float], waits: list[float]) -> list[dict[str, float]]:
    """xtrain's loop as ``python -m xtrain.run`` runs it; its windows from train_result.json,
    the process's CPU time after each optimizer step (the reporter's calls) into ``cpu``, the
    wait for each train micro-batch into ``waits``."""
    import torch.utils.data

    class WaitedLoader(torch.utils.data.DataLoader):  # the loop builds its loader at run time
        def __iter__(self) -> Any:
            return timed_batches(super().__iter__(), waits)

    torch.utils.data.DataLoader = WaitedLoader  # this worker process only
    from xtrain.train.loop import train
    from xtrain.train.report import NullReporter

    class CpuClock(NullReporter):
        def progress(self, step: int, total: int, metrics: dict[str, float] | None = None) -> None:
            cpu.append(time.process_time())  # (at a log step: after the window's sync)

    cfg = task_config(JOB, a.per_device, a.accum, a.steps, a.log_every)
    with tempfile.TemporaryDirectory() as out:
        cfg.run.output_dir = out
        train(cfg, _plan(a), CpuClock())
        result = json.loads((Path(out) / "train_result.json").read_text(encoding="utf-8"))
    cpu.insert(0, float("nan"))  # cpu[step], as the hand-written loop's list
    return result["windows"]


def run_plain(a: argparse.Namespace, cpu: list[float], waits: list[float]) -> list[dict[str, float]]:
    """The same workload, batches and step count through ``common.hand_written_loop``."""
    import torch
    from transformers import get_scheduler, set_seed

    from xtrain.data.sampler import DataOrder, RankBatchSampler
    from xtrain.planning.resolve import run_settings
    from xtrain.train.precision import upcast_trainable

    cfg = task_config(JOB, a.per_device, a.accum, a.steps, a.log_every)
    plan = _plan(a)
    s = run_settings(cfg, plan, 1)
    device = torch.device("cuda" if a.device == "cuda" else "cpu")
    set_seed(cfg.run.seed)
    w = build_alone(cfg, plan)
    model = w.model.to(device)
    upcast_trainable(model, s.precision)
    params = [p for p in model.parameters() if p.requires_grad]
    o = cfg.optim
    opt = torch.optim.AdamW(params, lr=s.lr, betas=tuple(o.betas), eps=o.eps, weight_decay=o.weight_decay,
                            fused=device.type == "cuda" or None)  # fmt: skip
    warmup = o.warmup_steps or int(round(o.warmup_ratio * a.steps))
    name = {"constant": "constant_with_warmup"}.get(o.schedule, o.schedule)
    sched = get_scheduler(name, opt, num_warmup_steps=warmup, num_training_steps=a.steps)
    order = DataOrder(len(w.train_dataset), s.global_batch, s.per_device, 1, cfg.run.seed)
    pin = s.pin_memory and device.type == "cuda"
    from xtrain.tasks import get as get_task

    loader = torch.utils.data.DataLoader(
        w.train_dataset, batch_sampler=RankBatchSampler(order, 0, 0, a.steps), collate_fn=w.collator,
        num_workers=s.workers_for(get_task(cfg.model.task).decodes_media)[0], pin_memory=pin,
    )  # fmt: skip
    tokens: list[int] = []  # per micro-batch, counted on the host (the batches are xtrain's)

    def counted(batches: Any) -> Any:
        for batch in timed_batches(batches, waits):
            tokens.append(int(batch[w.tokens_key].sum()))
            yield batch

    times = hand_written_loop(
        model, counted(iter(loader)), steps=a.steps, accum=a.accum, optimizer=opt, scheduler=sched,
        max_grad_norm=o.max_grad_norm, device=device, precision=s.precision, log_every=a.log_every,
        cpu_times=cpu,
    )  # fmt: skip
    windows = []
    for end in range(a.log_every, a.steps + 1, a.log_every):
        start = end - a.log_every
        windows.append({"step": end, "steps": a.log_every, "seconds": times[end] - times[start],
                        "samples": a.log_every * s.global_batch,
                        "tokens": sum(tokens[start * a.accum : end * a.accum])})  # fmt: skip
    return windows


def worker(a: argparse.Namespace) -> None:
    import torch

    from xtrain.bench.rates import Window, steady_rates

    set_threads_from_env()
    cpu: list[float] = []
    waits: list[float] = []
    windows = {"plain": run_plain, "xtrain": run_xtrain}[a.worker](a, cpu, waits)
    if len(waits) != a.steps * a.accum:
        raise SystemExit(f"the data-wait clock saw {len(waits)} micro-batches, not {a.steps * a.accum}: does "
                         "the loop still build its loader with torch.utils.data.DataLoader?")  # fmt: skip
    gb = a.per_device * a.accum
    rows = [Window(int(w["step"]), int(w["steps"]), w["samples"] / w["seconds"], w["tokens"] / w["seconds"])
            for w in windows]  # fmt: skip
    samples_per_s, tokens_per_s, measured = steady_rates(rows, gb)
    # the same steps by this process's CPU time: other jobs on a shared machine disturb it less
    cpu_s = cpu[a.steps] - cpu[a.log_every]
    # the same steps' waits for data over their wall time (the windows after the first)
    wait_s = sum(waits[a.log_every * a.accum :])
    wall_s = sum(w["seconds"] for w in windows[1:])
    emit({"loop": a.worker, "samples_per_s": samples_per_s, "tokens_per_s": tokens_per_s,
          "cpu_samples_per_s": measured * gb / cpu_s, "measured_steps": measured,
          "data_wait_share": wait_s / wall_s, "data_wait_ms_per_step": 1000 * wait_s / measured,
          "tokens_measured": sum(w["tokens"] for w in windows[1:]), "threads": torch.get_num_threads(),
          "windows": windows})  # fmt: skip


# -- parent side ----------------------------------------------------------------------------------------
def measure(
    repeats: int = 7,
    steps: int = 100,
    per_device: int = 8,
    accum: int = 2,
    log_every: int = 10,
    device: str = "cpu",
    threads: int | None = 1,
    log: Any = None,
) -> dict[str, Any]:
    """``repeats`` interleaved runs of each loop, each a fresh process; medians, spreads, ratios."""
    if steps < 2 * log_every:
        raise SystemExit(f"--steps {steps} gives no window after the first (--log-every {log_every})")
    say = log or (lambda m: None)
    env = bench_env(threads, **({"CUDA_VISIBLE_DEVICES": ""} if device == "cpu" else {}))
    base = [PYTHON, str(Path(__file__).resolve()), "--steps", str(steps), "--per-device", str(per_device),
            "--accum", str(accum), "--log-every", str(log_every), "--device", device]  # fmt: skip
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in LOOPS}
    loads = [os.getloadavg()[0]]
    for r in range(repeats):
        for loop in LOOPS if r % 2 == 0 else LOOPS[::-1]:  # alternate who goes first
            got = run_json([*base, "--worker", loop], env=env)
            runs[loop].append(got)
            loads.append(os.getloadavg()[0])
            say(f"{TASK}: repeat {r + 1}/{repeats} {loop} ({JOB.name}): "
                f"{got['samples_per_s']:.1f} samples/s, {got['tokens_per_s']:,.0f} tokens/s, "
                f"{got['cpu_samples_per_s']:.1f} samples per CPU s, "
                f"data wait {got['data_wait_share']:.0%} (load {loads[-1]:.2f})")  # fmt: skip
    samples = {k: [g["samples_per_s"] for g in v] for k, v in runs.items()}
    tokens = {k: [g["tokens_per_s"] for g in v] for k, v in runs.items()}
    cpu = {k: [g["cpu_samples_per_s"] for g in v] for k, v in runs.items()}
    wait = {k: [g["data_wait_share"] for g in v] for k, v in runs.items()}
    wait_ms = {k: [g["data_wait_ms_per_step"] for g in v] for k, v in runs.items()}
    paired = [x / p for x, p in zip(samples["xtrain"], samples["plain"], strict=True)]
    paired_cpu = [x / p for x, p in zip(cpu["xtrain"], cpu["plain"], strict=True)]
    counted = {g["tokens_measured"] for v in runs.values() for g in v}
    return {
        "task": TASK,
        "job": JOB.name,
        "setup": {
            "repeats": repeats,
            "steps": steps,
            "per_device": per_device,
            "accum": accum,
            "log_every": log_every,
            "device": device,
            "threads": threads,
            "measured_steps": runs["xtrain"][0]["measured_steps"],
        },
        "samples_per_s": {k: Spread.of(v).to_dict() for k, v in samples.items()},
        "tokens_per_s": {k: Spread.of(v).to_dict() for k, v in tokens.items()},
        "ratio": statistics.median(samples["xtrain"]) / statistics.median(samples["plain"]),
        "paired_ratio": Spread.of(paired).to_dict(),
        "cpu_samples_per_s": {k: Spread.of(v).to_dict() for k, v in cpu.items()},
        "cpu_ratio": statistics.median(cpu["xtrain"]) / statistics.median(cpu["plain"]),
        "paired_cpu_ratio": Spread.of(paired_cpu).to_dict(),
        "data_wait_share": {k: Spread.of(v).to_dict() for k, v in wait.items()},
        "data_wait_ms_per_step": {k: Spread.of(v).to_dict() for k, v in wait_ms.items()},
        # the same batches in both loops: one token count over the measured windows, every run
        "same_tokens": len(counted) == 1,
        "tokens_per_sample": next(iter(counted)) / (runs["xtrain"][0]["measured_steps"] * per_device * accum),
        "load": Spread.of(loads).to_dict(),
        "runs": {k: [{m: g[m] for m in KEPT} for g in v] for k, v in runs.items()},
    }


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", choices=LOOPS)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--per-device", type=int, default=8)
    p.add_argument("--accum", type=int, default=2)
    p.add_argument("--log-every", type=int, default=10, help="window length (steps); the first is warm-up")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--threads", type=int, default=1, help="compute threads per run (0: torch's default)")
    p.add_argument("--json", action="store_true")
    return p.parse_args(argv)


def main() -> None:
    a = parse()
    if a.worker:
        worker(a)
        return
    result = measure(a.repeats, a.steps, a.per_device, a.accum, a.log_every, a.device, a.threads or None,
                     log=lambda m: print(m, file=sys.stderr))  # fmt: skip
    result["machine"] = machine()
    if a.json:
        print(json.dumps(result, indent=1))
        return
    print(f"{TASK} ({JOB.name})")
    for label, key in (("hand-written loop", "plain"), ("xtrain loop", "xtrain")):
        sps = Spread(**_spread(result["samples_per_s"][key]))
        tps = Spread(**_spread(result["tokens_per_s"][key]))
        wait = Spread(**_spread(result["data_wait_share"][key]))
        print(f"{label + ':':19}{sps.show('{:.1f}', ' samples/s')}, {tps.show('{:,.0f}', ' tokens/s')}, "
              f"data wait {wait.show('{:.0%}')} of step time")  # fmt: skip
    s = result["setup"]
    print(
        f"ratio xtrain/plain: {result['ratio']:.3f} of medians, paired "
        f"{Spread(**_spread(result['paired_ratio'])).show('{:.3f}')}; {s['device']}, global batch "
        f"{s['per_device']}x{s['accum']}, {s['measured_steps']} of {s['steps']} steps measured, "
        f"{result['tokens_per_sample']:.1f} tokens/sample (non-padding, image tokens included), "
        f"same batches: {result['same_tokens']}, load {Spread(**_spread(result['load'])).show()}"
    )
    by_cpu = {k: Spread(**_spread(v)).show("{:.1f}") for k, v in result["cpu_samples_per_s"].items()}
    print(
        f"by CPU time: hand-written {by_cpu['plain']}, xtrain {by_cpu['xtrain']} samples per CPU s; "
        f"ratio {result['cpu_ratio']:.3f}, "
        f"paired {Spread(**_spread(result['paired_cpu_ratio'])).show('{:.3f}')}"
    )


def _spread(d: dict[str, float]) -> dict[str, Any]:
    return {"median": d["median"], "low": d["min"], "high": d["max"], "n": int(d["n"])}


if __name__ == "__main__":
    main()
