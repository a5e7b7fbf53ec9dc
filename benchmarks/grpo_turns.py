"""What a turn of a GRPO episode costs (grpo.tools; docs/grpo.md, "What a turn costs"): a group's
first turn (its prompt encoded once, the completions decoded) against a later turn, which either
appends the tool results to each episode's cache and decodes on (xtrain's episodes:
``Decoder.extend``) or encodes each episode's whole context again (what a loop over
``generate`` does). A random Llama built from a config (``--size``, benchmarks/grpo_decode.py's
shapes), LoRA r=8 on q/k/v/o, 2 prompts x 8 episodes, prompts of ``--prompt`` tokens, turns of
``--new`` tokens, tool results of ``--result`` tokens; float32 on the CPU, bf16 autocast on CUDA.
Median wall time of ``--repeats`` rounds after one warm-up. Every token is generated (no stop
token), so the variants do the same work.

    python benchmarks/grpo_turns.py --size 512 --json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from typing import Any

from grpo_decode import SIZES


def measure(device: str = "cpu", size: str = "512", prompt: int = 256, new: int = 32, result: int = 16,
            repeats: int = 5, log: Any = print) -> dict[str, Any]:  # fmt: skip
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    from xtrain.model.decoding import Decoder, Sampling

    torch.manual_seed(0)
    config = LlamaConfig(**SIZES[size], max_position_embeddings=prompt + 2 * new + result + 8,
                         pad_token_id=0, eos_token_id=1)  # fmt: skip
    model = LlamaForCausalLM(config).to(device)
    model = get_peft_model(
        model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    )
    model.eval()
    groups, group = 2, 8
    rows = groups * group
    ids = torch.randint(2, config.vocab_size, (groups, prompt), device=device)
    tool = torch.randint(2, config.vocab_size, (rows, result), device=device)
    sampling, seeds = Sampling(1.0, 1.0), list(range(rows))
    autocast = torch.autocast("cuda", torch.bfloat16) if device == "cuda" else contextlib.nullcontext()

    def timed(fn: Any) -> tuple[float, Any]:
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = fn()
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start, out

    def first_turn() -> Decoder:
        decoder = Decoder(model, 0, [])
        decoder.prefill(ids, torch.ones_like(ids), group)
        decoder.decode(new, sampling, seeds)
        return decoder

    def extended(decoder: Decoder) -> None:  # the results appended to the cache, decoded on
        decoder.extend(tool, torch.ones_like(tool))
        decoder.decode(new, sampling, seeds)

    def again(decoder: Decoder) -> None:  # each episode's whole context encoded again
        context, mask = decoder.sequence()
        fresh = Decoder(model, 0, [])
        fresh.prefill(torch.cat([context, tool], 1), torch.cat([mask, torch.ones_like(tool)], 1))
        fresh.decode(new, sampling, seeds)

    times: dict[str, list[float]] = {
        "first turn": [],
        "later turn, cache extended": [],
        "later turn, re-encoded": [],
    }
    with torch.no_grad(), autocast:
        for k in range(repeats + 1):
            seconds, decoder = timed(first_turn)
            extend_s, _ = timed(lambda decoder=decoder: extended(decoder))
            _, decoder = timed(first_turn)
            again_s, _ = timed(lambda decoder=decoder: again(decoder))
            if k:  # the first round warms up
                for name, s in zip(times, (seconds, extend_s, again_s), strict=True):
                    times[name].append(s)
    out = {name: {"seconds": statistics.median(t), "tokens_per_s": rows * new / statistics.median(t)}
           for name, t in times.items()}  # fmt: skip
    for name, row in out.items():
        log(f"{name}: {row['seconds'] * 1000:.0f} ms ({row['tokens_per_s']:.0f} generated tokens/s)")
    return {"device": device, "size": size, "prompt": prompt, "new": new, "result": result, "rows": rows,
            "turns": out}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--size", default="512", choices=sorted(SIZES))
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument("--result", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON line too")
    args = parser.parse_args()
    found = measure(args.device, args.size, args.prompt, args.new, args.result, args.repeats)
    if args.json:
        print(json.dumps(found))


if __name__ == "__main__":
    main()
