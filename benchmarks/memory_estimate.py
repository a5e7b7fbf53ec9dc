"""The memory estimate's activation term against what autograd really keeps for the backward pass.

For each built-in job (speech-to-text: tiny Whisper; image-to-text: tiny TrOCR; vision-language:
tiny Qwen2-VL; causal-lm: tiny Llama), trained as xtrain builds it (LoRA with the defaults, LoRA on
the decoder only, a full fine-tune, the quickstart's recipe), at a few micro-batch sizes and
lengths, one training forward pass runs under ``torch.autograd.graph.saved_tensors_hooks`` and
every tensor autograd saves is counted once by its storage (views share one), leaving out
parameters and buffers (weights saved by autograd are not activations). Saved inside the model's
modules is the *activation* figure; saved at the top level (the loss's log-softmax) the *loss*
figure. Both are held against xtrain's estimate for the same batch (``memory.saved_bytes`` on the
stacks ``live_sizes`` reads from the model, ``xtrain/model/activations.py``).

Exact on the CPU in float32 (the CPU's dropout multiplies by a float mask: the estimate is given
the CPU's mask size; on CUDA the fused dropout keeps a bool mask, and the estimate counts 1 byte).
On a GPU (``--device cuda``, not run here: no GPU was lent) the same cases run a whole step in
bf16 autocast and also report ``torch.cuda.max_memory_allocated`` against the whole estimate.

    .venv/bin/python benchmarks/memory_estimate.py          # every case, about a minute
    .venv/bin/python benchmarks/memory_estimate.py --json
    python benchmarks/memory_estimate.py --device cuda      # on a CUDA machine
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, bench_env  # noqa: E402

DATA = REPO / "xtrain" / "builtin" / "jobs"
# (task, job, the built-in job's overrides, how it trains: overrides), the batches a case runs
SHORT = ["data.max_length=64", "generation.max_new_tokens=20"]  # the tiny decoders have 64 positions
JOBS: dict[str, tuple[str, list[str]]] = {
    "speech-to-text": ("quickstart-speech-to-text.yaml", SHORT),
    "image-to-text": ("quickstart-image-to-text.yaml", SHORT),
    "vision-language": ("quickstart-vision-language.yaml", ["data.max_length=64"]),
    "causal-lm": (
        "",
        [
            "model.name_or_path=builtin:tiny-llama",
            "model.task=causal-lm",
            "data.train=builtin:tiny-stories",
            "data.max_length=256",
        ],
    ),
}
LORA_DEFAULTS = ["lora.enabled=true", "lora.r=8", "lora.alpha=16", "lora.dropout=0.05"]
TRAINING: dict[str, list[tuple[str, list[str]]]] = {
    "speech-to-text": [
        ("LoRA (both halves)", LORA_DEFAULTS),
        ("LoRA on the decoder", [*LORA_DEFAULTS, "lora.apply_to=decoder"]),
        ("full fine-tune", []),
    ],
    "image-to-text": [
        ("LoRA (both halves)", LORA_DEFAULTS),
        ("LoRA on the decoder", [*LORA_DEFAULTS, "lora.apply_to=decoder"]),
        ("full fine-tune", []),
    ],
    "vision-language": [
        ("LoRA + merger, no dropout (quickstart)", []),
        ("LoRA defaults", [*LORA_DEFAULTS, "lora.projector=false"]),
        ("full fine-tune", ["lora.enabled=false"]),
    ],
    "causal-lm": [
        ("LoRA defaults", LORA_DEFAULTS),
        ("full fine-tune", ["lora.enabled=false"]),
    ],
}
# (per-device batch, decoder tokens) for the encoder-decoders and causal-lm; (batch, image pixels)
# for vision-language, whose text length is the collated batch's
SETTINGS = {
    "speech-to-text": [(2, 16), (8, 16), (8, 48)],
    "image-to-text": [(2, 16), (8, 16), (8, 48)],
    "vision-language": [(2, 56 * 56), (8, 56 * 56), (8, 112 * 112)],
    "causal-lm": [(2, 64), (8, 64), (8, 256)],
}
MUST_HOLD = ("speech-to-text", "image-to-text", "vision-language")  # within 25 %


def _config(task: str, training: list[str]) -> Any:
    from xtrain.tasks.validation import load_config

    job, base = JOBS[task]
    return load_config(DATA / job if job else None, [*base, *training, "data.eval=null"])


class Saved:
    """Counts what autograd saves while it is active: each storage once, parameters and buffers
    left out; saved inside a submodule counts as ``layers``, at the top level as ``loss``."""

    def __init__(self, model: Any) -> None:
        import torch

        self.torch = torch
        self.model = model
        top = [model, getattr(model, "base_model", None)]
        if hasattr(model, "get_base_model"):
            top.append(model.get_base_model())
        self.top = {id(m) for m in top if m is not None}
        tensors = [*model.parameters(), *model.buffers()]
        self.weights = {t.untyped_storage().data_ptr() for t in tensors}
        self.seen: set[int] = set()
        self.bytes = {"layers": 0, "loss": 0}
        self.stack: list[int | None] = []

    def pack(self, t: Any) -> Any:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in self.weights and ptr not in self.seen and storage.nbytes():
            self.seen.add(ptr)
            inner = self.stack[-1] if self.stack else None
            self.bytes["loss" if inner is None or inner in self.top else "layers"] += storage.nbytes()
        return t

    def enter(self, module: Any) -> None:
        # a loss module (Whisper's and VisionEncoderDecoder's CrossEntropyLoss) is the top level
        self.stack.append(None if isinstance(module, self.torch.nn.modules.loss._Loss) else id(module))

    def forward(self, batch: dict[str, Any]) -> Any:
        import torch.nn.modules.module as modules

        pre = modules.register_module_forward_pre_hook(lambda m, a: self.enter(m))
        post = modules.register_module_forward_hook(lambda m, a, o: self.stack.pop() and None)
        try:
            with self.torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t):
                return self.model(**batch)
        finally:
            pre.remove()
            post.remove()


def _batch(task: str, workload: Any, per_device: int, length: int) -> tuple[dict[str, Any], int]:
    """A batch of ``per_device`` rows at ``length`` decoder tokens (vision-language: the collated
    conversations; its length is theirs); returns it and its token positions."""
    import torch

    gen = torch.Generator().manual_seed(0)
    model = workload.model
    vocab = model.get_output_embeddings().weight.shape[0]
    tokens = torch.randint(0, vocab, (per_device, length), generator=gen)
    if task == "causal-lm":
        mask = torch.ones_like(tokens)
        return {"input_ids": tokens, "attention_mask": mask, "labels": tokens.clone()}, length
    rows = [workload.train_dataset[i] for i in range(per_device)]
    batch = dict(workload.collator(rows))
    if task == "vision-language":
        return batch, int(batch["input_ids"].shape[1])
    batch["labels"] = tokens  # exactly ``length`` decoder positions
    return batch, length


def measure_case(task: str, label: str, training: list[str], settings: list[tuple[int, int]],
                 device: str = "cpu") -> list[dict[str, Any]]:  # fmt: skip
    """Every setting of one way of training a built-in: measured and estimated bytes."""
    import torch
    from common import build_alone

    from xtrain.model import memory
    from xtrain.model.activations import Precision
    from xtrain.tasks.sizes import live_sizes

    rows = []
    by_pixels: dict[int, Any] = {}
    for per_device, size in settings:
        extra = [f"data.min_pixels={size}", f"data.max_pixels={size}"] if task == "vision-language" else []
        cfg = _config(task, [*training, *extra])
        key = size if extra else 0
        if key not in by_pixels:
            torch.manual_seed(0)
            by_pixels[key] = build_alone(cfg)
        workload = by_pixels[key]
        model = workload.model.to(device)
        model.train()
        batch, positions = _batch(task, workload, per_device, size if not extra else 0)
        batch = {k: v.to(device) if hasattr(v, "to") else v for k, v in batch.items()}
        # the estimate for this batch: its decoder tokens as data.max_length
        at = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, max_length=positions))
        sizes = live_sizes(model, (), at)
        assert sizes is not None and sizes.stacks, f"{task}: no stacks"
        cuda = device == "cuda"
        act = 2 if cuda else 4
        p = Precision(act, 1 if cuda else act, sizes.lora_rank, sizes.lora_dropout)
        layers, loss = memory.saved_bytes(sizes, False, p)
        row = {
            "task": task, "training": label, "per_device": per_device, "positions": positions,
            "stacks": {s.part: {"positions": s.positions, "trains": s.trains} for s in sizes.stacks},
            "estimate": {"layers": per_device * layers, "loss": per_device * loss},
        }  # fmt: skip
        if cuda:
            row.update(_cuda_step(model, batch, at, sizes, per_device))
        else:
            counter = Saved(model)
            counter.forward(batch).loss.backward()
            row["measured"] = dict(counter.bytes)
        row["ratio"] = row["estimate"]["layers"] / max(row["measured"]["layers"], 1)
        rows.append(row)
        model.zero_grad(set_to_none=True)
    return rows


def _cuda_step(model: Any, batch: dict[str, Any], cfg: Any, sizes: Any, per_device: int) -> dict[str, Any]:
    """A GPU: one bf16-autocast step; what autograd saves, what the forward pass left allocated,
    and the peak of the whole step (``max_memory_allocated``) against the whole estimate."""
    import torch

    from xtrain.model import memory

    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    counter = Saved(model)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = counter.forward(batch)
    after_forward = torch.cuda.memory_allocated()
    out.loss.backward()
    optimizer.step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    card = torch.cuda.get_device_properties(0).total_memory / memory.GIB
    whole = memory.check_memory(sizes, per_device, cfg.data.max_length, False, "bf16", card, "GPU")
    return {
        "measured": dict(counter.bytes),
        "forward_allocated": after_forward - before,
        "peak_gib": peak / memory.GIB,
        "estimate_gib": whole.estimate_gib,
    }


def measure(log: Any = None, smoke: bool = False, device: str = "cpu") -> dict[str, Any]:
    """For benchmarks/run_all.py: every case (``smoke``: the first training and setting of each
    task), with the worst ratio of each task."""
    import os

    import torch

    os.environ.update({k: v for k, v in bench_env().items() if k.startswith(("HF_", "TRANSFORMERS", "TOK"))})
    torch.set_num_threads(1)
    rows = []
    for task, trainings in TRAINING.items():
        for label, training in trainings[:1] if smoke else trainings:
            settings = SETTINGS[task][:1] if smoke else SETTINGS[task]
            found = measure_case(task, label, training, settings, device)
            if log:
                for r in found:
                    log(f"memory-estimate: {task}, {label}, {r['per_device']} x {r['positions']}: "
                        f"estimate / measured {r['ratio']:.3f}")  # fmt: skip
            rows += found
    worst = {t: max((abs(r["ratio"] - 1) for r in rows if r["task"] == t), default=0.0) for t in TRAINING}
    held = all(worst[task] <= 0.25 for task in MUST_HOLD if task in worst)
    return {"task": "all built-ins", "job": "saved-for-backward bytes", "device": device, "rows": rows,
            "worst": worst, "must_hold": held, "torch": torch.__version__}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true")
    p.add_argument("--smoke", action="store_true", help="one case a task")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    a = p.parse_args()
    result = measure(log=lambda line: print(line, file=sys.stderr), smoke=a.smoke, device=a.device)
    if a.json:
        print(json.dumps(result, indent=1))
        return
    for r in result["rows"]:
        measured, estimate = (r[k]["layers"] / 2**20 for k in ("measured", "estimate"))
        print(f"{r['task']:16} {r['training']:40} {r['per_device']:2} x {r['positions']:3}  "
              f"measured {measured:8.2f} MiB  estimate {estimate:8.2f} MiB  {r['ratio']:.3f}")  # fmt: skip
    print("worst |estimate / measured - 1|:", {k: round(v, 3) for k, v in result["worst"].items()})
    print("within 25 % for speech-to-text, image-to-text, vision-language:", result["must_hold"])


if __name__ == "__main__":
    main()
