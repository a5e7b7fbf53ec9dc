"""`xtrain bench`: how fast does training run here, and how well does it scale?

A short LoRA (or full) fine-tune of a llama-style causal LM built from a config, sized for the
device (``pick_size``), run through the real launch path (``xtrain.launch.launcher.launch`` of
``python -m xtrain.run --config C``, exactly what ``xtrain train`` does) first with one process,
then with every planned process. The global batch stays the same in both runs (``per_device x
processes``; the one-process run accumulates), as it does when a user adds GPUs to an xtrain job.

Rates come from the loop itself: it records every logging window (steps, seconds, samples,
tokens) in ``train_result.json``. The first window (first CUDA kernels, allocator warm-up, DDP's
first bucket pass) is left out, so the figures are the steady state a long run sees; start-up
(imports, model, data) is never in them. Without windows the loop's whole-session rate from
``train_result.json`` is used instead, and the result says so.

Pure pieces, tested without training: ``scaling`` (speedup, efficiency), ``flops_per_token``,
``peak_tflops`` (the peak table), ``mfu``, ``pick_size``, ``steady_rates``. Library code: no
printing; ``xtrain/commands/bench.py`` renders.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform as _platform
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from xtrain.errors import XtrainError

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]


# -- model sizes ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelSize:
    """A llama-style decoder built from a ``LlamaConfig`` (random weights) and its bench batch."""

    name: str
    hidden: int
    layers: int
    heads: int
    intermediate: int
    vocab: int
    seq_len: int
    per_device: int

    def param_counts(self, lora_r: int | None) -> tuple[int, int, int]:
        """(all parameters, input-embedding parameters, trainable parameters) of this model
        with LoRA rank ``lora_r`` on q/k/v/o, or fully trained when ``lora_r`` is None.
        (Untied embeddings, no biases, RMSNorm weights: as ``LlamaForCausalLM`` builds it.)"""
        h, i, v = self.hidden, self.intermediate, self.vocab
        per_layer = 4 * h * h + 3 * h * i + 2 * h  # attention, MLP, two norms
        base = self.layers * per_layer + h + 2 * v * h  # + final norm, embedding, lm_head
        if lora_r is None:
            return base, v * h, base
        adapters = self.layers * 4 * lora_r * (h + h)  # A (r x in) + B (out x r) per projection
        return base + adapters, v * h, adapters


SIZES: dict[str, ModelSize] = {
    # CPU and small devices: a few ms to tens of ms per step.
    "tiny": ModelSize("tiny", hidden=128, layers=4, heads=4, intermediate=352, vocab=1000, seq_len=128,
                      per_device=8),
    # GPUs with less than 12 GiB.
    "small": ModelSize("small", hidden=512, layers=8, heads=8, intermediate=1408, vocab=16000,
                       seq_len=512, per_device=8),
    # Bigger GPUs: ~110M parameters, 1024-token sequences.
    "base": ModelSize("base", hidden=768, layers=12, heads=12, intermediate=2048, vocab=16000,
                      seq_len=1024, per_device=8),
}  # fmt: skip
SMALL_GPU_MIB = 12 * 1024


def pick_size(device: str, gpu_memory_mib: int | None) -> str:
    """The size that fills the device without running out of memory: ``tiny`` without CUDA,
    ``small`` on a GPU under 12 GiB, ``base`` (~110M parameters) above."""
    if device != "cuda":
        return "tiny"
    if gpu_memory_mib is not None and gpu_memory_mib < SMALL_GPU_MIB:
        return "small"
    return "base"


# -- FLOPs and the peak table -------------------------------------------------------------------------
def flops_per_token(total_params: int, embedding_params: int, trainable_params: int) -> float:
    """Training FLOPs per token: ``4 N + 2 N_trainable``, N = parameters doing matmuls (all but the
    input embedding, which is a lookup): 2N forward, 2N backward through the activations, and 2 per
    trainable parameter for its weight gradient. Full fine-tuning gives the usual ``6 N``; LoRA
    about ``4 N``. Attention's sequence-length term is left out (as in the 6N rule)."""
    n = total_params - embedding_params
    return 4.0 * n + 2.0 * trainable_params


@dataclass(frozen=True)
class Peak:
    """Dense peak TFLOP/s of one GPU model (no sparsity)."""

    name: str
    bf16: float | None
    fp16: float | None
    tf32: float | None
    fp32: float
    source: str


