"""``builtin:tiny-llama-grpo``: the tiny llama after a short SFT for the GRPO quickstart.

The SFT (plain PyTorch, deterministic, on the built-in preference prompts) answers a prompt in the
whole-sentence style only ``FRIENDLY_SHARE`` of the time, else curtly: greedy decoding starts
curt (the quickstart's regex reward, a whole sentence, near 0), while sampling still draws whole
sentences now and then: the signal GRPO's group-relative advantages learn from. The rows
themselves are ``builtin:preference-pairs`` (its ``prompt`` column; the other columns go to the
reward functions unused).
"""

from __future__ import annotations

import random
from pathlib import Path

from xtrain.builtin.preference import preference_examples

# the quickstart's reward (grpo.format_pattern): a whole sentence naming who, as the friendly
# answers of builtin:preference-pairs are; the curt ones ("park. no idea.") do not match
FORMAT_PATTERN = r"[a-z]+ (played with|found) .+, and .+\."
FRIENDLY_SHARE = 0.2  # of the SFT answers: sampled now and then, never greedy
SFT_STEPS = 150


def build_tiny_llama_grpo(base: Path, folder: Path) -> None:
    """The tiny llama at ``base`` trained whole for ``SFT_STEPS`` on the built-in prompts, each
    answered friendly with probability ``FRIENDLY_SHARE``, else curtly."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base, trust_remote_code=False)
    with torch.random.fork_rng(devices=[]):  # the caller's RNG stays untouched
        torch.manual_seed(2718)
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32, trust_remote_code=False)
        rng = random.Random(2718)
        rows = preference_examples(400, 1000 + 11)
        texts = [(r["prompt"], r["chosen"] if rng.random() < FRIENDLY_SHARE else r["rejected"]) for r in rows]
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        model.train()
        pad = tokenizer.pad_token_id
        for step in range(SFT_STEPS):
            ids, labels = [], []
            for prompt, answer in (texts[(step * 16 + k) % len(texts)] for k in range(16)):
                p = tokenizer(prompt)["input_ids"]
                a = tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
                ids.append(p + a)
                labels.append([-100] * len(p) + a)
            width = max(map(len, ids))
            input_ids = torch.tensor([x + [pad] * (width - len(x)) for x in ids])
            mask = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in ids])
            target = torch.tensor([y + [-100] * (width - len(y)) for y in labels])
            model(input_ids=input_ids, attention_mask=mask, labels=target).loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
