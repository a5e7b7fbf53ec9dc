"""The memory levers without Triton: the chunked loss and activation offloading, measured.

A Qwen2-shaped causal LM with Qwen2's 152,064-entry vocabulary and a small body (2 layers of width
128, untied head), LoRA r=16 on q/k/v/o (the head frozen, as xtrain's default LoRA leaves it), one
sequence of 2048 tokens whose first half is a prompt (labels -100). Variants, each put into the
model's training forward the way a run does (``xtrain/model/chunked_loss.py``'s ``ChunkedLoss``,
``xtrain/model/offload.py``'s ``ActivationOffload``):

- ``plain``: the model's own loss (logits at every position, their float32 copy in the loss);
- ``chunked``: the chunked cross-entropy over the trained tokens (``how="eager"``, the default);
- ``chunked-checkpoint``: the same with ``torch.utils.checkpoint`` per chunk (``how="checkpoint"``);
- ``chunked+offload``: the chunked loss and activation offloading.

Measured, per variant:

- *saved*: the bytes autograd keeps for the backward pass at the end of the forward, counted
  exactly through ``torch.autograd.graph.saved_tensors_hooks`` (each storage once, parameters and
  buffers left out; a tensor saved and freed inside the forward, as the chunked loss's per-chunk
  graphs are, is not counted); under offloading, what stays on the device and what went to the
  host (offloading's own hooks are the innermost, so they are counted there);
- *peak*: the peak of the allocator's allocated bytes over one training step (forward, backward,
  AdamW step) above what was allocated before it. On the CPU: the CPU allocator's ``Total
  Allocated`` as PyTorch's profiler records it at every allocation (``profile_memory=True``): the
  allocator's own count, exact, unlike the process's RSS (glibc keeps freed memory) or tracemalloc
  (which does not see PyTorch's allocations). On CUDA: ``torch.cuda.max_memory_allocated``. The
  *loss peak* is the same for the loss alone (head + cross-entropy, forward and backward) on the
  body's output;
- *step time*: median wall time of a training step (not profiled), variants interleaved.

On the CPU offloading copies within host memory: its *peak* there is not a saving (its *saved on
the device* is what a GPU keeps). ``--device cuda`` runs the same in bf16 autocast on a GPU.

It also prints the plan's estimate (``xtrain/model/memory.py``, as ``xtrain train --dry-run``
shows it) for a Qwen2.5-7B-shaped LoRA at 2048 tokens on the windows-2x4090 snapshot with and
without the levers, and the longest sequence each fits on its 24 GB card without a warning
(``benchmarks/levers_estimate.py``, which also holds ``--size 7b``: on CUDA a Qwen2.5-7B-shaped
model's ``max_memory_allocated`` against the estimate).

    .venv/bin/python benchmarks/chunked_loss.py            # CPU, one compute thread, a few minutes
    .venv/bin/python benchmarks/chunked_loss.py --json
    python benchmarks/chunked_loss.py --device cuda        # on a CUDA machine
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import weakref
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import half_prompt_batch  # noqa: E402  (also puts the checkout on sys.path)

SHAPE = dict(vocab_size=152_064, hidden_size=128, intermediate_size=512, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)  # fmt: skip
VARIANTS = ("plain", "chunked", "chunked-checkpoint", "chunked+offload")


class Saved:
    """What autograd keeps for the backward pass: each saved tensor boxed, counted by storage
    while its box lives (the graph holds it), parameters and buffers left out."""

    class Box:
        __slots__ = ("__weakref__", "value")

        def __init__(self, value: Any) -> None:
            self.value = value

    def __init__(self, model: Any) -> None:
        self.weights = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
        self.boxes: list[tuple[weakref.ref, int, int, str]] = []

    def pack(self, t: Any, where: str = "device") -> Any:
        import torch

        box = Saved.Box(t)
        inner = t.host if not isinstance(t, torch.Tensor) else t  # offloading's host copy
        storage = inner.untyped_storage()
        if storage.data_ptr() not in self.weights:
            self.boxes.append((weakref.ref(box), storage.data_ptr(), storage.nbytes(), where))
        return box

    def unpack(self, box: Any) -> Any:
        return box.value

    def kept(self) -> dict[str, int]:
        seen: dict[tuple[int, str], int] = {}
        for ref, ptr, nbytes, where in self.boxes:
            if ref() is not None:
                seen[(ptr, where)] = nbytes
        return {w: sum(n for (_, where), n in seen.items() if where == w) for w in ("device", "host")}

    def wrap(self, offload: Any) -> None:
        """Count inside offloading's hooks (the innermost hooks are the ones that run)."""
        pack, unpack = offload._pack, offload._unpack

        def counted(t: Any) -> Any:
            packed = pack(t)
            return self.pack(packed, "device" if packed is t else "host")

        offload._pack = counted
        offload._unpack = lambda box: unpack(box.value)