_NVIDIA = "NVIDIA datasheet, dense (half the sparse figure)"
_GEFORCE = "NVIDIA Ada/Ampere GA102 whitepapers, dense tensor FLOPS with FP32 accumulate (what autocast runs)"
# GeForce cards run fp16/bf16 tensor math with FP32 accumulation at half their "FP16 accumulate"
# headline (RTX 4090: 165.2 vs 330.3 dense); autocast accumulates in FP32, so that is the peak. On
# Ada fp16 and bf16 run at the same rate. TF32 tensor math is a quarter of it, equal to the FP32
# (non-tensor) rate. (An earlier table used 82.6 for every dtype on the 4090: MFU read 2x high.)
# Ordered: the first pattern that matches the lower-cased device name wins.
PEAKS: list[tuple[str, Peak]] = [
    (r"gh200", Peak("GH200", 989.4, 989.4, 494.7, 66.9, _NVIDIA)),
    (r"h200", Peak("H200", 989.4, 989.4, 494.7, 66.9, _NVIDIA)),
    (r"h100.*nvl", Peak("H100 NVL", 835.5, 835.5, 417.5, 60.0, _NVIDIA)),
    (r"h100.*pcie", Peak("H100 PCIe", 756.5, 756.5, 378.0, 51.0, _NVIDIA)),
    (r"h100", Peak("H100 SXM", 989.4, 989.4, 494.7, 66.9, _NVIDIA)),
    (r"a100|a800", Peak("A100", 312.0, 312.0, 156.0, 19.5, _NVIDIA)),
    (r"l40s", Peak("L40S", 362.1, 362.1, 183.0, 91.6, _NVIDIA)),
    (r"\bl40\b", Peak("L40", 181.0, 181.0, 90.5, 90.5, _NVIDIA)),
    (r"\bl4\b", Peak("L4", 121.0, 121.0, 60.0, 30.3, _NVIDIA)),
    (r"\ba10\b", Peak("A10", 125.0, 125.0, 62.5, 31.2, _NVIDIA)),
    (r"rtx 6000 ada", Peak("RTX 6000 Ada", 364.2, 364.2, 182.1, 91.1, _NVIDIA)),
    (r"rtx a6000", Peak("RTX A6000", 154.8, 154.8, 77.4, 38.7, _NVIDIA)),
    (r"v100", Peak("V100", None, 125.0, None, 15.7, _NVIDIA)),
    (r"\bt4\b", Peak("T4", None, 65.0, None, 8.1, _NVIDIA)),
    (r"rtx 5090", Peak("RTX 5090", 209.5, 209.5, 104.8, 104.8, _GEFORCE)),
    (r"rtx 4090", Peak("RTX 4090", 165.2, 165.2, 82.6, 82.6, _GEFORCE)),
    (r"rtx 4080", Peak("RTX 4080", 97.5, 97.5, 48.7, 48.7, _GEFORCE)),
    (r"rtx 3090 ti", Peak("RTX 3090 Ti", 80.0, 80.0, 40.0, 40.0, _GEFORCE)),
    (r"rtx 3090", Peak("RTX 3090", 71.0, 71.0, 35.6, 35.6, _GEFORCE)),
    (r"rtx 3080", Peak("RTX 3080", 59.5, 59.5, 29.8, 29.8, _GEFORCE)),
]


def find_peak(gpu_name: str | None) -> Peak | None:
    """The table entry for a device name as torch reports it (e.g. "NVIDIA GeForce RTX 4090"),
    or None ("unknown")."""
    if not gpu_name:
        return None
    name = gpu_name.lower()
    return next((peak for pattern, peak in PEAKS if re.search(pattern, name)), None)


def peak_tflops(gpu_name: str | None, precision: str, tf32: bool = False) -> float | None:
    """Dense peak TFLOP/s for the precision the run computes in (bf16, fp16; ``no`` means TF32
    matmuls when enabled, else FP32), or None when the GPU or the dtype is not in the table."""
    peak = find_peak(gpu_name)
    if peak is None:
        return None
    if precision == "bf16":
        return peak.bf16
    if precision == "fp16":
        return peak.fp16
    return peak.tf32 if tf32 and peak.tf32 else peak.fp32


def mfu(tokens_per_s: float, flops_per_tok: float, processes: int, peak: float | None) -> float | None:
    """Model FLOPs utilisation of one device: achieved FLOP/s per process over its peak."""
    if not peak or processes < 1 or tokens_per_s <= 0:
        return None
    return tokens_per_s * flops_per_tok / processes / (peak * 1e12)


