"""xtrain's loop vs a minimal hand-written PyTorch loop (the floor) vs Hugging Face Trainer.

Same model (the bench's llama-style ``tiny`` model from a LlamaConfig, LoRA r=16 on q/k/v/o, no
dropout), same data (fixed-length rows of token ids), same per-device batch, accumulation,
AdamW, cosine schedule with warm-up, gradient clipping at 1.0, logging every 10 steps, fp32 on
CPU (or ``--precision`` on a GPU). Each run is a fresh process; the three loops run interleaved
``--repeats`` times. A run's speed is 1 / its median optimizer-step time after ``--warmup`` steps.

    python benchmarks/loops.py [--repeats 5] [--steps 40] [--json] [--reference DIR] [--compile]

``--compile`` compiles the model in every loop: ``torch.compile`` in the plain one, ``run.compile``
in xtrain's (accelerate's TorchDynamoPlugin), ``torch_compile`` in Trainer's. Compiling happens
in the first steps, so raise ``--warmup`` past them (the rate is taken after the warm-up).

``--reference DIR`` adds a fourth loop, ``xtrain_ref``: the xtrain loop of another checkout (a
git worktree of an older commit, say), run by that checkout's own ``benchmarks/loops.py`` with
``PYTHONPATH=DIR``, interleaved with the others: a before/after of a loop change in one run.

xtrain runs in-process through ``xtrain.train.loop.train`` with a ``build`` hook (the same
loop ``python -m xtrain.run`` runs; the launch path adds nothing per step).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    PYTHON,
    Spread,
    bench_env,
    emit,
    machine,
    model_size,
    run_json,
    set_threads_from_env,
    steady_rate,
)

LOOPS = ("plain", "xtrain", "trainer")


def stamp() -> tuple[float, float]:
    """(wall time, this process's CPU time): CPU time per step is what the loop costs even when
    other processes take the machine's cores for a while (with one compute thread)."""
    return time.perf_counter(), time.process_time()


# -- the shared workload (worker side) -------------------------------------------------------------------
def make_model(a: argparse.Namespace) -> Any:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    from xtrain.bench.sizes import LORA_TARGETS

    s = model_size(a.size)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=s.vocab, hidden_size=s.hidden, intermediate_size=s.intermediate,
        num_hidden_layers=s.layers, num_attention_heads=s.heads, num_key_value_heads=s.heads,
        max_position_embeddings=max(2048, s.seq_len), tie_word_embeddings=False,
    )  # fmt: skip
    model = LlamaForCausalLM(config)
    if getattr(a, "full", False):
        return model
    lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=LORA_TARGETS)
    return get_peft_model(model, lora)


class Rows:
    """Map-style dataset of fixed-length token rows (top-level: picklable)."""

    def __init__(self, n: int, seq: int, vocab: int) -> None:
        import torch

        g = torch.Generator().manual_seed(1)
        self.rows = torch.randint(0, vocab, (n, seq), generator=g)

    def __len__(self) -> int:
        return self.rows.shape[0]

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"input_ids": self.rows[i]}


def collate(items: list[dict[str, Any]]) -> dict[str, Any]:
    import torch

    ids = torch.stack([it["input_ids"] for it in items])
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


def make_data(a: argparse.Namespace) -> Rows:
    s = model_size(a.size)
    return Rows(a.per_device * a.accum * (a.steps + 2), s.seq_len, s.vocab)


# -- the three loops ------------------------------------------------------------
def run_plain(a: argparse.Namespace) -> list[float]:
    """The floor: nanoGPT-style, nothing but the work."""
    import torch
    from transformers import get_scheduler

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = make_model(a).to(device)
    model.train()
    fwd = torch.compile(model) if a.compile else model
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.0, fused=device.type == "cuda" or None)
    sched = get_scheduler("cosine", opt, num_warmup_steps=2, num_training_steps=a.steps)
    loader = torch.utils.data.DataLoader(
        make_data(a), batch_size=a.per_device, shuffle=True, collate_fn=collate
    )
    batches = iter(loader)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(a.precision)
    scaler = torch.amp.GradScaler(enabled=a.precision == "fp16")
    loss_sum = torch.zeros((), device=device)
    times = [stamp()]
    for step in range(a.steps):
        for _ in range(a.accum):
            batch = {k: v.to(device, non_blocking=True) for k, v in next(batches).items()}
            with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                loss = fwd(**batch).loss
            scaler.scale(loss / a.accum).backward()
            loss_sum += loss.detach()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        scaler.step(opt)
        scaler.update()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if (step + 1) % a.log_every == 0:
            _ = float(loss_sum)  # the logging sync
            loss_sum.zero_()
        times.append(stamp())
    return times