def build(device: str) -> Any:
    """The model (``SHAPE``) with LoRA r=16 on the attention projections."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**SHAPE, max_position_embeddings=4096)).to(device)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj"]
    lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=targets)
    return get_peft_model(model, lora)


class Variant:
    """One variant's hooks on the model (``on``/``off``)."""

    def __init__(self, model: Any, name: str, pin: bool = False) -> None:
        from xtrain.model.chunked_loss import ChunkedLoss, LogitMap, chunk_rows
        from xtrain.model.offload import ActivationOffload

        self.name = name
        self.loss = None
        if name != "plain":
            how = "checkpoint" if name == "chunked-checkpoint" else "eager"
            self.loss = ChunkedLoss(model, "next-token", LogitMap(), chunk_rows(SHAPE["vocab_size"]), how)
        self.offload = ActivationOffload(model, pin=pin) if name.endswith("offload") else None

    def on(self) -> None:
        for lever in (self.loss, self.offload):
            if lever is not None:
                lever.attach()

    def off(self) -> None:
        for lever in (self.loss, self.offload):
            if lever is not None:
                lever.detach()


def allocated_peak(fn: Any, device: str) -> int:
    """Peak allocated bytes above the start while ``fn`` runs (see the module docstring)."""
    import torch

    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    with tempfile.TemporaryDirectory() as folder:
        trace = Path(folder) / "trace.json"
        prof.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text(encoding="utf-8"))["traceEvents"]
    totals = [e["args"]["Total Allocated"] for e in events if e.get("name") == "[memory]"]
    # the count starts at the profiler's start: what was allocated before is not in it
    return max(totals, default=0)


