"""GRPO's episodes: with ``grpo.tools``, each completion of a group is an episode of turns. The
model writes a turn; the calls in it (parsed as ``xtrain predict --tools`` parses them:
``tasks.text.tool_calls``) run (``tools.Runner``), their results are appended as ``tool`` turns
in the chat template's own text, and the model writes again, until a turn makes no call (its
answer), ``grpo.max_turns`` turns are written, or the episode's tokens reach
``grpo.max_episode_length`` (truncated).

The episode is one token sequence after the prompt: the model's own tokens exactly as sampled
and, between its turns, the template's text around the tool results, tokenized once
(``ToolTurns``: the text the template renders after a calling turn, found by rendering a stand-in
conversation with and without the results, as TRL's ``_get_tool_suffix_ids`` does). Training reads
the same sequence: ``trained`` marks the model's tokens (the loss), the rest is context only.

Sampling is seeded per episode and turn: turn 0 by (seed, step, row, sample) as a plain completion,
turn t by that seed mixed with t; each turn generates the episodes still going of one micro-batch
together, the same ones at any process count, so 1 and 2 processes and a resume draw the same
episodes when the tools are deterministic. The first turn continues the group's prompt; a later
turn re-reads each episode's prompt and turns so far (one prefill of the whole sequence per turn:
docs/grpo.md says what a turn costs).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from xtrain.data.sampler import mix_seed
from xtrain.errors import XtrainError
from xtrain.tasks.text import tool_calls

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from xtrain.data.rows.chat import Render
    from xtrain.tasks.grpo.rollout import Completions
    from xtrain.tasks.grpo.tools import Runner

Message = dict[str, Any]
# (ids [n, L] left-padded, mask, max new tokens, per-row seeds or None: greedy) -> the turn's tokens
GenerateFn = Callable[[torch.Tensor, torch.Tensor, int, "list[int] | None"], "Completions"]


@dataclass(frozen=True)
class Limits:
    max_turns: int
    max_completion_length: int  # a turn's
    max_episode_length: int  # the episode's tokens after the prompt
    max_tool_calls: int


@dataclass
class Episode:
    """One completion of a group: its tokens after the prompt, which of them the model wrote, its
    turns (OpenAI messages: the rewards' ``completions`` entry) and the calls it made."""

    prompt: list[int]
    seed: int | None  # None: greedy (evaluation)
    ids: list[int] = field(default_factory=list)
    trained: list[int] = field(default_factory=list)  # 1: the model's token
    messages: list[Message] = field(default_factory=list)
    # {name, arguments, result}: result None for the calls of a last turn (not run)
    calls: list[dict[str, Any]] = field(default_factory=list)
    failures: int = 0  # calls whose result is an error (raised, timed out, unknown, over the limit)
    turns: int = 0
    truncated: bool = False  # ran out of a turn's or the episode's tokens
    done: bool = False

    @property
    def answer(self) -> str:
        """The text of its last turn (the final answer when it ended on one)."""
        last = self.messages[-1] if self.messages else {}
        return str(last.get("content", ""))


class ToolTurns:
    """The tokens between a calling turn (ended by its end-of-turn token) and the model's next
    turn: the tool results as the template renders them, and the assistant's turn opened again."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, render: Render, eos: list[int]) -> None:
        self.tokenizer, self.render, self.eos = tokenizer, render, set(eos)

    def ids(self, results: list[Message]) -> list[int]:
        calls = [
            {"id": r["tool_call_id"], "type": "function", "function": {"name": r["name"], "arguments": {}}}
            for r in results
        ]
        before = [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "", "tool_calls": calls},
        ]
        tokens = lambda text: list(self.tokenizer(text, add_special_tokens=False)["input_ids"])  # noqa: E731
        prefix, full = tokens(self.render(before, False)), tokens(self.render(before + results, True))
        ends = [i for i, t in enumerate(prefix) if t in self.eos]
        if ends:  # the model's turn ends at its end token: the template's text after it comes here
            prefix = prefix[: ends[-1] + 1]
        if full[: len(prefix)] != prefix:
            raise XtrainError(
                "the chat template renders a tool result by changing the turn before it: an episode "
                "cannot continue the model's own tokens",
                "use a template that appends tool turns (qwen2.5, qwen3, llama3.1, llama3.2, mistral)",
            )
        return full[len(prefix) :]


class Agent:
    """Runs the episodes of a batch of prompts (``run``) with the tools (``runner``), the template's
    tool turns and the limits."""

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, turns: ToolTurns, runner: Runner, limits: Limits
    ) -> None:
        self.tokenizer, self.turns, self.runner, self.limits = tokenizer, turns, runner, limits

    def run(
        self,
        generate: GenerateFn,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        seeds: list[int] | None,
    ) -> list[Episode]:
        """Every prompt's episode (``seeds``: one per row; None: greedy), turn by turn (module
        docstring): a turn generates the episodes still going together."""
        lim = self.limits
        prompts = [ids[m.bool()].tolist() for ids, m in zip(prompt_ids, prompt_mask, strict=True)]
        episodes = [Episode(p, seeds[i] if seeds else None) for i, p in enumerate(prompts)]
        going, turn = list(episodes), 0
        with self.runner.session():
            while going:
                if turn == 0:
                    ids, mask = prompt_ids, prompt_mask
                else:
                    ids, mask = left_padded([e.prompt + e.ids for e in going], self.pad, prompt_ids.device)
                room = max(lim.max_episode_length - len(e.ids) for e in going)
                turn_seeds = [mix_seed(e.seed, turn) if turn else e.seed for e in going] if seeds else None
                done = generate(ids, mask, min(lim.max_completion_length, room), turn_seeds)
                for k, e in enumerate(going):
                    n = int(done.mask[k].sum())
                    self._turn(e, done.ids[k, :n].tolist(), bool(done.truncated[k]))
                going = [e for e in going if not e.done]
                turn += 1
        return episodes

    @property
    def pad(self) -> int:
        tok = self.tokenizer
        return tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id

    def _turn(self, e: Episode, tokens: list[int], cut: bool) -> None:
        """One turn's ``tokens`` into the episode: its calls run and their results appended, or the
        episode done (an answer, a turn cut, the last turn, no room left)."""
        lim = self.limits
        room = lim.max_episode_length - len(e.ids)
        if len(tokens) > room:
            tokens, cut = tokens[:room], True
        e.ids += tokens
        e.trained += [1] * len(tokens)
        e.turns += 1
        text = self.tokenizer.decode(tokens, skip_special_tokens=True).strip()
        calls = None if cut else tool_calls.parse(text)
        message: Message = {"role": "assistant", "content": text}
        e.messages.append(message)
        if cut or not calls:
            e.truncated, e.done = cut, True
            return
        last = e.turns >= lim.max_turns  # its calls are recorded, not run: no turn would read them
        message["tool_calls"], results = [], []
        for c in calls:
            call_id = f"call{len(e.calls) + 1:05d}"
            function = {"name": c["name"], "arguments": c["arguments"]}
            message["tool_calls"].append({"id": call_id, "type": "function", "function": function})
            outcome = None if last else self._outcome(e, c)
            e.calls.append({**function, "result": outcome})
            results.append({"role": "tool", "content": outcome, "tool_call_id": call_id, "name": c["name"]})
        if last:
            e.done = True
            return
        between = self.turns.ids(results)
        if len(e.ids) + len(between) >= lim.max_episode_length:  # no room for the next turn
            e.truncated = e.done = True
            return
        e.ids += between
        e.trained += [0] * len(between)
        e.messages += results

    def _outcome(self, e: Episode, call: dict[str, Any]) -> str:
        """A call's result as the model reads it (the episode's calls counted against the limit)."""
        if len(e.calls) >= self.limits.max_tool_calls:  # (this call not yet among them)
            e.failures += 1
            return f"error: no tool calls left (grpo.max_tool_calls={self.limits.max_tool_calls})"
        found = self.runner.call(call["name"], call["arguments"])
        e.failures += not found.ok
        return found.text


def left_padded(rows: list[list[int]], pad: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], dtype=torch.long, device=device)
    mask = torch.tensor(
        [[0] * (width - len(r)) + [1] * len(r) for r in rows], dtype=torch.long, device=device
    )
    return ids, mask


def as_batch(episodes: list[Episode], pad: int, device: torch.device) -> dict[str, torch.Tensor]:
    """The episodes after their (left-padded) prompts, padded on the right: ``ids``, ``mask`` (1
    over every token the model reads), ``trained`` (the model's own tokens) and ``truncated``."""
    width = max(1, max(len(e.ids) for e in episodes))

    def padded(values: list[int], fill: int) -> list[int]:
        return values + [fill] * (width - len(values))

    return {
        "ids": torch.tensor([padded(e.ids, pad) for e in episodes], dtype=torch.long, device=device),
        "mask": torch.tensor(
            [padded([1] * len(e.ids), 0) for e in episodes], dtype=torch.long, device=device
        ),
        "trained": torch.tensor([padded(e.trained, 0) for e in episodes], dtype=torch.long, device=device),
        "truncated": torch.tensor([e.truncated for e in episodes], dtype=torch.bool, device=device),
    }


def shown(e: Episode) -> str:
    """An episode on one line: each call with its result, then the answer
    (``add {"a": 17, "b": 25} -> 42 | 42``)."""
    parts, k = [], 0
    for m in e.messages:
        if m["role"] == "assistant" and m.get("tool_calls"):
            for c in m["tool_calls"]:
                result = e.calls[k]["result"]
                k += 1
                ran = f" -> {' '.join(result.split())[:200]}" if result is not None else " (not run)"
                parts.append(tool_calls.shown([c["function"]]) + ran)
        elif m["role"] == "assistant":
            parts.append(m["content"])
    return " | ".join(parts)
