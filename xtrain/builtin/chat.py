"""``builtin:chat`` and ``builtin:tiny-llama-chat``: the default quickstart's chat data and model.

The conversations ask three kinds of short questions (the color of a thing, where an animal is,
how a child feels), each in several phrasings, and answer each in one fixed sentence of its kind
holding the fact asked for: a closed world in the words the built-in tokenizer knows, which the
built-in tiny llama learns through LoRA in a hundred-odd steps, so the trained adapter's answers
visibly differ from the base model's noise.
The eval split draws the same kinds of questions with another seed (phrasings and words recombined).

``builtin:tiny-llama-chat`` is ``builtin:tiny-llama`` with a chat template in its tokenizer (as a
real chat model has one): training renders the conversations through it, and ``xtrain predict``
and ``xtrain chat`` render a prompt to the base model the same way, for the "before" answers.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

from xtrain.builtin.text import _ANIMALS, _NAMES, _THINGS

# Zephyr-style (examples/data/chat-template.jinja): each turn is <|role|>, a newline, the text and
# the eos token, which ends an answer (generation stops there).
CHAT_TEMPLATE = (
    "{%- for message in messages -%}\n"
    "<|{{ message['role'] }}|>\n"
    "{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "<|assistant|>\n"
    "{% endif -%}"
)

# Closed-world facts in the words the built-in tokenizer was trained on (whole-word tokens): each
# answer is the fact its question asks for, in one sentence of its kind (an answer that repeated
# the word asked about would need the tiny random model to learn copying too: many more steps).
_COLOR_OF = {
    "ball": "red", "kite": "blue", "box": "brown", "hat": "green",
    "cake": "pink", "book": "yellow", "boat": "white", "cup": "black",
}  # fmt: skip
_PLACE_OF = {
    "cat": "house", "dog": "park", "bird": "forest", "fish": "river",
    "rabbit": "garden", "frog": "hill", "duck": "beach", "bear": "school",
}  # fmt: skip
_FEELING_OF = dict(zip(_NAMES, ["happy", "glad", "sleepy", "hungry", "proud", "excited"] * 2, strict=False))

_ASK_COLOR = ["what color is the {x}?", "which color is the {x}?", "tell me the color of the {x}."]
_ASK_PLACE = ["where is the {x}?", "where does the {x} play?", "tell me where the {x} is."]
_ASK_FEELING = ["how is {x} today?", "how does {x} feel?", "tell me how {x} is."]
_KINDS = (
    (_ASK_COLOR, _COLOR_OF, "it is {y}."),
    (_ASK_PLACE, _PLACE_OF, "it is in the {y}."),
    (_ASK_FEELING, _FEELING_OF, "they feel very {y}."),
)
assert set(_COLOR_OF) == set(_THINGS) and set(_PLACE_OF) == set(_ANIMALS)


def _one(rng: random.Random) -> tuple[str, str]:
    asks, facts, answer = rng.choice(_KINDS)
    x = rng.choice(sorted(facts))
    return rng.choice(asks).format(x=x), answer.format(x=x, y=facts[x])


def chat_examples(n: int, seed: int) -> list[dict[str, list[dict[str, str]]]]:
    """``n`` rows of ``{"messages": [user, assistant]}``."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        question, answer = _one(rng)
        turns = [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
        out.append({"messages": turns})
    return out


def long_chat_examples(n: int, seed: int, turns: int = 4) -> list[dict[str, list[dict[str, str]]]]:
    """``builtin:long-chat``: ``n`` rows of ``turns`` questions and answers each (about 160 tokens
    through the chat template: longer than each process's share of a sequence split across two),
    the quickstart of sequence parallelism (``xtrain quickstart --task long``)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        messages = []
        for _ in range(turns):
            question, answer = _one(rng)
            messages += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
        out.append({"messages": messages})
    return out


PREFIX = "builtin:"
# the prompts the quickstart shows answered before and after training (one of each kind)
QUICKSTART_PROMPTS = ["what color is the kite?", "where is the frog?", "how is mia today?"]


def quickstart_predict_args() -> list[str]:
    """``xtrain predict RUN ...`` arguments after the quickstart: one of its questions."""
    return ["--prompt", QUICKSTART_PROMPTS[0]]


def build_tiny_llama_chat(base: Path, folder: Path) -> None:
    """``builtin:tiny-llama-chat``: the files of the tiny llama at ``base`` with ``CHAT_TEMPLATE``
    saved in its tokenizer (the same weights: the template is all that differs)."""
    from transformers import AutoTokenizer

    for f in base.iterdir():
        if f.is_file() and not f.name.startswith(("tokenizer", "special_tokens", "xtrain_builtin")):
            shutil.copy2(f, folder / f.name)
    tokenizer = AutoTokenizer.from_pretrained(base, trust_remote_code=False)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
