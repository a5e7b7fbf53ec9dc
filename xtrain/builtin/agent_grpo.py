"""``builtin:arithmetic`` and ``builtin:tiny-agent-grpo``: the built-in agent trained by reward
(``xtrain quickstart --task grpo-tools``, examples/grpo-tools.yaml, docs/grpo.md#agents).

The tools are a small calculator, ``square`` and ``cube`` (``TOOLS``: what ``grpo.tools`` names);
the rows ask for the square or the cube of a number, which the tiny model cannot compute
(``{"prompt": [{"role": "user", "content": "what is 17 squared?"}], "answer": "289"}``), so the
exact answer comes from calling the right tool with the number and copying its result.

``builtin:tiny-agent-grpo`` is ``builtin:tiny-agent`` after two short SFT stages of xtrain's own
(a chain of built-ins): ``builtin:tiny-agent-calls`` (``jobs/sft-tiny-agent-calls.yaml``, on
``builtin:agent-sft-calls``: every answer calls the right tool with the question's number and
copies its result), then ``jobs/sft-tiny-agent-grpo.yaml`` from it, on ``builtin:agent-sft``:
conversations where ``CALL_SHARE`` of the answers call and the rest guess in a sentence of their
own (``i think it is 57.``), which sets the choice to call without unlearning how. Greedy decoding
starts on the guess (exact answer near 0), while sampling calls a tool now and then, with the
right number: GRPO's groups learn from those episodes to call and answer exactly.
"""

from __future__ import annotations

import json
import random
from typing import Any

TOOLS = ["xtrain.builtin.agent_grpo:square", "xtrain.builtin.agent_grpo:cube"]
CALL_SHARE = 0.25  # of the second SFT's conversations: a call, its result and the answer (else a guess)
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


def sft_examples(n: int, seed: int, call_share: float = CALL_SHARE) -> list[dict[str, Any]]:
    """``n`` SFT conversations with the calculator's schemas: ``call_share`` of them call the
    right tool and answer with its result, the rest guess (``builtin:agent-sft``: the decision's
    prior, jobs/sft-tiny-agent-grpo.yaml)."""
    rng = random.Random(seed)
    tools = json.dumps(schemas())
    return [{"messages": sft_conversation(rng, call_share), "tools": tools} for _ in range(n)]


def calling_examples(n: int, seed: int) -> list[dict[str, Any]]:
    """``sft_examples`` that all call (``builtin:agent-sft-calls``: the call's arguments and the
    copy of its result, jobs/sft-tiny-agent-calls.yaml)."""
    return sft_examples(n, seed, call_share=1.0)
