"""Running ``xtrain bench``: one process, then every planned process, through the real launch
path, then the all-reduce bandwidth; ``run_bench`` fills a ``BenchResult``."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xtrain.bench.flops import find_peak, flops_per_token, mfu, peak_tflops, scaling
from xtrain.bench.job import job_config, prepare_job, write_config
from xtrain.bench.rates import figures, read_windows
from xtrain.bench.result import BenchResult, load_average, machine_info
from xtrain.bench.sizes import SIZES, ModelSize, pick_size
from xtrain.errors import XtrainError
from xtrain.launch.launcher import launch
from xtrain.launch.smoke import run_smoke
from xtrain.launch.worker_errors import WorkerFailed
from xtrain.planning.resolve import resolve

if TYPE_CHECKING:
    from xtrain.machine.facts import Facts
    from xtrain.planning.plan import Plan


@contextlib.contextmanager
def output_to(log_file: Path) -> Iterator[None]:
    """Send this process's stdout/stderr file descriptors (so also every child's) to a file for
    a block: training progress bars stay out of the bench's own output (and out of --json)."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(log_file, "ab") as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.replace("\r", "\n").splitlines()[-lines:])


def run_training(plan: Plan, config_path: Path, output_dir: Path, log_file: Path) -> dict[str, Any]:
    """``python -m xtrain.run --config C`` on every process of ``plan``, through
    ``xtrain.launch.launcher.launch`` (the path `xtrain train` takes). Returns train_result.json, plus
    ``wall_s`` and the logging windows."""
    start = time.perf_counter()
    try:
        with output_to(log_file):
            launch("xtrain.run", ["--config", str(config_path)], plan)
    except WorkerFailed as e:
        last = _tail(log_file, 1).strip()
        raise XtrainError(
            f"the bench training with {plan.world_size} process(es) failed: {e.one_line()}"
            + (f"; last output line: {last}" if last else ""),
            f"its whole output is in {log_file}",
        ) from None
    wall = time.perf_counter() - start
    result = json.loads((output_dir / "train_result.json").read_text(encoding="utf-8"))
    result["wall_s"] = wall
    result["windows"] = read_windows(output_dir)
    return result


@dataclass
class BenchOptions:
    size: str = "auto"  # auto | tiny | small | base
    steps: int | None = None  # None: the size's default
    processes: int | None = None  # None: the plan's
    full: bool = False  # full fine-tuning instead of LoRA
    precision: str | None = None  # None: the plan's
    lora_r: int = 16
    per_device: int | None = None
    smoke: bool = True  # measure the all-reduce bandwidth of the chosen backend
    work_dir: Path | None = None  # None: a temporary folder, removed afterwards
    platform: str | None = None  # tests/support: plan for another OS


DEFAULT_STEPS = {"tiny": 30, "small": 40, "base": 40}


def plan_for(facts: Facts, processes: int | None, precision: str | None, platform: str | None) -> Plan:
    return resolve(facts=facts, processes=processes, precision=precision, platform=platform).plan


