"""``xtrain export`` time and peak memory for a model of a few hundred million parameters.

The model: a Llama built from a ``LlamaConfig`` (``--size base``: hidden 1024, 20 layers, vocab
32000, ~300M parameters; ``micro`` for the smoke run), random weights saved in bf16 with xtrain's
built-in tokenizer and a ChatML template, and a LoRA adapter (r=16 on every linear layer, random
non-zero weights) saved as a chat run saves it (``xtrain_run.json``). Each target (``merged``,
``gguf`` f16, ``gguf`` q8_0, ``ollama`` q8_0) is one ``xtrain export`` in a fresh process, checks
included (the merge check, the GGUF read back by transformers, the template); the process reports
its wall time and its peak resident memory (``ru_maxrss``).

    python benchmarks/export.py [--size base] [--json] [--keep DIR]

``--keep DIR`` builds the model into DIR and leaves it there, or reuses what an earlier
``--keep DIR`` left (~20 s saved per run of ``--size base``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
REPO = HERE.parent.parent
# (hidden, layers, intermediate, heads, kv heads, vocab)
SIZES = {"micro": (64, 2, 176, 4, 2, 1024), "base": (1024, 20, 2816, 16, 8, 32000)}
CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
TARGETS = (("merged", "f16"), ("gguf", "f16"), ("gguf", "q8_0"), ("ollama", "q8_0"))


def build(folder: Path, size: str) -> tuple[Path, int]:
    """The base (bf16 safetensors) and a chat run's adapter; returns (run folder, parameters)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    from xtrain.builtin.text import build_tokenizer

    hidden, layers, inter, heads, kv, vocab = SIZES[size]
    tokenizer = build_tokenizer("llama")
    tokenizer.chat_template = CHATML
    config = LlamaConfig(
        hidden_size=hidden, num_hidden_layers=layers, intermediate_size=inter, num_attention_heads=heads,
        num_key_value_heads=kv, vocab_size=vocab, max_position_embeddings=2048, tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, dtype="bfloat16",
    )  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    count = sum(p.numel() for p in model.parameters())
    model.save_pretrained(folder / "base")
    tokenizer.save_pretrained(folder / "base")
    model = LlamaForCausalLM.from_pretrained(folder / "base")
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    lora = LoraConfig(r=16, lora_alpha=32, target_modules=targets, init_lora_weights=False)
    peft = get_peft_model(model, lora)
    run = folder / "run"
    peft.save_pretrained(run / "adapter")
    tokenizer.save_pretrained(run / "adapter")
    record = {"task": "causal-lm", "chat": True, "data": {}}
    (run / "adapter" / "xtrain_run.json").write_text(json.dumps(record), encoding="utf-8")
    return run, count


# ru_maxrss counts the pages of the memory-mapped GGUF file the reader touched (the kernel drops
# them under pressure); RssAnon (Linux), sampled every 20 ms, is the memory the process itself
# allocated: what has to fit in RAM
CHILD = """
import json, resource, sys, threading, time
t = time.perf_counter()
anon = [None]
def sample():
    while True:
        try:
            with open("/proc/self/status") as f:
                kib = next(int(l.split()[1]) for l in f if l.startswith("RssAnon:"))
        except (OSError, StopIteration):
            return
        anon[0] = max(anon[0] or 0, kib)
        time.sleep(0.02)
threading.Thread(target=sample, daemon=True).start()
from xtrain.cli import main
code = main(sys.argv[1:])
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
found = {"code": code, "seconds": time.perf_counter() - t, "peak_mib": peak / 1024}
found["anon_mib"] = anon[0] / 1024 if anon[0] else None
print(json.dumps(found))
"""


def one(run: Path, to: str, kind: str, out: Path) -> dict[str, Any]:
    argv = ["export", str(run), "--to", to, "--output", str(out)]
    argv += ["--type", kind] if to != "merged" else []
    done = subprocess.run([sys.executable, "-c", CHILD, *argv], capture_output=True, text=True, cwd=REPO)
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "{}"
    found = json.loads(last) if last.startswith("{") else {}
    if found.get("code") != 0:
        raise RuntimeError(f"xtrain export --to {to} failed: {done.stderr[-2000:]}")
    size = sum(p.stat().st_size for p in out.iterdir())
    checks = [line for line in done.stdout.splitlines() if line.startswith("ok ")]
    return {**found, "bytes": size, "checks": checks}


