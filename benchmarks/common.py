"""Shared pieces of the benchmark harness: the machine record, robust statistics, subprocess
runs that return JSON, and markdown tables.

The harness runs on shared machines (CI-sized, 2 cores, other jobs running), so every benchmark
interleaves its variants (A, B, C, A, B, C, ...) and reports medians with the spread (min-max)
and the number of repeats. Every subprocess gets one compute thread unless a benchmark says
otherwise: on a busy 2-core machine two OpenMP threads per process collapse (measured: 3-60x
slower steps when other processes take a core), which would drown every other effect.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

PYTHON = sys.executable
MARK = "BENCH_RESULT "


def bench_env(threads: int | None = 1, **extra: str) -> dict[str, str]:
    """The environment for a benchmark subprocess: offline, quiet, ``threads`` compute threads
    (None: torch's default, all cores)."""
    env = dict(os.environ)
    env.update(
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TRANSFORMERS_VERBOSITY="error",
        TOKENIZERS_PARALLELISM="false",
        PYTHONWARNINGS="ignore",
    )
    if threads is not None:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    else:
        env.pop("OMP_NUM_THREADS", None)
        env.pop("MKL_NUM_THREADS", None)
    env.update(extra)
    return env


def set_threads_from_env() -> None:
    """Inside a worker: make torch follow OMP_NUM_THREADS (it does at start-up, but be explicit)."""
    import torch

    n = os.environ.get("OMP_NUM_THREADS")
    if n:
        torch.set_num_threads(int(n))


def run_json(cmd: list[str], env: dict[str, str] | None = None, timeout: float = 900) -> dict[str, Any]:
    """Run a worker that reports with ``emit``; return its result."""
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=REPO)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(MARK)]
    if not lines:
        raise RuntimeError(
            f"no result from {' '.join(cmd[:4])}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        )
    return json.loads(lines[-1][len(MARK) :])


def emit(result: dict[str, Any]) -> None:
    """A worker's result: one marked JSON line on stdout (libraries print their own lines too)."""
    print(MARK + json.dumps(result), flush=True)


def wall(cmd: list[str], env: dict[str, str] | None = None, timeout: float = 900) -> float:
    """Wall time of one command (must succeed)."""
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=REPO)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return elapsed


@dataclass
class Spread:
    """Median, min, max and count of repeated measurements."""

    median: float
    low: float
    high: float
    n: int

    @classmethod
    def of(cls, values: list[float]) -> Spread:
        return cls(statistics.median(values), min(values), max(values), len(values))

    def show(self, fmt: str = "{:.2f}", unit: str = "") -> str:
        m, lo, hi = (fmt.format(v) for v in (self.median, self.low, self.high))
        return f"{m}{unit} ({lo}-{hi}, n={self.n})"

    def to_dict(self) -> dict[str, float]:
        return {"median": self.median, "min": self.low, "max": self.high, "n": self.n}


def steady_rate(times: list[float], warmup: int) -> float:
    """Steps/s from per-step timestamps: 1 / the median step time after ``warmup`` steps (robust
    against another process taking the CPU for a moment)."""
    steps = [b - a for a, b in zip(times[warmup:], times[warmup + 1 :], strict=False)]
    return 1.0 / statistics.median(steps)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO
        )
        return out.stdout.strip() or None
    except OSError:
        return None


def machine() -> dict[str, Any]:
    """The machine and versions a result was measured with."""
    from importlib.metadata import PackageNotFoundError, version

    info: dict[str, Any] = {
        "os": f"{platform.system()} {platform.release()}",
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "commit": git_commit(),
    }
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        info["memory_gib"] = round(pages * size / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        pass
    for pkg in ("torch", "accelerate", "transformers", "peft", "datasets"):
        try:
            info[pkg] = version(pkg)
        except PackageNotFoundError:
            info[pkg] = None
    try:
        import torch

        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except Exception:
        info["gpus"] = []
    return info


def table(headers: list[str], rows: list[list[str]]) -> str:
    """A markdown table."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def time_to_first_step(cmd: list[str], output_dir: Path, env: dict[str, str], timeout: float = 900) -> float:
    """Seconds from starting ``cmd`` (an xtrain training with run.log_every=1) to the end of its
    first optimizer step, as the loop's first logging window in train_result.json records it."""
    from xtrain.bench.rates import read_windows

    t0 = time.time()  # the window's time is time.time() in the training process
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=REPO)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:6])} ... failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    windows = read_windows(output_dir)
    if not windows:
        raise RuntimeError(f"no logging windows in {output_dir / 'train_result.json'}")
    return windows[0].wall_time - t0


