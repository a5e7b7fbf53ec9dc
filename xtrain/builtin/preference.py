"""``builtin:preference-pairs``: deterministic preference pairs for the preference quickstart.

Each prompt asks about a tiny story's character; the chosen answer is a whole, friendly sentence
that names the place, the rejected one a curt fragment. One style is preferred throughout, so a
policy that learns the preference ranks every eval pair right (reward accuracy near 1), while an
untrained one (the policy equal to its reference) scores chance (0.5).
"""

from __future__ import annotations

import random

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


def sft_examples(n: int, seed: int, friendly: float = 0.5) -> list[dict[str, str]]:
    """``n`` prompt/response rows of the built-in prompts, each answered friendly with probability
    ``friendly``, else curtly: the SFT data of ``builtin:tiny-llama-sft`` (either style:
    ``builtin:preference-sft``) and ``builtin:tiny-llama-grpo`` (mostly curt:
    ``builtin:preference-sft-curt``), trained by xtrain's own SFT stage (jobs/sft-*.yaml)."""
    rng = random.Random(seed)
    rows = preference_examples(n, seed)
    out = []
    for r in rows:
        answer = r["chosen"] if rng.random() < friendly else r["rejected"]
        out.append({"prompt": r["prompt"], "response": answer})
    return out


def curt_sft_examples(n: int, seed: int) -> list[dict[str, str]]:
    """``sft_examples`` answered friendly a fifth of the time (``builtin:preference-sft-curt``)."""
    return sft_examples(n, seed, friendly=0.2)
