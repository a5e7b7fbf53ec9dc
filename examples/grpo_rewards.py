"""Reward functions of your own for GRPO (examples/grpo.yaml, docs/grpo.md#reward-functions).

TRL's signature: ``f(prompts, completions, **columns) -> list[float | None]``: the prompts and the
completions of the batch (text, or lists of turns for conversational rows), and every other column
of the rows as a keyword list; one float per completion, None for "no reward from this function".
A TRL reward function works unchanged."""


def _text(completion):
    return completion[-1]["content"] if isinstance(completion, list) else completion


def brevity(prompts, completions, **columns):
    """1 for an answer under 200 characters, falling to 0 at 600."""
    return [max(0.0, min(1.0, (600 - len(_text(c))) / 400)) for c in completions]


def correct_number(prompts, completions, answer, **columns):
    """1 when the last number in the completion is the row's answer; None when the row has none."""
    import re

    out = []
    for c, a in zip(completions, answer, strict=True):
        if a is None:
            out.append(None)
            continue
        numbers = re.findall(r"-?\d+", _text(c))
        out.append(1.0 if numbers and numbers[-1] == str(a) else 0.0)
    return out
