"""16-bit LoRA vs 4-bit LoRA (QLoRA) on the same model: tokens/s, xtrain's memory estimate, and
on a CUDA GPU the peak memory (``torch.cuda.max_memory_allocated``) against that estimate.

The model: a llama-shaped one built from a ``LlamaConfig`` (``--size``: ``small``, 17M parameters,
for the CPU; ``gpu``, TinyLlama-1.1B's shape; ``micro`` for the smoke run), random weights and
xtrain's built-in tokenizer saved once (``xtrain.bench.job.write_model``) as the checkpoint every
variant loads. Two ways to train it: plain transformers + peft + bitsandbytes with the
hand-written loop (the floor), and xtrain itself (``xtrain.run`` through the launcher ``xtrain
train`` uses, which runs a one-process CPU plan in this process; ``model.quantization: null`` /
``4bit``, packed tiny stories of the same length; tokens/s from the loop's logging windows after
the first, and on a GPU the loop's own estimate and peak memory from ``train_result.json``). The
hand-written variants:

- ``16-bit``: the checkpoint loaded unquantized: float32 on the CPU (xtrain's ``model.dtype: auto``
  there), bfloat16 on a GPU;
- ``4-bit``: ``BitsAndBytesConfig`` NF4 with double quantization, compute in float32 on the CPU and
  bfloat16 on a GPU, then peft's ``prepare_model_for_kbit_training`` (the rest in float32), as
  xtrain's ``model.quantization: 4bit`` loads it;

then the same peft LoRA (r=16 on q/k/v/o, xtrain's ``auto`` for llama), AdamW, a micro-batch of
random tokens, ``benchmarks/common.py``'s hand-written loop (bf16 autocast on a GPU). Each run is
a fresh process, the variants alternate ``--repeats`` times; tokens/s is the median step after
``--warmup`` steps. The estimates: the plan's (``xtrain train --dry-run``: the config on the meta
device, ``model_size.offline_sizes``) and the loaded model's (``model_size.live_sizes``, what the
training loop checks on a GPU), both ``memory.check_memory`` without gradient checkpointing.

    python benchmarks/quantization.py [--repeats 3] [--steps 12] [--json]
    python benchmarks/quantization.py --device cuda --size gpu        # on a CUDA machine
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402  # noqa: E402
    PYTHON,
    Spread,
    bench_env,
    emit,
    hand_written_loop,
    machine,
    run_json,
    set_threads_from_env,
    steady_rate,
)

HERE = Path(__file__).resolve()
VARIANTS = ("16-bit", "4-bit")  # the hand-written loop
XTRAIN = ("xtrain 16-bit", "xtrain 4-bit")  # python -m xtrain.run, model.quantization null / 4bit
# (hidden, layers, intermediate, heads, vocab, per-device batch, tokens a sequence)
SIZES = {
    "micro": (64, 2, 176, 4, 1024, 2, 32),
    "small": (384, 6, 1024, 6, 8192, 2, 128),
    "gpu": (2048, 22, 5632, 32, 32000, 4, 1024),  # TinyLlama-1.1B's shape
}
LORA_R = 16
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]


def model_size(size: str) -> Any:
    """``SIZES[size]`` as the bench job's ``ModelSize``."""
    from xtrain.bench.sizes import ModelSize

    hidden, layers, intermediate, heads, vocab, per_device, seq = SIZES[size]
    return ModelSize(size, hidden=hidden, layers=layers, heads=heads, intermediate=intermediate, vocab=vocab,
                     seq_len=seq, per_device=per_device)  # fmt: skip


def build_checkpoint(root: Path, size: str) -> Any:
    """The bench job on disk (``xtrain.bench.job``): the random llama-shaped model with xtrain's
    built-in tokenizer, and tiny stories to pack for xtrain's runs. Returns the ``Job``."""
    from xtrain.bench.job import prepare_job

    return prepare_job(root, model_size(size), 1)