def _built(folder: Path, size: str, log: Any) -> tuple[Path, int]:
    """The run to export: built into ``folder``, or the one an earlier ``--keep`` left there."""
    marker = folder / "built.json"
    if marker.exists():
        found = json.loads(marker.read_text(encoding="utf-8"))
        if found.get("size") == size:
            log(f"export: reusing the {found['parameters'] / 1e6:.0f}M-parameter llama in {folder}")
            return folder / "run", int(found["parameters"])
    shutil.rmtree(folder / "base", ignore_errors=True)
    shutil.rmtree(folder / "run", ignore_errors=True)
    t = time.perf_counter()
    run, count = build(folder, size)
    log(f"export: built a {count / 1e6:.0f}M-parameter llama + adapter in {time.perf_counter() - t:.0f} s")
    marker.write_text(json.dumps({"size": size, "parameters": count}), encoding="utf-8")
    return run, count


def _import_mib() -> float:
    """The export process's floor: ru_maxrss after the imports an export makes, before any weight."""
    code = (
        "import resource, torch, transformers, peft, accelerate, gguf; from xtrain.cli import main; "
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    return float(done.stdout.strip().splitlines()[-1])


def measure(size: str = "base", log: Any = print, keep: Path | None = None) -> dict[str, Any]:
    from xtrain.machine.probe import collect

    folder = keep or Path(tempfile.mkdtemp(prefix="xtrain-export-bench-"))
    folder.mkdir(parents=True, exist_ok=True)
    outputs = Path(tempfile.mkdtemp(prefix="xtrain-export-out-", dir=folder))
    try:
        run, count = _built(folder, size, log)
        rows = {}
        for to, kind in TARGETS:
            name = f"{to} {kind}" if to != "merged" else "merged"
            rows[name] = one(run, to, kind, outputs / name.replace(" ", "-"))
            log(f"export: {name}: {rows[name]['seconds']:.1f} s, peak {rows[name]['peak_mib']:.0f} MiB")
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
        base_bytes = sum(p.stat().st_size for p in (folder / "base").glob("*.safetensors"))
    finally:
        shutil.rmtree(outputs if keep else folder, ignore_errors=True)
    facts = collect(quick=True)
    return {
        "size": size, "parameters": count, "base_bytes": base_bytes, "rows": rows,
        "cpu": facts.cpu_model if hasattr(facts, "cpu_model") else None,
        "cpus": os.cpu_count(), "load": load, "import_mib": _import_mib(),
        "measured": time.strftime("%Y-%m-%d"),
    }  # fmt: skip


def render(r: dict[str, Any]) -> str:
    """The performance page's section."""
    load = f", load average {r['load']:.1f} on {r['cpus']} CPUs" if r.get("load") is not None else ""
    lines = [
        "## Export",
        "",
        f"`xtrain export` of a chat run on a {r['parameters'] / 1e6:.0f}M-parameter Llama (random weights, "
        f"bf16 on disk: {r['base_bytes'] / 2**20:.0f} MiB; LoRA r=16 on every linear layer), each target "
        "in a fresh process with its checks (merge vs base + adapter, the GGUF read back by "
        "transformers, the template); measured "
        f"{r['measured']} on this CPU machine{load} (`python benchmarks/export.py`).",
        "Peak RSS is the process's `ru_maxrss`, which also counts the pages of the memory-mapped GGUF "
        "file that the read-back touched (the kernel can drop them); peak anonymous is the memory the "
        "process allocated itself (RssAnon, sampled every 20 ms): what has to fit in RAM.",
    ]
    if r.get("import_mib"):
        lines.append(f"The process holds {r['import_mib']:.0f} MiB once imported, before any weight loads.")
    lines += [
        "",
        "| target | time (s) | peak RSS (MiB) | peak anonymous (MiB) | output (MiB) |",
        "|---|---|---|---|---|",
    ]
    for name, row in r["rows"].items():
        size = row["bytes"] / 2**20
        anon = f"{row['anon_mib']:.0f}" if row.get("anon_mib") else "-"
        lines.append(f"| {name} | {row['seconds']:.1f} | {row['peak_mib']:.0f} | {anon} | {size:.0f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", choices=sorted(SIZES), default="base")
    p.add_argument("--json", action="store_true")
    p.add_argument("--keep", type=Path, default=None, metavar="DIR", help="build into DIR, or reuse it")
    a = p.parse_args()
    result = measure(a.size, log=lambda m: print(m, file=sys.stderr), keep=a.keep)
    print(json.dumps(result, indent=1) if a.json else render(result))


if __name__ == "__main__":
    main()
