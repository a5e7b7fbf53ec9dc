"""xtrain's training loop vs a plain PyTorch loop doing the same work, in one process.

Same model (a llama-style causal LM built from a config, LoRA on q/k/v/o), same data, same
micro-batches, per-device batch, accumulation, AdamW, cosine schedule, grad clipping and
logging interval. Both are timed over the same steady-state window (after ``--warmup`` steps) as
1 / median step time, and run alternately ``--repeats`` times; the best of each and their ratio
are printed (best and median step times resist the noise of a shared machine).

    .venv/bin/python benchmarks/loop_vs_plain.py            # CPU defaults, about a minute
    .venv/bin/python benchmarks/loop_vs_plain.py --json     # machine-readable

The plain loop is the floor: what any trainer must at least do. xtrain adds per-micro-batch
reseeding, a CPU stop-flag check per step (several processes only), accelerate's wrappers and
the logging window; the ratio shows what that costs.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from xtrain.config.schema import TrainConfig  # noqa: E402
from xtrain.machine.facts import Facts  # noqa: E402
from xtrain.planning.rules import make_plan  # noqa: E402
from xtrain.tasks.contract import Workload  # noqa: E402
from xtrain.train.report import NullReporter  # noqa: E402

ARGS: argparse.Namespace


class RowDataset(torch.utils.data.Dataset):
    def __init__(self, rows: torch.Tensor) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return self.rows.shape[0]

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.rows[i]}


def collate(items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    ids = torch.stack([it["input_ids"] for it in items])
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


def make_model() -> torch.nn.Module:
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=ARGS.vocab,
        hidden_size=ARGS.hidden,
        intermediate_size=ARGS.hidden * 4,
        num_hidden_layers=ARGS.layers,
        num_attention_heads=max(1, ARGS.hidden // 64),
        num_key_value_heads=max(1, ARGS.hidden // 64),
        max_position_embeddings=ARGS.seq,
    )
    targets = ["q_proj", "k_proj", "v_proj", "o_proj"]
    lora = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=targets)
    return get_peft_model(LlamaForCausalLM(config), lora)


def make_data() -> RowDataset:
    g = torch.Generator().manual_seed(1)
    n = ARGS.per_device * ARGS.accum * (ARGS.steps + 1)
    return RowDataset(torch.randint(0, ARGS.vocab, (n, ARGS.seq), generator=g))


def build(run: Any, main_process_first: Any) -> Workload:
    return Workload(model=make_model(), train_dataset=make_data(), collator=collate)


class StepClock(NullReporter):
    def __init__(self) -> None:
        self.times: dict[int, float] = {}

    def progress(self, step: int, total: int, metrics: dict[str, float] | None = None) -> None:
        self.times[step] = time.perf_counter()


def steady_rate(times: dict[int, float]) -> float:
    """Steps/s from the median step time after the warm-up: robust against other processes
    taking the CPU for a while (this benchmark runs on shared machines)."""
    steps = range(ARGS.warmup + 1, ARGS.steps + 1)
    return 1.0 / statistics.median(times[s] - times[s - 1] for s in steps)


def run_xtrain() -> float:
    import xtrain.planning.batch as config_batch
    from xtrain.train.loop import train

    cfg = TrainConfig()
    cfg.batch.per_device = ARGS.per_device
    cfg.batch.global_batch = ARGS.per_device * ARGS.accum
    cfg.run.max_steps = ARGS.steps
    cfg.run.log_every = ARGS.log_every
    cfg.run.tensorboard = False
    cfg.run.seed = 0
    cfg.optim.lr = 1e-3
    cfg.optim.warmup_steps = 2
    assert config_batch.gradient_accumulation(cfg, 1) == ARGS.accum
    clock = StepClock()
    with tempfile.TemporaryDirectory() as out:
        cfg.run.output_dir = out
        train(cfg, make_plan(Facts(torch_version=torch.__version__, gloo_available=True)), clock, build=build)
    return steady_rate(clock.times)


def run_plain() -> float:
    """The floor: nanoGPT-style loop, no framework."""
    from transformers import get_scheduler

    torch.manual_seed(0)
    model = make_model()
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": 0.0}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    opt = torch.optim.AdamW(groups, lr=1e-3)
    sched = get_scheduler("cosine", opt, num_warmup_steps=2, num_training_steps=ARGS.steps)
    loader = torch.utils.data.DataLoader(make_data(), batch_size=ARGS.per_device, collate_fn=collate)
    batches = iter(loader)
    times: dict[int, float] = {}
    loss_sum = torch.zeros(())
    for step in range(ARGS.steps):
        for _ in range(ARGS.accum):
            batch = next(batches)
            loss = model(**batch).loss
            (loss / ARGS.accum).backward()
            loss_sum += loss.detach()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if (step + 1) % ARGS.log_every == 0:
            _ = float(loss_sum)  # the logging sync
            loss_sum.zero_()
        times[step + 1] = time.perf_counter()
    return steady_rate(times)


def main() -> None:
    global ARGS
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--per-device", type=int, default=8)
    p.add_argument("--accum", type=int, default=2)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--json", action="store_true")
    ARGS = p.parse_args()

    plain, xtrain = [], []
    for _ in range(ARGS.repeats):  # alternate, so drifting machine load hits both alike
        plain.append(run_plain())
        xtrain.append(run_xtrain())
    result = {
        "plain_steps_per_s": max(plain),
        "xtrain_steps_per_s": max(xtrain),
        "ratio": max(xtrain) / max(plain),
        "runs": {"plain": plain, "xtrain": xtrain},
        "setup": {k: v for k, v in vars(ARGS).items() if k != "json"},
        "machine": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "cpu": platform.processor() or platform.machine(),
        },
    }
    if ARGS.json:
        print(json.dumps(result, indent=1))
    else:
        print(
            f"plain PyTorch loop: {result['plain_steps_per_s']:.3f} steps/s\n"
            f"xtrain loop:        {result['xtrain_steps_per_s']:.3f} steps/s\n"
            f"ratio xtrain/plain: {result['ratio']:.3f}  "
            f"(best of {ARGS.repeats}; global batch {ARGS.per_device}x{ARGS.accum}, seq {ARGS.seq})"
        )


if __name__ == "__main__":
    main()