def run_xtrain(a: argparse.Namespace) -> list[float]:
    from xtrain.config.schema import TrainConfig
    from xtrain.machine import probe
    from xtrain.planning import rules
    from xtrain.planning.plan import Overrides
    from xtrain.tasks.contract import Workload
    from xtrain.train.loop import train
    from xtrain.train.report import NullReporter

    times: list[tuple[float, float]] = []

    class Clock(NullReporter):
        def start(self, info: Any) -> None:
            times.append(stamp())

        def progress(self, step: int, total: int, metrics: dict[str, float] | None = None) -> None:
            times.append(stamp())

    cfg = TrainConfig()
    cfg.batch.per_device = a.per_device
    cfg.batch.global_batch = a.per_device * a.accum
    cfg.optim.lr = 1e-4
    cfg.optim.warmup_steps = 2
    cfg.run.max_steps = a.steps
    cfg.run.log_every = a.log_every
    cfg.run.tensorboard = False
    cfg.run.resume = "off"
    cfg.run.seed = 0
    cfg.run.mixed_precision = a.precision
    cfg.lora.enabled = not a.full
    cfg.run.compile = a.compile
    plan = rules.make_plan(probe.collect(quick=True), Overrides(num_processes=1))
    with tempfile.TemporaryDirectory() as out:
        cfg.run.output_dir = out
        train(cfg, plan, Clock(), build=lambda c, first: Workload(make_model(a), make_data(a), collate))
    return times


def run_trainer(a: argparse.Namespace) -> list[float]:
    import torch
    from transformers import Trainer, TrainerCallback, TrainingArguments

    times: list[tuple[float, float]] = []

    class Clock(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            times.append(stamp())

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            times.append(stamp())

    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(
            output_dir=out,
            per_device_train_batch_size=a.per_device,
            gradient_accumulation_steps=a.accum,
            max_steps=a.steps,
            learning_rate=1e-4,
            weight_decay=0.0,
            lr_scheduler_type="cosine",
            warmup_steps=2,
            max_grad_norm=1.0,
            logging_steps=a.log_every,
            save_strategy="no",
            report_to=[],
            dataloader_num_workers=0,
            remove_unused_columns=False,
            disable_tqdm=True,
            seed=0,
            use_cpu=not torch.cuda.is_available(),
            bf16=a.precision == "bf16",
            fp16=a.precision == "fp16",
            torch_compile=a.compile,
        )
        trainer = Trainer(
            model=make_model(a),
            args=args,
            train_dataset=make_data(a),
            data_collator=collate,
            callbacks=[Clock()],
        )
        trainer.train()
    return times


def worker(a: argparse.Namespace) -> None:
    set_threads_from_env()
    fn = {"plain": run_plain, "xtrain": run_xtrain, "trainer": run_trainer}[a.worker]
    times = fn(a)
    wall = [t[0] for t in times]
    cpu = [t[1] for t in times]
    emit({"loop": a.worker, "times": wall, "cpu_times": cpu, "steps_per_s": steady_rate(wall, a.warmup),
          "cpu_steps_per_s": steady_rate(cpu, a.warmup)})  # fmt: skip


# -- the comparison (parent side) --------------------------------------------------
def measure(
    repeats: int = 5,
    steps: int = 40,
    warmup: int = 5,
    size: str = "tiny",
    per_device: int = 8,
    accum: int = 2,
    precision: str = "no",
    threads: int | None = 1,
    log: Any = None,
    reference: str | None = None,
    compile: bool = False,
) -> dict[str, Any]:
    """Interleaved runs of the loops; medians, spreads and ratios, by wall time and by the
    process's CPU time per step."""
    loops = LOOPS + (("xtrain_ref",) if reference else ())
    rates: dict[str, dict[str, list[float]]] = {"wall": {k: [] for k in loops}, "cpu": {k: [] for k in loops}}
    base = [PYTHON, str(Path(__file__).resolve()), "--steps", str(steps), "--warmup", str(warmup),
            "--size", size, "--per-device", str(per_device), "--accum", str(accum),
            "--precision", precision, *(["--compile"] if compile else [])]  # fmt: skip
    n = len(loops)
    for r in range(repeats):
        for loop in loops[r % n :] + loops[: r % n]:  # rotate the order: no loop always goes first
            if loop == "xtrain_ref":
                ref = str(Path(reference).resolve())
                cmd = [*base, "--worker", "xtrain"]
                cmd[1] = str(Path(ref) / "benchmarks" / "loops.py")
                got = run_json(cmd, env=bench_env(threads, PYTHONPATH=ref))
            else:
                got = run_json([*base, "--worker", loop], env=bench_env(threads))
            rates["wall"][loop].append(got["steps_per_s"])
            rates["cpu"][loop].append(got["cpu_steps_per_s"])
            if log:
                log(f"loops: repeat {r + 1}/{repeats} {loop}: {got['steps_per_s']:.2f} steps/s "
                    f"(CPU time: {got['cpu_steps_per_s']:.2f})")  # fmt: skip
    out: dict[str, Any] = {
        "setup": {
            "repeats": repeats,
            "steps": steps,
            "warmup": warmup,
            "size": size,
            "per_device": per_device,
            "accum": accum,
            "precision": precision,
            "threads": threads,
            "reference": reference,
            "compile": compile,
        },  # fmt: skip
        "runs": rates,
    }
    for clock, by_loop in rates.items():
        med = {k: Spread.of(v) for k, v in by_loop.items()}
        paired = [x / p for x, p in zip(by_loop["xtrain"], by_loop["plain"], strict=True)]
        paired_t = [x / t for x, t in zip(by_loop["xtrain"], by_loop["trainer"], strict=True)]
        out[clock] = {
            "steps_per_s": {k: v.to_dict() for k, v in med.items()},
            "xtrain_vs_plain": med["xtrain"].median / med["plain"].median,
            "xtrain_vs_trainer": med["xtrain"].median / med["trainer"].median,
            "paired_xtrain_vs_plain": Spread.of(paired).to_dict(),
            "paired_xtrain_vs_trainer": Spread.of(paired_t).to_dict(),
        }
        plain_s = 1 / med["plain"].median
        out[clock]["overhead_ms_per_step"] = {
            k: 1000 * (1 / v.median - plain_s) for k, v in med.items() if k != "plain"
        }  # the host work a loop adds to the hand-written one, per optimizer step
        if reference:
            paired_r = [x / r for x, r in zip(by_loop["xtrain"], by_loop["xtrain_ref"], strict=True)]
            out[clock]["paired_xtrain_vs_ref"] = Spread.of(paired_r).to_dict()
    return out


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", choices=LOOPS)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--size", default="tiny")
    p.add_argument("--per-device", type=int, default=8)
    p.add_argument("--accum", type=int, default=2)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--precision", default="no", choices=("no", "fp16", "bf16"))
    p.add_argument("--full", action="store_true", help="full fine-tuning instead of LoRA")
    p.add_argument("--compile", action="store_true", help="torch.compile the model in every loop")
    p.add_argument("--json", action="store_true")
    p.add_argument("--reference", help="another xtrain checkout: its loop runs too, as xtrain_ref")
    return p.parse_args(argv)


