"""GRPO's generation alone on one device: xtrain's decode loop on the model's own cache, on a static
cache, and on a static cache with the compiled step (CUDA graphs), against transformers'
``generate`` sampling every completion's own copy of the prompt (what a trainer without vLLM does).
A random Llama built from a config (``--size``: ``512``, hidden 512 / 4 layers as
benchmarks/grpo_vs_trl.py; ``0.5b``, Qwen2.5-0.5B's shape: hidden 896, 24 layers, 151,936 tokens),
LoRA r=8 on q/k/v/o, 2 prompts x 8 completions of ``--new`` tokens after prompts of ``--prompt``
tokens, bf16 autocast on CUDA (float32 on the CPU). Each variant warms up (the compiled one
compiles there), then the median wall time of ``--repeats`` rounds; completion tokens a second.
Every token is generated (no stop token), so all variants do the same work.

    python benchmarks/grpo_decode.py --device cuda --size 0.5b --json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from typing import Any

SIZES = {
    "512": {"hidden_size": 512, "intermediate_size": 1376, "num_hidden_layers": 4, "num_attention_heads": 8,
            "num_key_value_heads": 4, "vocab_size": 702},
    "0.5b": {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
             "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151_936},
}  # fmt: skip


def measure(device: str = "cuda", size: str = "512", prompt: int = 256, new: int = 128, repeats: int = 5,
            log: Any = print) -> dict[str, Any]:  # fmt: skip
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    from xtrain.model.decoding import DecodeSettings, Sampling, generate

    torch.manual_seed(0)
    positions = prompt + new + 8
    config = LlamaConfig(**SIZES[size], max_position_embeddings=positions, pad_token_id=0, eos_token_id=1)
    model = LlamaForCausalLM(config).to(device)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj"]
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=targets)).eval()
    groups, group = 2, 8
    ids = torch.randint(2, config.vocab_size, (groups, prompt), device=device)
    mask = torch.ones_like(ids)
    seeds = list(range(groups * group))
    autocast = torch.autocast("cuda", torch.bfloat16) if device == "cuda" else contextlib.nullcontext()
    common = {"max_new_tokens": new, "pad_id": 0, "stop": [], "group": group, "sampling": Sampling(1.0, 1.0),
              "seeds": seeds}  # fmt: skip
    variants = {
        "xtrain, the model's cache": lambda: generate(model, ids, mask, **common),
        "xtrain, static cache": lambda: generate(
            model, ids, mask, **common, settings=DecodeSettings(True, False, prompt + new)
        ),
        "transformers generate, each prompt copied": lambda: model.generate(
            input_ids=ids.repeat_interleave(group, 0), attention_mask=mask.repeat_interleave(group, 0),
            max_new_tokens=new, min_new_tokens=new, do_sample=True, top_k=0, top_p=1.0, pad_token_id=0,
        ),
    }  # fmt: skip
    if device == "cuda":
        variants["xtrain, static cache, compiled step"] = lambda: generate(
            model, ids, mask, **common, settings=DecodeSettings(True, True, prompt + new)
        )

    def seconds_of(fn: Any) -> float:
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device == "cuda":  # the GPU's work done, not just queued
            torch.cuda.synchronize()
        return time.perf_counter() - start

    rows = {}
    for name, fn in variants.items():
        with torch.no_grad(), autocast:
            warm = seconds_of(fn)  # the compiled variant compiles here
            seconds = statistics.median(seconds_of(fn) for _ in range(repeats))
        rows[name] = {"seconds": seconds, "tokens_per_s": groups * group * new / seconds, "first": warm}
        log(f"grpo_decode {size} {device}: {name}: {seconds:.3f} s, {rows[name]['tokens_per_s']:.0f} tok/s "
            f"(first call {warm:.1f} s)")  # fmt: skip
    return {"device": device, "size": size, "prompt": prompt, "new": new, "rows": rows,
            "gpu": torch.cuda.get_device_name() if device == "cuda" else None}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda")
    p.add_argument("--size", default="512", choices=sorted(SIZES))
    p.add_argument("--prompt", type=int, default=256)
    p.add_argument("--new", type=int, default=128)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", action="store_true", help="print one RESULT JSON line at the end")
    a = p.parse_args()
    result = measure(a.device, a.size, a.prompt, a.new, a.repeats)
    if a.json:
        print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