def measure(repeats: int = 3, seq: int = 2048, device: str = "cpu", log: Any = None,
            smoke: bool = False) -> dict[str, Any]:  # fmt: skip
    """For benchmarks/run_all.py: every variant's saved bytes, peaks and step times, the loss's own
    peak, and the plan's estimate for a Qwen2.5-7B-shaped LoRA (``smoke``: a 256-token sequence,
    one repeat)."""
    import torch

    from xtrain.model.chunked_loss import chunk_rows, chunked_cross_entropy

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if device == "cpu":
        torch.set_num_threads(1)
    seq, repeats = (256, 1) if smoke else (seq, repeats)
    model = build(device)
    batch = half_prompt_batch(seq, SHAPE["vocab_size"], device)
    autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda")
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    pin = device == "cuda"  # pinned host memory: the copies run beside the compute
    variants = {name: Variant(model, name, pin) for name in VARIANTS}

    def step() -> float:
        with autocast:
            loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss)

    rows: dict[str, dict[str, Any]] = {}
    for name, v in variants.items():
        v.on()
        counter = Saved(model)
        if v.offload is not None:
            counter.wrap(v.offload)
        with torch.autograd.graph.saved_tensors_hooks(counter.pack, counter.unpack), autocast:
            loss = model(**batch).loss
        saved = counter.kept()
        loss.backward()
        optimizer.zero_grad(set_to_none=True)
        del loss
        if v.offload is not None:  # back to offloading's own hooks
            v.off()
            v = variants[name] = Variant(model, name, pin)
            v.on()
        step()  # warm: AdamW's state exists before the measured step, as in a run's later steps
        peak = allocated_peak(step, device)
        rows[name] = {"saved": saved, "peak": peak, "times": [], "loss": step()}
        v.off()
        if log:
            log(f"chunked-loss: {name}: saved {saved['device'] / 2**20:.1f} MiB on the device "
                f"({saved['host'] / 2**20:.1f} MiB host), step peak {peak / 2**20:.1f} MiB")  # fmt: skip
    for _ in range(repeats):  # step times, interleaved
        for name, v in variants.items():
            v.on()
            if device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            step()
            if device == "cuda":
                torch.cuda.synchronize()
            rows[name]["times"].append(time.perf_counter() - t0)
            v.off()
    for r in rows.values():
        r["step_s"] = statistics.median(r["times"])
    plain = rows["plain"]
    for r in rows.values():
        r["peak_vs_plain"] = r["peak"] / plain["peak"]
        r["time_vs_plain"] = r["step_s"] / plain["step_s"]
    rows_per_chunk = chunk_rows(SHAPE["vocab_size"])
    hidden = torch.randn(1, seq, SHAPE["hidden_size"], device=device, requires_grad=True)
    head = model.get_output_embeddings()
    labels = batch["labels"]
    base = model.get_base_model()

    def plain_loss() -> None:
        with autocast:
            logits = head(hidden)
        base.loss_function(logits, labels, SHAPE["vocab_size"]).backward()

    def chunked(how: str) -> Any:
        def run() -> None:
            with autocast:
                loss = chunked_cross_entropy(head, hidden, labels, shift=True, rows=rows_per_chunk, how=how)
            loss.backward()

        return run

    losses = {"plain": plain_loss, "chunked": chunked("eager"), "chunked-checkpoint": chunked("checkpoint")}
    loss_peak = {}
    for name, fn in losses.items():
        fn()  # warm
        hidden.grad = None
        loss_peak[name] = allocated_peak(fn, device)
        hidden.grad = None
    from levers_estimate import plan_estimate

    estimate = plan_estimate(log, smoke) if device == "cpu" else None
    return {
        "task": "causal-lm", "job": f"Qwen2-vocabulary model ({SHAPE['vocab_size']:,}), {seq} tokens",
        "device": device, "seq": seq, "trained": seq // 2, "rows_per_chunk": rows_per_chunk,
        "shape": SHAPE, "repeats": repeats, "variants": rows, "loss_peak": loss_peak,
        "estimate": estimate, "torch": torch.__version__,
    }  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true")
    p.add_argument("--smoke", action="store_true", help="a 256-token sequence, one repeat")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--size", default="small", choices=("small", "7b"),
                   help="7b: a Qwen2.5-7B-shaped model on CUDA, peak against the estimate")  # fmt: skip
    a = p.parse_args()
    if a.size == "7b":
        from levers_estimate import measure_7b

        print(json.dumps(measure_7b(log=lambda line: print(line, file=sys.stderr)), indent=1))
        return
    r = measure(a.repeats, device=a.device, log=lambda line: print(line, file=sys.stderr), smoke=a.smoke)
    if a.json:
        print(json.dumps(r, indent=1))
        return
    mib = 2**20
    for name, v in r["variants"].items():
        saved = v["saved"]
        print(f"{name:20} on the device {saved['device'] / mib:8.1f} MiB (host {saved['host'] / mib:7.1f})"
              f"  step peak {v['peak'] / mib:8.1f} MiB ({v['peak_vs_plain']:.2f}x)  step {v['step_s']:.2f} s"
              f" ({v['time_vs_plain']:.2f}x)")  # fmt: skip
    print("loss alone, peak MiB:", {k: round(v / mib, 1) for k, v in r["loss_peak"].items()})
    for label, e in (r["estimate"] or {}).items():
        print(f"{label:45} {e['line']}  longest without a warning: {e['longest']}")


if __name__ == "__main__":
    main()
