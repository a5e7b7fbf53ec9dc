"""``builtin:arithmetic`` and ``builtin:tiny-agent-grpo``: the built-in agent trained by reward
(``xtrain quickstart --task grpo-tools``, examples/grpo-tools.yaml, docs/grpo.md#agents).

The tools are a small calculator, ``square`` and ``cube`` (``TOOLS``: what ``grpo.tools`` names);
the rows ask for the square or the cube of a number, which the tiny model cannot compute
(``{"prompt": [{"role": "user", "content": "what is 17 squared?"}], "answer": "289"}``), so the
exact answer comes from calling the right tool with the number and copying its result.

``builtin:tiny-agent-grpo`` is ``builtin:tiny-agent`` after a short SFT (plain PyTorch,
deterministic) on conversations rendered by its own template, where about a quarter of the
answers open with a call of the right tool and answer with its result, and the rest guess in a
sentence of their own (``i think it is 57.``). Greedy decoding starts on the guess (exact answer
near 0), while sampling calls a tool now and then: GRPO's groups learn from those episodes to call
and answer exactly.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

TOOLS = ["xtrain.builtin.agent_grpo:square", "xtrain.builtin.agent_grpo:cube"]
CALL_SHARE = 0.5  # of the SFT conversations: a call, its result and the answer (else a guess)
DECIDE_SHARE = 1 / 3  # of those, the ones whose choice to call trains: a call opens ~1/4 of answers
SFT_STEPS = 800
QUICKSTART_PROMPT = "what is 17 squared?"
_NUMBERS = range(2, 36)  # one token each (with its space) in the tiny agent's vocabulary


def square(n: int) -> int:
    """The square of a whole number.

    Args:
        n: the number to square
    """
    return n * n


def cube(n: int) -> int:
    """The cube of a whole number.

    Args:
        n: the number to cube
    """
    return n * n * n


_ASK = {
    "square": ["what is {n} squared?", "what is the square of {n}?", "square {n}."],
    "cube": ["what is {n} cubed?", "what is the cube of {n}?", "cube {n}."],
}
_DO = {"square": square, "cube": cube}


def _question(rng: random.Random) -> tuple[str, dict[str, int], str]:
    """(the question, the call's arguments, its function's name)."""
    name = rng.choice(sorted(_ASK))
    args = {"n": rng.choice(_NUMBERS)}
    return rng.choice(_ASK[name]).format(**args), args, name


def arithmetic_examples(n: int, seed: int) -> list[dict[str, Any]]:
    """``n`` prompt rows: a question as the user's turn, and the right ``answer``
    (``builtin:arithmetic``: 400 training rows and 100 eval ones, fresh draws)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        question, args, name = _question(rng)
        out.append({"prompt": [{"role": "user", "content": question}], "answer": str(_DO[name](**args))})
    return out


def schemas() -> list[dict[str, Any]]:
    """The calculator's schemas as ``grpo.tools`` derives them (signature and docstring)."""
    from transformers.utils import get_json_schema

    out = []
    for fn in (square, cube):
        schema = get_json_schema(fn)
        schema["function"].pop("return", None)
        out.append(schema)
    return out


def sft_conversation(rng: random.Random, call_share: float = CALL_SHARE) -> list[dict[str, Any]]:
    """One SFT conversation: the call, its result and the answer (``call_share``), else a guess."""
    question, args, name = _question(rng)
    user = {"role": "user", "content": question}
    if rng.random() >= call_share:
        return [user, {"role": "assistant", "content": f"i think it is {rng.randint(4, 400)}."}]
    call = {"id": "call00001", "type": "function", "function": {"name": name, "arguments": args}}
    result = str(_DO[name](**args))
    return [
        user,
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": result, "tool_call_id": "call00001", "name": name},
        {"role": "assistant", "content": result},
    ]


def _labelled(
    tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
) -> tuple[list, list]:
    """(token ids, labels): the assistant turns train (-100 elsewhere), each piece tokenized on its
    own between the template's special tokens, as the episodes join them."""

    def text(k: int, opened: bool) -> str:
        return tokenizer.apply_chat_template(
            messages[:k], tools=tools, tokenize=False, add_generation_prompt=opened
        )

    ids: list[int] = []
    labels: list[int] = []
    done = ""
    for k, m in enumerate(messages, start=1):
        opened = k < len(messages) and messages[k]["role"] == "assistant"
        upto = text(k, opened)
        piece = tokenizer(upto[len(done) :], add_special_tokens=False)["input_ids"]
        ids += piece
        labels += piece if m["role"] == "assistant" else [-100] * len(piece)
        done = upto
    return ids, labels


def build_tiny_agent_grpo(
    base: Path,
    folder: Path,
    steps: int = SFT_STEPS,
    call_share: float = CALL_SHARE,
    decide: float = DECIDE_SHARE,
) -> None:
    """``builtin:tiny-agent`` at ``base`` trained whole for ``steps`` on fresh
    ``sft_conversation``s (the learning rate falling linearly to 0): ``call_share`` of them call,
    ``decide`` of those with their first token (the choice to call) trained; by default a call
    opens about a quarter of the answers while every call teaches the arguments and the copy of
    the result. (Tests build a quick one that calls more often.)"""
    import torch
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base, trust_remote_code=False)
    tools = schemas()
    threads = torch.get_num_threads()
    # one thread: the same weights on every machine, and a tiny model's steps gain nothing from
    # more (on a busy machine a second thread's waiting made this build ten times slower)
    torch.set_num_threads(1)
    try:
        _sft(tokenizer, tools, base, folder, steps, call_share, decide)
    finally:
        torch.set_num_threads(threads)


def _sft(
    tokenizer: Any,
    tools: list[dict[str, Any]],
    base: Path,
    folder: Path,
    steps: int,
    call_share: float,
    decide: float,
) -> None:
    """``build_tiny_agent_grpo``'s training, written to ``folder``."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.random.fork_rng(devices=[]):  # the caller's RNG stays untouched
        torch.manual_seed(4242)
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32, trust_remote_code=False)
        rng = random.Random(4242)
        rows = []
        for _ in range(steps * 8):
            messages = sft_conversation(rng, call_share)
            ids, labels = _labelled(tokenizer, messages, tools)
            if len(messages) > 2 and rng.random() >= decide:
                labels[next(i for i, y in enumerate(labels) if y != -100)] = -100
            rows.append((ids, labels))
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / steps)
        model.train()
        pad = tokenizer.pad_token_id
        for step in range(steps):
            batch = [rows[(step * 16 + k) % len(rows)] for k in range(16)]  # two passes over the rows
            width = max(len(ids) for ids, _ in batch)
            input_ids = torch.tensor([ids + [pad] * (width - len(ids)) for ids, _ in batch])
            mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in batch])
            target = torch.tensor([y + [-100] * (width - len(y)) for _, y in batch])
            model(input_ids=input_ids, attention_mask=mask, labels=target).loss.backward()
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