def scaling(rate_one: float, rate_n: float, processes: int) -> tuple[float | None, float | None]:
    """(speedup, scaling efficiency) of ``processes`` processes over one: speedup = rate_n /
    rate_one, efficiency = speedup / processes (1.0 is perfect)."""
    if rate_one <= 0 or processes < 1:
        return None, None
    speedup = rate_n / rate_one
    return speedup, speedup / processes


# -- reading the loop's rates -------------------------------------------------------------------------
@dataclass
class Window:
    """One logging window of the loop: optimizer steps ``(first, last]``, its rates."""

    last_step: int
    steps: int
    samples_per_s: float
    tokens_per_s: float
    wall_time: float = 0.0  # when the loop logged it (time.time() of the logging process)


def steady_rates(windows: list[Window], global_batch: int, skip: int = 1) -> tuple[float, float, int]:
    """(samples/s, tokens/s, steps measured) over the windows after the first ``skip``: total
    samples (tokens) over total time, each window's time being its samples / its rate."""
    use = [w for w in windows[skip:] if w.samples_per_s > 0]
    if not use:
        return 0.0, 0.0, 0
    seconds = sum(w.steps * global_batch / w.samples_per_s for w in use)
    samples = sum(w.steps * global_batch for w in use)
    tokens = sum(w.tokens_per_s * w.steps * global_batch / w.samples_per_s for w in use)
    return samples / seconds, tokens / seconds, sum(w.steps for w in use)


def read_windows(output_dir: Path) -> list[Window]:
    """The loop's logging windows, as it recorded them in ``train_result.json`` (empty when
    there is none)."""
    path = output_dir / "train_result.json"
    if not path.is_file():
        return []
    recorded = json.loads(path.read_text(encoding="utf-8")).get("windows") or []
    return [
        Window(
            int(w["step"]),
            int(w["steps"]),
            w["samples"] / w["seconds"] if w["seconds"] > 0 else 0.0,
            w["tokens"] / w["seconds"] if w["seconds"] > 0 else 0.0,
            float(w["time"]),
        )
        for w in recorded
    ]


# -- results --------------------------------------------------------------------------------------------
@dataclass
class RunFigures:
    """One training run of the bench."""

    processes: int
    samples_per_s: float  # steady state (windows after the first)
    tokens_per_s: float
    steps: int
    measured_steps: int
    global_batch: int
    accumulation: int
    rate_source: str  # "windows" (steady state) | "session" (the loop's whole-session rate)
    session_samples_per_s: float  # the loop's own figure over every optimizer step
    session_tokens_per_s: float
    wall_s: float  # the whole run: start-up, training, final save
    backend: str | None = None
    mfu: float | None = None


@dataclass
class BenchResult:
    """What `xtrain bench` measured (``--json`` prints ``to_dict()``)."""

    size: str
    model: dict[str, Any]  # layers, hidden, seq_len, params, trainable, flops_per_token, ...
    mode: str  # lora | full
    device: str
    gpu: str | None
    precision: str
    tf32: bool
    launcher: str
    runs: list[RunFigures] = field(default_factory=list)
    speedup: float | None = None
    efficiency: float | None = None
    allreduce: dict[str, Any] | None = None  # from xtrain.launch.smoke (busbw_gbps, algbw_gbps, ...)
    peak_tflops: float | None = None
    peak_name: str | None = None  # the table entry used; None: "unknown"
    peak_source: str | None = None
    machine: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def machine_info(facts: Any) -> dict[str, Any]:
    """Machine and versions, for the record."""
    import torch

    info: dict[str, Any] = {
        "os": f"{_platform.system()} {_platform.release()}",
        "os_kind": facts.os_kind,
        "python": _platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cpu": _platform.processor() or _platform.machine(),
        "cpu_count": os.cpu_count(),
        "gpus": [g.name for g in facts.gpus],
        "load_average": _load_average(),
    }
    for pkg in ("accelerate", "transformers", "peft", "datasets"):
        info[pkg] = (facts.packages or {}).get(pkg) or _version(pkg)
    return info


def _load_average() -> float | None:
    """The 1-minute load average (None where the OS has none, e.g. Windows)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def _version(pkg: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(pkg)
    except PackageNotFoundError:
        return None


# -- the job on disk ------------------------------------------------------------------------------------
def write_model(size: ModelSize, folder: Path) -> int:
    """A randomly initialised llama-style model of ``size`` plus xtrain's built-in tokenizer,
    saved where ``from_pretrained`` loads it. Returns the vocabulary size used."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from xtrain.builtin import build_tokenizer

    tokenizer = build_tokenizer("llama")
    vocab = max(size.vocab, len(tokenizer))
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=size.hidden,
        intermediate_size=size.intermediate,
        num_hidden_layers=size.layers,
        num_attention_heads=size.heads,
        num_key_value_heads=size.heads,
        max_position_embeddings=max(2048, size.seq_len),
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return vocab