def xtrain_run(job: Any, variant: str, device: str, steps: int, warmup: int, out: Path) -> dict[str, Any]:
    """One ``python -m xtrain.run`` of the job (the launcher ``xtrain train`` uses), LoRA r=16 on
    q/k/v/o, ``model.quantization`` null or 4bit: tokens/s from the loop's windows (the first left
    out), and on a GPU the loop's estimate and peak memory."""
    from xtrain.bench.job import job_config, write_config
    from xtrain.bench.rates import figures
    from xtrain.bench.runner import plan_for, run_training
    from xtrain.machine import probe

    size = job.size
    log_every = max(1, (steps - warmup) // 4) if steps > warmup + 1 else 1
    cfg = job_config(job, out, size.per_device, steps, log_every, False, None, LORA_R, packing="concatenate")
    cfg["model"]["quantization"] = "4bit" if variant.endswith("4-bit") else None
    plan = plan_for(probe.collect(quick=True), 1, None, None)
    if device == "cpu" and plan.device != "cpu":
        raise RuntimeError("--device cpu on a GPU machine: xtrain's runs would use the GPU")
    path = write_config(out.with_suffix(".yaml"), cfg)
    result = run_training(plan, path, out, out.with_suffix(".log"))
    info = result.get("run_info") or {}
    run: dict[str, Any] = {"variant": variant, "tokens_per_s": figures(result, 1, steps).tokens_per_s}
    if info.get("peak_mem_mib") is not None:
        run["peak_gib"] = info["peak_mem_mib"] / 1024
        run["loop_estimate_gib"] = info.get("memory_estimate_gib")
    return run


def _load(variant: str, folder: Path, device: Any) -> Any:
    """The model as the variant loads it, LoRA on top (the module docstring)."""
    import torch
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    cuda = device.type == "cuda"
    if variant == "4-bit":
        compute = torch.bfloat16 if cuda else torch.float32
        nf4 = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                 bnb_4bit_compute_dtype=compute)  # fmt: skip
        place = device.index if cuda else "cpu"  # each process loads onto its own device
        model = AutoModelForCausalLM.from_pretrained(folder, quantization_config=nf4, device_map={"": place})
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    else:
        dtype = torch.bfloat16 if cuda else torch.float32
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(device)
        model.requires_grad_(False)
    lora = LoraConfig(r=LORA_R, lora_alpha=2 * LORA_R, lora_dropout=0.0, target_modules=TARGETS)
    return get_peft_model(model, lora)


def estimates(variant: str, folder: Path, model: Any, device: Any, size: str) -> dict[str, float]:
    """xtrain's estimate (GiB) before loading (the plan) and of the loaded model (the loop's)."""
    from xtrain.model import memory
    from xtrain.tasks.sizes import live_sizes, offline_sizes
    from xtrain.tasks.validation import load_config

    *_, per_device, seq = SIZES[size]
    cuda = device.type == "cuda"
    precision = "bf16" if cuda else "no"
    dtype = "bfloat16" if cuda else "float32"
    overrides = [f"model.name_or_path={folder.as_posix()}", "model.task=causal-lm", f"lora.r={LORA_R}",
                 f"model.dtype={dtype}", f"lora.target_modules={','.join(TARGETS)}",
                 f"data.max_length={seq}", f"batch.per_device={per_device}"]  # fmt: skip
    if variant == "4-bit":
        overrides.append("model.quantization=4bit")
    planned = offline_sizes(load_config(None, overrides))
    live = live_sizes(model)
    out = {}
    for name, sizes in (("plan", planned), ("loaded", live)):
        if isinstance(sizes, str) or sizes is None:
            raise RuntimeError(f"no estimate for the {name}: {sizes}")
        out[name] = memory.check_memory(sizes, per_device, seq, False, precision, 1e9, "-").estimate_gib
    # the weights term alone (no tokens, nothing trained, no slack): against the loaded footprint
    rest = memory.KBIT_REST_BYTES if live.quantization else live.weight_bytes
    weights = memory.estimate_gib(live.params, 0, rest, 0, live.shape.hidden, live.shape.layers, False,
                                  quantized=live.quantizable, quantization=live.quantization)  # fmt: skip
    out["weights_mib"] = weights / 1.1 * 1024
    return out


