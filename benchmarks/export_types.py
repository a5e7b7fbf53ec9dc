"""Each GGUF ``--type`` of ``xtrain export``: the file's size and how far its logits are from the
merged model's (the export's own read-back check: the largest |logit difference| over the probe
prompts, relative to the largest |logit|), on models built from configs with random weights.

The models (each a chat run: xtrain's built-in tokenizer, a ChatML template, a LoRA adapter with
random non-zero weights on every linear layer, merged once with ``--to merged``; each type is then
one ``xtrain export MERGED --to gguf --type T`` of that folder):

- ``tiny``: the built-in tiny llama (64 wide: no row divides into a K-quant's 256-value blocks,
  so the K types fall back as llama.cpp's do: Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0);
- ``small``: a 256-wide, 4-layer Llama (every matrix in its K-quant);
- ``medium``: a 768-wide, 12-layer Llama with a 32000-token vocabulary (~130M parameters).

    python benchmarks/export_types.py [--model tiny|small|medium ...] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))

TYPES = ("f16", "q8_0", "q6_k", "q5_k_m", "q4_k_m", "q4_0")
# (hidden, layers, intermediate, heads, kv heads, vocab); None: the built-in tiny llama
MODELS: dict[str, tuple[int, int, int, int, int, int] | None] = {
    "tiny": None,
    "small": (256, 4, 768, 4, 2, 0),
    "medium": (768, 12, 2048, 12, 4, 32000),
}


def build(folder: Path, model: str) -> tuple[Path, int]:
    """A chat run's folder (base + adapter) for ``model``; returns (run folder, parameters)."""
    import torch
    from export import CHATML
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    from xtrain import builtin
    from xtrain.builtin.text import build_tokenizer

    tokenizer = build_tokenizer("llama")
    tokenizer.chat_template = CHATML
    shape = MODELS[model]
    if shape is None:
        base = builtin.ensure_builtin_model("builtin:tiny-llama", folder / "cache")
    else:
        hidden, layers, inter, heads, kv, vocab = shape
        config = LlamaConfig(
            hidden_size=hidden, num_hidden_layers=layers, intermediate_size=inter, num_attention_heads=heads,
            num_key_value_heads=kv, vocab_size=vocab or len(tokenizer), max_position_embeddings=2048,
            tie_word_embeddings=False, bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )  # fmt: skip
        torch.manual_seed(0)
        base = folder / "base"
        LlamaForCausalLM(config).save_pretrained(base)
        tokenizer.save_pretrained(base)
    torch.manual_seed(0)
    loaded = AutoModelForCausalLM.from_pretrained(base)
    count = sum(p.numel() for p in loaded.parameters())
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    lora = LoraConfig(r=8, lora_alpha=16, target_modules=targets, init_lora_weights=False)
    peft = get_peft_model(loaded, lora)
    run = folder / "run"
    peft.save_pretrained(run / "adapter")
    tokenizer.save_pretrained(run / "adapter")
    record = {"task": "causal-lm", "chat": True, "data": {}}
    (run / "adapter" / "xtrain_run.json").write_text(json.dumps(record), encoding="utf-8")
    return run, count


def measure(model: str, log: Any = print) -> dict[str, Any]:
    """Each type's export of ``model``, measured (``within_limit``: whether the logits stay within
    the level past which the export warns, ``parity.COST_WARN``)."""
    from xtrain.export import parity
    from xtrain.export.pipeline import ExportRequest, export

    limits = dict(parity.COST_WARN)  # what the export warns past (it never refuses a cost)

    with tempfile.TemporaryDirectory(prefix="xtrain-export-types-") as tmp:
        folder = Path(tmp)
        run, count = build(folder, model)
        export(ExportRequest(str(run), "merged", folder / "merged"))
        rows = {}
        for kind in TYPES:
            t = time.perf_counter()
            merged = str(folder / "merged")
            request = ExportRequest(merged, "gguf", folder / kind, gguf_type=kind, eval_prompts=0)
            result = export(request)
            weights = next((c.detail for c in result.checks if c.name == "quantized"), "")
            rows[kind] = {
                "bytes": sum(result.files.values()),
                "difference": result.costs[0].logits,
                "weights": weights.split("(worst by type) ")[-1] if weights else "-",
                "seconds": time.perf_counter() - t,
            }
            rows[kind]["within_limit"] = rows[kind]["difference"] <= limits[kind]
            log(f"export types: {model} {kind}: {rows[kind]}")
    return {"model": model, "parameters": count, "rows": rows, "measured": time.strftime("%Y-%m-%d")}


def render(results: list[dict[str, Any]]) -> str:
    """One table: each model and type's file size, logits difference, and tensors' read-back error."""
    lines = [
        "| model | --type | file (MiB) | logits vs merged | tensors read back (relative rms, worst) |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        for kind, row in r["rows"].items():
            name = f"{r['model']} ({r['parameters'] / 1e6:.1f}M)"
            size, difference = f"{row['bytes'] / 2**20:.2f}", f"{row['difference']:.1e}"
            difference += "" if row["within_limit"] else " (past the export's warning level)"
            cells = [name, kind, size, difference, row.get("weights", "-")]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=list(MODELS), action="append")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    results = [measure(m, log=lambda s: print(s, file=sys.stderr)) for m in a.model or ["tiny", "small"]]
    print(json.dumps(results, indent=1) if a.json else render(results))


if __name__ == "__main__":
    main()