def write_stories(path: Path, blocks: int, seq_len: int) -> None:
    """Enough built-in tiny stories (~60 tokens each) to pack into ``blocks`` blocks of ``seq_len``."""
    from xtrain.builtin import story_examples

    n = max(64, math.ceil(blocks * seq_len / 50))
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for row in story_examples(n, seed=11):
            f.write(json.dumps(row) + "\n")


@dataclass
class Job:
    """A bench job on disk: model folder, data file and the config for one process count."""

    root: Path
    size: ModelSize
    model_dir: Path
    data_file: Path
    vocab: int


def prepare_job(root: Path, size: ModelSize, max_processes: int) -> Job:
    model_dir, data_file = root / "model", root / "train.jsonl"
    vocab = write_model(size, model_dir)
    write_stories(data_file, blocks=max(64, 4 * size.per_device * max_processes), seq_len=size.seq_len)
    return Job(root, size, model_dir, data_file, vocab)


def job_config(
    job: Job,
    output_dir: Path,
    global_batch: int,
    steps: int,
    log_every: int,
    full: bool,
    precision: str | None,
    lora_r: int,
    packing: bool = True,
) -> dict[str, Any]:
    """The train config of one bench run (plain data; ``write_config`` saves it)."""
    return {
        "model": {"name_or_path": str(job.model_dir), "task": "causal-lm"},
        "lora": {
            "enabled": not full,
            "r": lora_r,
            "alpha": 2 * lora_r,
            "dropout": 0.0,
            "target_modules": LORA_TARGETS,
        },
        "data": {"train": str(job.data_file), "max_length": job.size.seq_len, "packing": packing},
        "optim": {"lr": 1e-4, "warmup_steps": 0},
        "batch": {"per_device": job.size.per_device, "global_batch": global_batch},
        "run": {
            "output_dir": str(output_dir),
            "max_steps": steps,
            "log_every": log_every,
            "resume": "off",
            "tensorboard": False,  # the rates come from train_result.json's windows
            "keep_checkpoints": 1,
            "mixed_precision": precision or "auto",
            "seed": 0,
        },
    }


def write_config(path: Path, config: dict[str, Any]) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


# -- running ----------------------------------------------------------------------------------------------
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


def run_training(plan: Any, config_path: Path, output_dir: Path, log_file: Path) -> dict[str, Any]:
    """``python -m xtrain.run --config C`` on every process of ``plan``, through
    ``xtrain.launch.launcher.launch`` (the path `xtrain train` takes). Returns train_result.json, plus
    ``wall_s`` and the logging windows."""
    from xtrain.launch.launcher import WorkerFailed, launch

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


def figures(result: dict[str, Any], processes: int, steps: int) -> RunFigures:
    """RunFigures from one run's train_result (+ windows): steady rates when there are at least
    two windows, else the whole-session rates."""
    gb = int(result["global_batch"])
    windows: list[Window] = result.get("windows") or []
    samples, tokens, measured = steady_rates(windows, gb) if len(windows) >= 2 else (0.0, 0.0, 0)
    source = "windows"
    if measured == 0:
        samples, tokens, measured, source = result["samples_per_s"], result["tokens_per_s"], steps, "session"
    return RunFigures(
        processes=processes,
        samples_per_s=samples,
        tokens_per_s=tokens,
        steps=steps,
        measured_steps=measured,
        global_batch=gb,
        accumulation=int(result["accumulation"]),
        rate_source=source,
        session_samples_per_s=float(result["samples_per_s"]),
        session_tokens_per_s=float(result["tokens_per_s"]),
        wall_s=float(result.get("wall_s", 0.0)),
        backend=(result.get("run_info") or {}).get("backend"),
    )


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


def plan_for(facts: Any, processes: int | None, precision: str | None, platform: str | None) -> Any:
    from xtrain.planning.resolve import machine_plan

    return machine_plan(facts=facts, processes=processes, precision=precision, platform=platform)


def run_bench(
    facts: Any, options: BenchOptions, progress: Callable[[str], None] | None = None
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
    load = _load_average()
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
    plans: tuple[Any, Any],
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
            from xtrain.launch.smoke import run_smoke

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