def worker(variant: str, folder: Path, device_name: str, size: str, steps: int, warmup: int) -> None:
    """One run: load, train ``steps`` steps, emit tokens/s, the estimates and the memory."""
    import torch

    set_threads_from_env()
    device = torch.device(device_name)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    model = _load(variant, folder, device)
    *_, vocab, per_device, seq = SIZES[size]
    torch.manual_seed(1)
    ids = torch.randint(0, vocab, (per_device, seq))
    batches = itertools.repeat({"input_ids": ids, "labels": ids})
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    cpu: list[float] = []
    times = hand_written_loop(model, batches, steps=steps, accum=1, optimizer=optimizer, scheduler=scheduler,
                              max_grad_norm=1.0, device=device, cpu_times=cpu,
                              precision="bf16" if device.type == "cuda" else "no", log_every=1)  # fmt: skip
    result: dict[str, Any] = {
        "variant": variant,
        "tokens_per_s": per_device * seq * steady_rate(times, warmup),
        # by the process's CPU time: what other jobs on a shared machine disturb less
        "tokens_per_cpu_s": per_device * seq * steady_rate(cpu, warmup),
        "estimate_gib": estimates(variant, folder, model, device, size),
        # parameters and buffers as loaded (a 4-bit weight: half a byte plus its constants)
        "weights_mib": model.get_base_model().get_memory_footprint() / 2**20,
        "trainable": sum(p.numel() for p in params),
    }
    if device.type == "cuda":
        result["peak_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    emit(result)


def measure(
    repeats: int = 3,
    steps: int = 12,
    warmup: int = 3,
    size: str = "small",
    device: str = "cpu",
    log: Any = None,
    with_xtrain: bool = True,
) -> dict[str, Any]:
    """For benchmarks/run_all.py: the variants, interleaved, each run in a fresh process."""
    import os

    say = log or (lambda m: None)
    root = Path(tempfile.mkdtemp(prefix="xtrain-bench-quantization-"))
    env = bench_env(1)
    os.environ["OMP_NUM_THREADS"] = env["OMP_NUM_THREADS"]  # xtrain's launched runs inherit it
    if with_xtrain:
        # a one-process CPU plan trains in this process: one compute thread, as the workers have
        set_threads_from_env()
    try:
        job = build_checkpoint(root, size)
        folder = job.model_dir
        names = VARIANTS + (XTRAIN if with_xtrain else ())
        runs: dict[str, list[dict[str, Any]]] = {v: [] for v in names}
        for r in range(repeats):
            for variant in names if r % 2 == 0 else names[::-1]:
                if variant in XTRAIN:
                    out = root / f"{variant.replace(' ', '-')}-{r}"
                    run = xtrain_run(job, variant, device, steps, warmup, out)
                    shutil.rmtree(out, ignore_errors=True)
                    runs[variant].append(run)
                    rate = run["tokens_per_s"]
                    say(f"quantization: repeat {r + 1}/{repeats} {variant}: {rate:,.0f} tokens/s")
                    continue
                cmd = [PYTHON, str(HERE), "--worker", variant, "--model", str(folder), "--device", device,
                       "--size", size, "--steps", str(steps), "--warmup", str(warmup)]  # fmt: skip
                run = run_json(cmd, env=env)
                runs[variant].append(run)
                say(f"quantization: repeat {r + 1}/{repeats} {variant}: {run['tokens_per_s']:,.0f} tokens/s, "
                    f"estimate {run['estimate_gib']['loaded']:.3f} GiB")  # fmt: skip
        hidden, layers, intermediate, heads, vocab, per_device, seq = SIZES[size]
        out: dict[str, Any] = {
            "setup": {
                "size": size,
                "hidden": hidden,
                "layers": layers,
                "intermediate": intermediate,
                "heads": heads,
                "vocab": job.vocab,
                "per_device": per_device,
                "seq": seq,
                "steps": steps,
                "warmup": warmup,
                "repeats": repeats,
                "device": device,
                "lora_r": LORA_R,
            },  # fmt: skip
            "tokens_per_s": {v: Spread.of([x["tokens_per_s"] for x in runs[v]]).to_dict() for v in names},
            "tokens_per_cpu_s": {
                v: Spread.of([x["tokens_per_cpu_s"] for x in runs[v]]).to_dict() for v in VARIANTS
            },
            "runs": runs,
        }
        for v in names:  # deterministic per variant: the first run's
            first = runs[v][0]
            if "estimate_gib" in first:
                out.setdefault("estimate_gib", {})[v] = first["estimate_gib"]
                out.setdefault("weights_mib", {})[v] = first["weights_mib"]
            if first.get("loop_estimate_gib") is not None:
                out.setdefault("loop_estimate_gib", {})[v] = first["loop_estimate_gib"]
            if "peak_gib" in first:
                out.setdefault("peak_gib", {})[v] = Spread.of([x["peak_gib"] for x in runs[v]]).to_dict()
        tps = out["tokens_per_s"]
        out["ratio"] = tps["4-bit"]["median"] / tps["16-bit"]["median"]
        cpu = out["tokens_per_cpu_s"]
        out["ratio_cpu"] = cpu["4-bit"]["median"] / cpu["16-bit"]["median"]
        if with_xtrain:
            out["ratio_xtrain"] = tps["xtrain 4-bit"]["median"] / tps["xtrain 16-bit"]["median"]
        return out
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--size", choices=sorted(SIZES), default="small")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--json", action="store_true")
    p.add_argument("--no-xtrain", action="store_true", help="the hand-written loop only")
    p.add_argument("--worker", choices=VARIANTS, help=argparse.SUPPRESS)
    p.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        worker(a.worker, a.model, a.device, a.size, a.steps, a.warmup)
        return
    say = lambda m: print(m, file=sys.stderr)  # noqa: E731
    result = measure(a.repeats, a.steps, a.warmup, a.size, a.device, log=say, with_xtrain=not a.no_xtrain)
    result["machine"] = machine()
    if a.json:
        print(json.dumps(result, indent=1))
        return
    for v in result["tokens_per_s"]:
        t = result["tokens_per_s"][v]
        line = f"{v:13} {t['median']:,.0f} tokens/s ({t['min']:,.0f}-{t['max']:,.0f}, n={t['n']})"
        if v in result["tokens_per_cpu_s"]:
            line += f", {result['tokens_per_cpu_s'][v]['median']:,.0f} by CPU time"
        if v in result.get("estimate_gib", {}):
            est = result["estimate_gib"][v]
            line += f"; estimate {est['plan']:.3f} GiB (plan), {est['loaded']:.3f} GiB (loaded)"
            line += f"; weights {result['weights_mib'][v]:.1f} MiB (estimated {est['weights_mib']:.1f})"
        if v in result.get("loop_estimate_gib", {}):
            line += f"; the loop's estimate {result['loop_estimate_gib'][v]:.2f} GiB"
        if v in result.get("peak_gib", {}):
            line += f"; peak {result['peak_gib'][v]['median']:.3f} GiB"
        print(line)
    print(f"4-bit / 16-bit tokens/s: {result['ratio']:.2f}x (by CPU time {result['ratio_cpu']:.2f}x)")
    if "ratio_xtrain" in result:
        print(f"through xtrain: {result['ratio_xtrain']:.2f}x")


if __name__ == "__main__":
    main()
