"""The plan's estimate with and without the memory levers, for ``benchmarks/chunked_loss.py``: a
Qwen2.5-7B-shaped LoRA on the windows-2x4090 snapshot (``plan_estimate``: the Memory line of
``xtrain train --dry-run`` at 2048 tokens, and the longest sequence each set of levers plans without
a warning), and on a CUDA GPU the same model's peak against the estimate (``measure_7b``,
``python benchmarks/chunked_loss.py --device cuda --size 7b``)."""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, half_prompt_batch  # noqa: E402

QWEN25_7B = dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", hidden_act="silu",
                 max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
                 torch_dtype="bfloat16", vocab_size=152064, tie_word_embeddings=False, hidden_size=3584,
                 intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                 num_key_value_heads=4)  # fmt: skip
# (label, overrides) of the estimate: without the levers, then adding them in the order of cost
ESTIMATES = (
    ("plain loss", ["model.chunked_loss=off"]),
    ("chunked loss", []),
    ("chunked loss + checkpointing", ["model.gradient_checkpointing=true"]),
    ("chunked loss + checkpointing + offloading",
     ["model.gradient_checkpointing=true", "model.activation_offload=true"]),
)  # fmt: skip


def plan_estimate(log: Any = None, smoke: bool = False) -> dict[str, Any]:
    """The plan's Memory line for a Qwen2.5-7B-shaped LoRA at 2048 tokens on the windows-2x4090
    snapshot (``xtrain train --dry-run``, in-process, the config.json only), with and without the
    levers; and the longest ``data.max_length`` (a multiple of 256) each fits without a warning
    (``smoke``: the 2048-token line only)."""
    import contextlib
    import io
    import re

    from xtrain.cli import main

    facts = REPO / "tests" / "fixtures" / "machines" / "windows-2x4090.json"
    found: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as folder:
        model = Path(folder) / "qwen2.5-7b"
        model.mkdir()
        (model / "config.json").write_text(json.dumps(QWEN25_7B), encoding="utf-8")
        job = Path(folder) / "job.yaml"
        job.write_text(f"model:\n  name_or_path: {model.as_posix()}\n  task: causal-lm\n"
                       "data:\n  train: builtin:tiny-stories\nbatch:\n  per_device: 1\n")  # fmt: skip

        def plan(overrides: list[str], length: int) -> tuple[float, str | None, str]:
            out = io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
                code = main(["train", str(job), *overrides, f"data.max_length={length}", "--dry-run",
                             "--facts", str(facts)])  # fmt: skip
            text = " ".join(out.getvalue().split())
            line = re.search(r"Memory: (~[^)]*\)[^w]*?)(?: warning:| Model checks| Data:|$)", text)
            gib = re.search(r"Memory: ~([\d.]+) (GiB|MiB)", text)
            assert code == 0 and line and gib, text[-2000:]
            warned = re.search(r"warning: (.*?)(?: Model checks| Data:| #|$)", text)
            value = float(gib.group(1)) / (1024 if gib.group(2) == "MiB" else 1)
            return value, warned.group(1) if warned else None, line.group(1).strip()

        for label, overrides in ESTIMATES:
            gib, warning, line = plan(overrides, 2048)
            lo, hi = 256, 32768  # the longest multiple of 256 without a warning (bisection)
            if smoke:
                longest = None
            elif plan(overrides, lo)[1] is not None:
                longest = 0
            elif plan(overrides, hi)[1] is None:
                longest = hi
            else:
                while hi - lo > 256:  # the config's 32,768 positions at most
                    mid = (lo + hi) // 2 // 256 * 256
                    lo, hi = (mid, hi) if plan(overrides, mid)[1] is None else (lo, mid)
                longest = lo
            found[label] = {"overrides": overrides, "gib": gib, "line": line, "warning": warning,
                            "longest": longest}  # fmt: skip
            if log:
                log(f"chunked-loss: estimate, {label}: {line}; longest without a warning {longest}")
    return found


SEVEN_B = (  # (label, chunked loss, gradient checkpointing, offloading)
    ("plain loss", False, False, False),
    ("chunked loss", True, False, False),
    ("chunked loss + checkpointing", True, True, False),
    ("chunked loss + checkpointing + offloading", True, True, True),
)


def measure_7b(seq: int = 2048, log: Any = None) -> dict[str, Any]:
    """CUDA: a Qwen2.5-7B-shaped model (random bf16 weights) with xtrain's default LoRA, one
    bf16-autocast step at ``seq`` tokens (half a masked prompt) a row of ``SEVEN_B``:
    ``max_memory_allocated`` against the estimate xtrain makes of the live model
    (``tasks.sizes.live_sizes``, ``memory.check_memory`` with the same levers)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from xtrain.model import memory
    from xtrain.model.chunked_loss import ChunkedLoss, LogitMap, chunk_rows
    from xtrain.model.offload import ActivationOffload
    from xtrain.tasks.sizes import live_sizes
    from xtrain.tasks.validation import load_config

    cfg = load_config(None, ["model.name_or_path=Qwen/Qwen2.5-7B", "model.task=causal-lm",
                             "data.train=rows.jsonl", f"data.max_length={seq}"])  # fmt: skip
    keys = {k: v for k, v in QWEN25_7B.items() if k not in ("architectures", "model_type", "torch_dtype")}
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = Qwen2ForCausalLM(Qwen2Config(**keys))
    torch.set_default_dtype(torch.float32)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj"]  # xtrain's default for causal-lm
    lora = LoraConfig(r=cfg.lora.r, lora_alpha=cfg.lora.alpha, lora_dropout=cfg.lora.dropout,
                      target_modules=targets)  # fmt: skip
    model = get_peft_model(model, lora)
    for p in model.parameters():
        if p.requires_grad:
            p.data = p.data.float()  # float32 master weights under autocast, as xtrain's loop keeps them
    sizes = live_sizes(model, (), cfg)
    assert sizes is not None
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    batch = half_prompt_batch(seq, QWEN25_7B["vocab_size"], "cuda")
    card = torch.cuda.get_device_properties(0)
    rows = {}
    for label, chunked, ckpt, offloaded in SEVEN_B:
        if ckpt and not model.is_gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            model.enable_input_require_grads()
        rows_a_chunk = chunk_rows(QWEN25_7B["vocab_size"])
        levers = [ChunkedLoss(model, "next-token", LogitMap(), rows_a_chunk)] if chunked else []
        levers += [ActivationOffload(model, pin=True)] if offloaded else []
        for lever in levers:
            lever.attach()
        times = []
        for _ in range(3):  # the first allocates AdamW's state
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(**batch).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        for lever in levers:
            lever.detach()
        run = memory.MemoryLevers(chunked=chunked, offload=offloaded)
        check = memory.check_memory(sizes, 1, seq, ckpt, "bf16", card.total_memory / memory.GIB, card.name,
                                    levers=run)  # fmt: skip
        rows[label] = {"peak_gib": torch.cuda.max_memory_allocated() / memory.GIB,
                       "estimate_gib": check.estimate_gib, "host_gib": check.host_gib,
                       "step_s": statistics.median(times[1:]), "loss": float(loss)}  # fmt: skip
        if log:
            r = rows[label]
            log(f"chunked-loss 7b: {label}: peak {r['peak_gib']:.2f} GiB, estimate "
                f"{r['estimate_gib']:.2f} GiB, step {r['step_s']:.3f} s")  # fmt: skip
        del loss
    return {"seq": seq, "gpu": card.name, "rows": rows, "torch": torch.__version__}