def run_bench(
    facts: Facts, options: BenchOptions, progress: Callable[[str], None] | None = None
) -> BenchResult:
    """Measure one process, then every planned process, and the all-reduce bandwidth."""
    tell = progress or (lambda message: None)
    plan_n = plan_for(facts, options.processes, options.precision, options.platform)
    plan_1 = plan_for(facts, 1, options.precision, options.platform)
    n = plan_n.world_size
    gpu = None
    if plan_n.device == "cuda":
        gpu = next((g for g in facts.gpus if not plan_n.gpu_ids or g.index in plan_n.gpu_ids), None)
    size_name = options.size
    if size_name == "auto":
        size_name = pick_size(plan_n.device, gpu.memory_mib if gpu else None)
    if size_name not in SIZES:
        raise XtrainError(f"--model-size {size_name!r} is unknown", f"use auto or one of {', '.join(SIZES)}")
    size = SIZES[size_name]
    if options.per_device:
        size = ModelSize(**{**asdict(size), "per_device": options.per_device})
    steps = options.steps or DEFAULT_STEPS[size_name]
    if steps < 2:
        raise XtrainError(f"--steps must be at least 2, got {steps}", "e.g. --steps 20")
    global_batch = size.per_device * n
    precision = options.precision or plan_n.mixed_precision
    total, embedding, trainable = size.param_counts(None if options.full else options.lora_r)
    fpt = flops_per_token(total, embedding, trainable)
    peak = find_peak(gpu.name) if gpu else None
    peak_value = peak_tflops(gpu.name, precision, plan_n.tf32) if gpu else None

    result = BenchResult(
        size=size_name,
        model={
            "layers": size.layers,
            "hidden": size.hidden,
            "heads": size.heads,
            "vocab": size.vocab,
            "seq_len": size.seq_len,
            "per_device": size.per_device,
            "global_batch": global_batch,
            "params": total,
            "trainable": trainable,
            "flops_per_token": fpt,
            "flops_formula": "4*N + 2*N_trainable (N: parameters but the input embedding)",
        },
        mode="full" if options.full else "lora",
        device=plan_n.device,
        gpu=gpu.name if gpu else None,
        precision=precision,
        tf32=plan_n.tf32,
        launcher=plan_n.launcher if n > 1 else "none (one process)",
        peak_tflops=peak_value,
        peak_name=peak.name if peak and peak_value else None,
        peak_source=peak.source if peak and peak_value else None,
        machine=machine_info(facts),
    )
    load = load_average()
    if load is not None and load > 0.5 * (os.cpu_count() or 1):
        result.notes.append(
            f"the machine was busy before the bench (load average {load:.1f} on {os.cpu_count()} CPUs): "
            "other work competes for the cores, so the rates and the scaling are not reliable"
        )
    if plan_n.device == "cuda" and peak_value is None:
        result.notes.append(
            f"no peak FLOP/s known for {gpu.name if gpu else 'this GPU'} in {precision}: MFU unknown"
        )

    keep = options.work_dir is not None
    root = Path(options.work_dir) if keep else Path(tempfile.mkdtemp(prefix="xtrain-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        _measure(result, options, root, size, steps, (plan_1, plan_n), tell)
    except XtrainError:
        keep = True  # the logs named in the message stay
        raise
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
    return result


def _measure(
    result: BenchResult,
    options: BenchOptions,
    root: Path,
    size: ModelSize,
    steps: int,
    plans: tuple[Plan, Plan],
    tell: Callable[[str], None],
) -> None:
    """The runs of ``run_bench`` (filling ``result``), in the work folder ``root``."""
    plan_1, plan_n = plans
    n = plan_n.world_size
    total, global_batch = result.model["params"], result.model["global_batch"]
    log_every = max(1, steps // 8)  # ~8 windows: the first (warm-up) is left out of the rates
    tell(f"building a {size.name} llama-style model ({total / 1e6:.1f}M parameters) and its data")
    with output_to(root / "prepare.log"):  # save_pretrained's progress bars
        job = prepare_job(root, size, n)
    counts = [1] if n == 1 else [1, n]
    for count, plan in zip(counts, [plan_1, plan_n], strict=False):
        out = root / f"run-{count}p"
        if out.exists():
            shutil.rmtree(out)
        cfg = job_config(job, out, global_batch, steps, log_every, options.full, options.precision,
                         options.lora_r)  # fmt: skip
        path = write_config(root / f"bench-{count}p.yaml", cfg)
        tell(f"training {steps} steps with {count} process{'es' if count > 1 else ''}")
        run = figures(run_training(plan, path, out, root / f"run-{count}p.log"), count, steps)
        if plan.device == "cuda":
            run.mfu = mfu(run.tokens_per_s, result.model["flops_per_token"], count, result.peak_tflops)
        result.runs.append(run)
        if run.rate_source == "session":
            result.notes.append(
                f"{count}p: no logging windows to read; the rate includes the first steps' warm-up"
            )
    if n > 1:
        result.speedup, result.efficiency = scaling(
            result.runs[0].samples_per_s, result.runs[-1].samples_per_s, n
        )
        if options.smoke:
            tell(f"timing an all-reduce over {n} processes ({plan_n.backend})")
            with output_to(root / "smoke.log"):
                smoke = run_smoke(plan_n)
            result.allreduce = {
                "ok": smoke.ok,
                "backend": smoke.backend,
                "size_mib": smoke.size_mib,
                "busbw_gbps": smoke.busbw_gbps,
                "algbw_gbps": smoke.algbw_gbps,
                "cpu_staged": smoke.cpu_staged,
                "error": smoke.error,
            }
