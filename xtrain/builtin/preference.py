"""``builtin:preference-pairs``: deterministic preference pairs for the preference quickstart.

Each prompt asks about a tiny story's character; the chosen answer is a whole, friendly sentence
that names the place, the rejected one a curt fragment. One style is preferred throughout, so a
policy that learns the preference ranks every eval pair right (reward accuracy near 1), while an
untrained one (the policy equal to its reference) scores chance (0.5).
"""

from __future__ import annotations

import random

from xtrain.builtin.text import _ANIMALS, _NAMES, _PLACES, _THINGS

# the prompt ``xtrain predict`` is shown after the quickstart (one of the eval split's shape)
QUICKSTART_PROMPT = "question: where did tom play with the cat? answer: "


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