def main() -> None:
    a = parse()
    if a.worker:
        worker(a)
        return
    result = measure(a.repeats, a.steps, a.warmup, a.size, a.per_device, a.accum, a.precision,
                     log=lambda m: print(m, file=sys.stderr), reference=a.reference,
                     compile=a.compile)  # fmt: skip
    result["machine"] = machine()
    if a.json:
        print(json.dumps(result, indent=1))
        return
    for clock in ("wall", "cpu"):
        r = result[clock]
        print(f"-- by {clock} time per step")
        for k in r["steps_per_s"]:
            print(f"{k:10} {Spread(**_spread(r['steps_per_s'][k])).show(unit=' steps/s')}")
        print(f"xtrain / plain   {r['xtrain_vs_plain']:.3f} "
              f"(paired {Spread(**_spread(r['paired_xtrain_vs_plain'])).show('{:.3f}')})")  # fmt: skip
        print(f"xtrain / Trainer {r['xtrain_vs_trainer']:.3f} "
              f"(paired {Spread(**_spread(r['paired_xtrain_vs_trainer'])).show('{:.3f}')})")  # fmt: skip
        extra = ", ".join(f"{k} {v:+.2f} ms" for k, v in r["overhead_ms_per_step"].items())
        print(f"per step over plain: {extra}")
        if "paired_xtrain_vs_ref" in r:
            print(f"xtrain / ref     (paired {Spread(**_spread(r['paired_xtrain_vs_ref'])).show('{:.3f}')})")


def _spread(d: dict[str, float]) -> dict[str, Any]:
    return {"median": d["median"], "low": d["min"], "high": d["max"], "n": int(d["n"])}


if __name__ == "__main__":
    main()
