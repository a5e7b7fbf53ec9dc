"""Sequence parallelism's memory (``parallel.sequence``, docs/long-context.md): the peak tensor
memory of one training step on the CPU, one process on sequences of 2L tokens against each of two
processes (gloo) holding L of them, the same model, weights and tokens.

The model: Qwen2-shaped (4 layers of width 256, 8 attention and 4 key/value heads, a 4,096-entry
vocabulary), LoRA r=16 on q/k/v/o, float32; sdpa attention, the model's own loss or the chunked
one, with and without gradient checkpointing. The sequence alternates prompt and answer turns of
128 tokens (the answers trained), so every shard holds its share of the trained tokens. The two
processes run xtrain's own pieces as a run does: the batch cut by
``data.sequence_shards.shard_batch`` (labels shifted, positions global), the attention in
transformers' registry (``model.sequence_parallel``: Ulysses, all-to-all over gloo).

*Peak*: the largest ``Total Allocated`` PyTorch's profiler records for the CPU allocator over one
step (forward, backward, AdamW), above what was allocated when it started (``profile_memory=True``:
the allocator's own count, exact, unlike RSS: glibc keeps freed memory; tracemalloc sees none of
PyTorch's allocations); a warm-up step before it. Two processes: the larger of their two peaks.
*Step*: the median wall time of 3 further steps. The loss is checked to agree (1e-5).

    .venv/bin/python benchmarks/sequence_parallel.py            # CPU, one compute thread a process
    .venv/bin/python benchmarks/sequence_parallel.py --json
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
from chunked_loss import allocated_peak  # noqa: E402
from common import REPO  # noqa: E402

SHAPE = dict(hidden_size=256, intermediate_size=704, num_hidden_layers=4, num_attention_heads=8,
             num_key_value_heads=4, vocab_size=4096, tie_word_embeddings=False)  # fmt: skip
# (name, model.chunked_loss on, gradient checkpointing)
VARIANTS = (
    ("own loss", False, False),
    ("chunked loss", True, False),
    ("chunked loss + checkpointing", True, True),
)


TURN = 128  # tokens of a turn: prompts and answers alternate, so every shard trains on half its tokens


def turns_batch(tokens: int, vocab: int) -> dict[str, Any]:
    """One sequence of ``tokens`` random ids below ``vocab``, prompt and answer turns of ``TURN``
    tokens alternating (the prompts' labels -100), as a chat or an agent episode has them: the
    trained tokens spread over the sequence (a prompt of the first half would leave one shard
    every trained token, and its loss's logits)."""
    import torch

    ids = torch.randint(0, vocab, (1, tokens), generator=torch.Generator().manual_seed(1))
    labels = ids.clone()
    prompt = (torch.arange(tokens) // TURN) % 2 == 0
    labels[:, prompt] = -100
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


def build(chunked: bool, checkpointing: bool) -> Any:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from xtrain.model.chunked_loss import ChunkedLoss, LogitMap, chunk_rows

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(
        Qwen2Config(**SHAPE, max_position_embeddings=1 << 16, attn_implementation="sdpa")
    )
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    targets = ["q_proj", "k_proj", "v_proj", "o_proj"]
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=targets))
    if chunked:
        ChunkedLoss(model, "next-token", LogitMap(), chunk_rows(SHAPE["vocab_size"])).attach()
    return model.train()


class Step:
    """One training step on ``batch``: its token sum back-propagated (its mean x its tokens, as the
    loop's step loss does), AdamW; ``sums``: each step's token sum."""

    def __init__(self, model: Any, batch: dict[str, Any]) -> None:
        import torch

        self.model, self.batch, self.sums = model, batch, []
        self.optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
        labels = batch.get("shift_labels", batch["labels"][:, 1:])
        self.count = int((labels != -100).sum())

    def __call__(self) -> None:
        loss = self.model(**self.batch).loss
        (loss * self.count).backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.sums.append(float(loss.detach()) * self.count)


def run(rank: int, world: int, tokens: int, store: str, out: str) -> None:
    """One process's measurements (``world`` 2: shard ``rank`` of each sequence)."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    results: dict[str, Any] = {}
    if world > 1:
        from xtrain.model import sequence_parallel
        from xtrain.model.shard_exchange import Exchange, activate

        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
        activate(Exchange(None, world, rank))
        sequence_parallel.register("sdpa")
    from xtrain.data.sequence_shards import shard_batch

    for name, chunked, checkpointing in VARIANTS:
        batch = turns_batch(tokens, SHAPE["vocab_size"])
        step = Step(build(chunked, checkpointing), shard_batch(batch, world, rank) if world > 1 else batch)
        step()  # warm-up
        peak = allocated_peak(step, "cpu")
        times = []
        for _ in range(3):
            t = time.perf_counter()
            step()
            times.append(time.perf_counter() - t)
        results[name] = {"peak": peak, "step_s": statistics.median(times), "token_sum": step.sums[0]}
    Path(out).write_text(json.dumps(results), encoding="utf-8")
    if world > 1:
        dist.destroy_process_group()


def _worker(rank: int, world: int, tokens: int, store: str, folder: str) -> None:
    run(rank, world, tokens, store, os.path.join(folder, f"rank{rank}.json"))


def measure_one(world: int, tokens: int) -> list[dict[str, Any]]:
    """Every rank's results for ``world`` processes on sequences of ``tokens``."""
    import torch.multiprocessing as mp

    os.environ.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    with tempfile.TemporaryDirectory() as folder:
        args = (world, tokens, os.path.join(folder, "store"), folder)
        mp.start_processes(_worker, args=args, nprocs=world, join=True, start_method="spawn")
        return [json.loads(Path(folder, f"rank{r}.json").read_text(encoding="utf-8")) for r in range(world)]


def measure(lengths: tuple[int, ...] = (1024, 2048), log: Any = None, smoke: bool = False) -> dict[str, Any]:
    """For benchmarks/run_all.py: for each L, one process at 2L tokens and two at L each."""
    lengths = (128,) if smoke else lengths
    rows = []
    for length in lengths:
        one = measure_one(1, 2 * length)[0]
        two = measure_one(2, 2 * length)
        for name, _, _ in VARIANTS:
            split = [r[name] for r in two]
            total, alone = sum(r["token_sum"] for r in split), one[name]["token_sum"]
            row = {"variant": name, "tokens": 2 * length, "one_peak": one[name]["peak"],
                   "two_peak": max(r["peak"] for r in split), "one_step": one[name]["step_s"],
                   "two_step": max(r["step_s"] for r in split),
                   "loss_agrees": abs(total - alone) <= 1e-5 * abs(alone)}  # fmt: skip
            rows.append(row)
            if log is not None:
                mib = row["one_peak"] / 2**20, row["two_peak"] / 2**20
                head = f"sequence_parallel: {name}, {2 * length} tokens"
                log(f"{head}: {mib[0]:.1f} MiB alone, {mib[1]:.1f} MiB a process split across 2")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {"rows": rows, "measured": time.strftime("%Y-%m-%dT%H:%M:%S"), "load": load, "shape": SHAPE}


def render(r: dict[str, Any]) -> str:
    """The performance page's section."""
    s = r["shape"]
    load = f", load average after {r['load']:.1f}" if r.get("load") is not None else ""
    lines = [
        "## Sequence parallelism: a process's share of every sequence",
        "",
        f"`benchmarks/sequence_parallel.py`: a Qwen2-shaped causal LM ({s['num_hidden_layers']} layers of "
        f"width {s['hidden_size']}, {s['num_attention_heads']} attention and {s['num_key_value_heads']} "
        f"key/value heads, a {s['vocab_size']:,}-entry vocabulary), LoRA r=16 on q/k/v/o, float32 on the "
        "CPU, one compute thread a process, one sequence of prompt and answer turns of 128 tokens (the "
        "answers trained: every shard holds its share of the trained tokens). *One "
        "process* trains on the whole sequence of 2L tokens; *two processes* (gloo, `parallel.sequence: "
        "2`, Ulysses) each hold L of its tokens, cut and exchanged by xtrain's own pieces. *Peak*: the "
        "largest `Total Allocated` PyTorch's profiler records for the CPU allocator over one training "
        "step (forward, backward, AdamW) above its start (`profile_memory=True`; the CPU allocator has no "
        "peak counter, RSS keeps freed memory, tracemalloc does not see PyTorch's allocations); for two "
        "processes the larger of their peaks. *Step*: median "
        f"wall time of 3 steps (measured {r['measured']}{load}; the weights, gradients and AdamW states "
        "are every process's whole). The token sums agree between the two runs in every row: "
        f"**{'yes' if all(x['loss_agrees'] for x in r['rows']) else 'NO'}**.",
        "",
        "| variant | tokens a sequence | peak, one process (MiB) | peak a process, two (MiB) | two / one | "
        "step, one (s) | step, two (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for x in r["rows"]:
        one, two = x["one_peak"] / 2**20, x["two_peak"] / 2**20
        lines.append(
            f"| {x['variant']} | {x['tokens']:,} | {one:,.1f} | {two:,.1f} | {two / one:.2f}x | "
            f"{x['one_step']:.2f} | {x['two_step']:.2f} |"
        )
    ratios = [x["two_peak"] / x["one_peak"] for x in r["rows"]]
    lines += ["", " ".join([
        f"The peaks fall by {1 - max(ratios):.0%}-{1 - min(ratios):.0%}: every term that grows with the",
        "sequence is a process's share (its activations, its loss's logits, its checkpointed layer inputs);",
        "what does not fall is what every process holds whole (LoRA's gradients, AdamW's step temporaries)",
        "and, with gradient checkpointing, the layer recomputed in the backward, whose Ulysses exchanges",
        "keep a contiguous copy of q, k, v and the output on each side of the all-to-all while it runs. At",
        "7B sizes the per-position terms dominate; the plan's estimate (`xtrain doctor --config`,",
        "[long-context.md](long-context.md#how-much-longer)) counts each process's share. The step times",
        "come from a busy 2-core machine shared by the two processes: they say nothing of the speed on two",
        "GPUs.",
    ])]  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--lengths", default="1024,2048", help="L values: each process's tokens with two")
    a = p.parse_args()
    result = measure(tuple(int(x) for x in a.lengths.split(",")), log=lambda m: print(m, file=sys.stderr))
    print(json.dumps(result, indent=2) if a.json else render(result))


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    main()