def write_yaml(path: Path, data: dict[str, Any]) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def model_size(name: str) -> Any:
    """A bench model size: xtrain.bench's sizes plus ``micro`` (1 layer x 32, 16-token rows),
    where a step is so cheap that a loop's own per-step overhead shows."""
    from xtrain.bench.sizes import SIZES, ModelSize

    if name == "micro":
        return ModelSize("micro", hidden=32, layers=1, heads=2, intermediate=64, vocab=1000, seq_len=16,
                         per_device=2)  # fmt: skip
    return SIZES[name]


# -- task benchmarks: a quickstart job through xtrain's loop and through a hand-written one -------------
def task_config(job: Path, per_device: int, accum: int, steps: int, log_every: int = 10) -> Any:
    """A quickstart job (``xtrain/builtin/jobs/quickstart-*.yaml``) as a timing run: ``per_device`` x
    ``accum`` on one process, ``steps`` optimizer steps, no evaluation, no TensorBoard, no
    checkpoints before the end."""
    from xtrain.tasks.validation import load_config

    cfg = load_config(job, [f"batch.per_device={per_device}", f"batch.global_batch={per_device * accum}"])
    cfg.run.max_steps = steps
    cfg.run.log_every = log_every
    cfg.run.tensorboard = False
    cfg.run.eval_at_start = False
    cfg.run.eval_every = None
    cfg.run.save_every = None
    cfg.data.eval = None
    return cfg


def hand_written_loop(
    model: Any,
    batches: Any,
    *,
    steps: int,
    accum: int,
    optimizer: Any,
    scheduler: Any,
    max_grad_norm: float | None,
    device: Any = None,
    precision: str = "no",
    log_every: int | None = None,
    cpu_times: list[float] | None = None,
) -> list[float]:
    """The floor: micro-batches, accumulation, clipping, optimizer and schedule, nothing else.
    ``device``: move each batch there (None: leave it where the collator made it); ``precision``:
    autocast (bf16/fp16, fp16 with a GradScaler); ``log_every``: one host sync (the loss) every
    that many steps, as a loop that logs must. Returns ``time.perf_counter()`` before the first
    step and after each optimizer step (after its sync); ``cpu_times`` gets the process's CPU time
    at the same points."""
    import torch

    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    kind = device.type if device is not None else "cpu"
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    scaler = torch.amp.GradScaler(kind, enabled=precision == "fp16")
    loss_sum = None
    times = [time.perf_counter()]
    if cpu_times is not None:
        cpu_times.append(time.process_time())
    for step in range(steps):
        for _ in range(accum):
            batch = next(batches)
            if device is not None:
                batch = {k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v
                         for k, v in batch.items()}  # fmt: skip
            with torch.autocast(kind, dtype=dtype, enabled=dtype is not None):
                loss = model(**batch).loss
            scaler.scale(loss / accum).backward()
            if log_every:  # summed on the device: no sync until the log
                loss_sum = loss.detach() if loss_sum is None else loss_sum + loss.detach()
        if max_grad_norm:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        scaler.step(optimizer)
        scaler.update()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if log_every and ((step + 1) % log_every == 0 or step + 1 == steps):
            _ = float(loss_sum)  # the logging sync
            loss_sum = None
        times.append(time.perf_counter())
        if cpu_times is not None:
            cpu_times.append(time.process_time())
    return times


def build_alone(cfg: Any, plan: Any = None) -> Any:
    """A task's workload for ``cfg`` in this process alone (``xtrain.tasks.build_workload`` with
    the one-process ``Run`` of ``plan``, default: a CPU plan), outside a training run."""
    import torch

    from xtrain import tasks
    from xtrain.machine.facts import Facts
    from xtrain.planning.context import LaunchContext
    from xtrain.planning.rules import make_plan
    from xtrain.planning.run import for_process

    plan = plan or make_plan(Facts(torch_version=torch.__version__, gloo_available=True))
    return tasks.build_workload(for_process(cfg, LaunchContext(), plan=plan))


def half_prompt_batch(seq: int, vocab: int, device: str) -> dict[str, Any]:
    """One sequence of ``seq`` random tokens below ``vocab``, its first half a prompt (labels -100):
    the memory levers' benchmarks (chunked_loss.py, levers_estimate.py)."""
    import torch

    ids = torch.randint(0, vocab, (1, seq), generator=torch.Generator().manual_seed(1))
    labels = ids.clone()
    labels[:, : seq // 2] = -100  # the prompt
    mask = torch.ones_like(ids)
    return {"input_ids": ids.to(device), "attention_mask": mask.to(device), "labels": labels.to(device)}
