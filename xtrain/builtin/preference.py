"""``builtin:preference-pairs``: deterministic preference pairs for the preference quickstart.

Each prompt asks about a tiny story's character; the chosen answer is a whole, friendly sentence
that names the place, the rejected one a curt fragment. One style is preferred throughout, so a
policy that learns the preference ranks every eval pair right (reward accuracy near 1), while an
untrained one (the policy equal to its reference) scores chance (0.5).
"""

from __future__ import annotations

import random
from pathlib import Path

from xtrain.builtin.text import _ANIMALS, _NAMES, _PLACES, _THINGS

# the prompt ``xtrain predict`` is shown after the quickstart (one of the eval split's shape); the
# GRPO quickstart's rows are these prompts too (``builtin.grpo``)
QUICKSTART_PROMPT = "question: where did tom play with the cat? answer: "


def quickstart_predict_args() -> list[str]:
    """``xtrain predict RUN ...`` arguments after the preference and GRPO quickstarts."""
    return ["--prompt", QUICKSTART_PROMPT]


def preference_examples(n: int, seed: int) -> list[dict[str, str]]:
    """``n`` rows of ``{prompt, chosen, rejected}``."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        name, animal, place, thing = (
            rng.choice(_NAMES),
            rng.choice(_ANIMALS),
            rng.choice(_PLACES),
            rng.choice(_THINGS),
        )
        if rng.random() < 0.5:
            prompt = f"question: where did {name} play with the {animal}? answer: "
            chosen = f"{name} played with the {animal} in the {place}, and they were very happy."
            rejected = f"{place}. no idea."
        else:
            prompt = f"question: what did {name} find in the {place}? answer: "
            chosen = f"{name} found a {thing} in the {place}, and it was a lovely day."
            rejected = f"a {thing}. whatever."
        out.append({"prompt": prompt, "chosen": chosen, "rejected": rejected})
    return out


SFT_STEPS = 120  # the built-in SFT warm start: enough for the tiny llama to write both styles


def build_tiny_llama_sft(base: Path, folder: Path) -> None:
    """``builtin:tiny-llama-sft``: the tiny llama at ``base`` after a short, deterministic SFT (the
    whole model, plain PyTorch) on the built-in prompts, each answered in either style at random:
    it answers friendly or curt, so preference tuning then has a choice to shift (the quickstart
    shows its answers move to the preferred style)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base, trust_remote_code=False)
    with torch.random.fork_rng(devices=[]):  # the caller's RNG stays untouched
        torch.manual_seed(4321)
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32, trust_remote_code=False)
        rng = random.Random(4321)
        rows = preference_examples(400, 1000 + 7)
        texts = [(r["prompt"], rng.choice((r["chosen"], r["rejected"]))) for r in rows]
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        model.train()
        for step in range(SFT_STEPS):
            batch = [texts[(step * 16 + k) % len(texts)] for k in range(16)]
            ids, labels = [], []
            for prompt, answer in batch:
                p = tokenizer(prompt)["input_ids"]
                a = tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
                ids.append(p + a)
                labels.append([-100] * len(p) + a)
            width = max(map(len, ids))
            pad = tokenizer.pad_token_id
            input_ids = torch.tensor([x + [pad] * (width - len(x)) for x in ids])
            mask = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in ids])
            target = torch.tensor([y + [-100] * (width - len(y)) for y in labels])
            loss = model(input_ids=input_ids, attention_mask=mask, labels=target).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
