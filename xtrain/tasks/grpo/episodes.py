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

Generation is xtrain's decode loop (``xtrain.model.decoding.Decoder``): a group's prompt encoded
once and its cache shared by the group's episodes; after a turn the finished episodes leave the
cache (``keep``) and the others' tool turns are appended to it (``extend``), so a later turn
encodes only the new tokens (docs/grpo.md says what a turn costs). Sampling is seeded per episode
and turn: turn 0 by (seed, step, row, sample) as a plain completion, turn t by that seed mixed
with t; each turn generates the episodes still going of one micro-batch together, the same ones
at any process count, so 1 and 2 processes and a resume draw the same episodes when the tools
are deterministic.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from xtrain.data.sampler import mix_seed
from xtrain.errors import XtrainError
from xtrain.tasks.text import tool_calls

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from xtrain.config.schema import TrainConfig
    from xtrain.data.rows.chat import Render
    from xtrain.model.decoding import Decoder, Sampling
    from xtrain.tasks.contract import Loaded, PredictRequest
    from xtrain.tasks.grpo.rows import PromptEncoder
    from xtrain.tasks.grpo.tools import Runner

Message = dict[str, Any]


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
    """The tokens between a calling turn (ended by its end token) and the model's next turn: the
    tool results as the template renders them, and the assistant's turn opened again. Found in a
    stand-in conversation (a user turn, a call, the results) rendered whole: what follows the end
    token that closes the call's turn. (Rendering the call's turn alone would not do: Qwen3 renders
    a last turn with an empty thinking block it drops once a result follows.)"""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, render: Render, eos: list[int]) -> None:
        self.tokenizer, self.render, self.eos = tokenizer, render, set(eos)

    def ids(self, results: list[Message]) -> list[int]:
        calls = [
            {"id": r["tool_call_id"], "type": "function", "function": {"name": r["name"], "arguments": {}}}
            for r in results
        ]
        user = [{"role": "user", "content": "hi"}]
        before = [*user, {"role": "assistant", "content": "", "tool_calls": calls}]
        tokens = lambda text: list(self.tokenizer(text, add_special_tokens=False)["input_ids"])  # noqa: E731
        opened, full = tokens(self.render(user, False)), tokens(self.render(before + results, True))
        end = next((i for i in range(len(opened), len(full)) if full[i] in self.eos), None)
        if full[: len(opened)] != opened or end is None:
            raise XtrainError(
                "the chat template does not close a calling turn with an end token before its tool "
                "results: an episode cannot continue the model's own tokens",
                "use a template that appends tool turns (qwen2.5, qwen3, llama3.1, llama3.2, mistral)",
            )
        return full[end + 1 :]


class Agent:
    """Runs the episodes of a batch of prompts (``run``) with the tools (``runner``), the template's
    tool turns and the limits."""

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, turns: ToolTurns, runner: Runner, limits: Limits
    ) -> None:
        self.tokenizer, self.turns, self.runner, self.limits = tokenizer, turns, runner, limits

    def run(
        self,
        decoder: Decoder,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        group: int,
        sampling: Sampling | None,
        seeds: list[int] | None,
    ) -> list[Episode]:
        """``group`` episodes of each left-padded prompt (rows ``b * group + k``), sampled at
        ``sampling`` from ``seeds`` (one an episode) or greedy (None): the prompts encoded once,
        then turn by turn the episodes still going, each turn's tool results appended to their
        context in the decoder's cache (module docstring)."""
        lim = self.limits
        decoder.prefill(prompt_ids, prompt_mask, group)
        episodes = [Episode(seeds[i] if seeds else None) for i in range(prompt_ids.size(0) * group)]
        going, turn = list(episodes), 0
        with self.runner.session():
            while True:
                room = max(lim.max_episode_length - len(e.ids) for e in going)
                turn_seeds = [mix_seed(e.seed, turn) if turn else e.seed for e in going] if seeds else None
                done = decoder.decode(min(lim.max_completion_length, room), sampling, turn_seeds)
                between = [
                    self._turn(e, done.ids[k, : int(done.mask[k].sum())].tolist(), bool(done.truncated[k]))
                    for k, e in enumerate(going)
                ]
                kept = [k for k, e in enumerate(going) if not e.done]
                if not kept:
                    return episodes
                if len(kept) < len(going):
                    decoder.keep(torch.tensor(kept))
                going = [going[k] for k in kept]
                decoder.extend(*left_padded([between[k] for k in kept], self.pad, prompt_ids.device))
                turn += 1

    @property
    def pad(self) -> int:
        tok = self.tokenizer
        return tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id

    def _turn(self, e: Episode, tokens: list[int], cut: bool) -> list[int]:
        """One turn's ``tokens`` into the episode: its calls run and their results appended (the
        tokens the next turn reads first, returned), or the episode done (an answer, a turn cut,
        the last turn, no room left: nothing returned)."""
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
            return []
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
            return []
        between = self.turns.ids(results)
        if len(e.ids) + len(between) >= lim.max_episode_length:  # no room for the next turn
            e.truncated = e.done = True
            return []
        e.ids += between
        e.trained += [0] * len(between)
        e.messages += results
        return between

    def _outcome(self, e: Episode, call: dict[str, Any]) -> str:
        """A call's result as the model reads it (the episode's calls counted against the limit)."""
        if len(e.calls) >= self.limits.max_tool_calls:  # (this call not yet among them)
            e.failures += 1
            return f"error: no tool calls left (grpo.max_tool_calls={self.limits.max_tool_calls})"
        found = self.runner.call(call["name"], call["arguments"])
        e.failures += not found.ok
        return found.text


def check_prompts(encoder: PromptEncoder, rows: list[Any]) -> None:
    """Episodes' prompts: conversational rows under a template that renders tools (one line each
    when not; the dry run and the build)."""
    from xtrain.data import templates

    if encoder.template is None or not rows[0].conversational:
        raise XtrainError(
            "grpo.tools needs conversational prompts under a chat template: the tools and their "
            "results are turns the template renders",
            'write the prompts as turns ({"prompt": [{"role": "user", "content": ...}]}) and set '
            "data.chat_template if the tokenizer has none",
        )
    if not templates.renders_tools(encoder.template):
        raise XtrainError(
            "grpo.tools: the chat template cannot render tools (no 'tools' in its source)",
            "set data.chat_template to a tools-aware template: qwen2.5, qwen3, llama3.1, llama3.2, "
            "mistral, or a file (docs/agents.md)",
        )


def agent_of(cfg: TrainConfig, encoder: PromptEncoder, rows: list[Any], eos: list[int]) -> Agent | None:
    """``grpo.tools``' episodes (None without tools): conversational prompts under a template
    that renders tools, checked here in one line each."""
    from xtrain.data.rows import chat as chat_data
    from xtrain.tasks.grpo import tools as tools_

    found = tools_.from_config(cfg)
    if not found:
        return None
    g = cfg.grpo
    check_prompts(encoder, rows)
    render = chat_data.renderer(encoder.tokenizer, encoder.template, cfg.data.chat_template)
    turns = ToolTurns(encoder.tokenizer, render, eos)
    probe = {"role": "tool", "content": "1", "tool_call_id": "call00001", "name": found[0].name}
    turns.ids([probe])  # the template closes a calling turn: one line here when it does not
    limits = Limits(g.max_turns, g.max_completion_length, g.max_episode_length, g.max_tool_calls)
    return Agent(encoder.tokenizer, turns, tools_.Runner(found, g.tool_timeout), limits)


def episode_stats(
    turns: torch.Tensor, calls: torch.Tensor, failed: torch.Tensor, m: int
) -> dict[str, torch.Tensor]:
    """The step's episodes (``turns``, ``calls``, ``failed``: sums over the ``m`` micro-batches of
    each completion slot): turns and calls an episode, the share of calls that failed (TRL's
    ``tools/call_frequency``, ``tools/failure_frequency``)."""
    episodes = float(turns.numel() * m)
    made = float(calls.sum())
    return {
        "episodes/turns": turns.sum() / episodes,
        "tools/call_frequency": calls.sum() / episodes,
        "tools/failure_frequency": failed.sum() / made if made else torch.tensor(0.0),
    }


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


def calls_shown(e: Episode) -> str:
    """An episode's calls on one line, each with its result (``square {"n": 17} -> 289``)."""
    parts = []
    for c in e.calls:
        result = c["result"]
        ran = f" -> {' '.join(result.split())[:200]}" if result is not None else " (not run)"
        parts.append(tool_calls.shown([c]) + ran)
    return "; ".join(parts)


def shown(e: Episode) -> str:
    """An episode on one line: its calls with their results, then the answer
    (``square {"n": 17} -> 289 | 289``)."""
    calls = calls_shown(e)
    return f"{calls} | {e.answer}" if calls else e.answer


AGENT_TURNS, AGENT_CALLS, TOOL_SECONDS = 4, 8, 10.0  # an episode's limits in predict (grpo's defaults)


def predict_episodes(
    loaded: Loaded,
    texts: list[str],
    render: Render,
    stop: int | None,
    request: PredictRequest,
    done: list[Episode] | None = None,
) -> list[dict[str, str]]:
    """``xtrain predict --tools`` naming functions: each prompt (``texts``, rendered with the
    tools) an episode as in training: the model's calls run (``request.functions``), their results
    given back in the template's tool turns, until it answers or has taken ``AGENT_TURNS`` turns
    of up to ``max_new_tokens`` each; greedy, or sampled from ``--seed`` and the prompt's index.
    Each row: the prompt, the final answer, the calls with their results; ``done`` (when given)
    gets each episode (the rewards' completions and calls)."""
    import random

    from xtrain.model.decoding import Decoder, Sampling
    from xtrain.tasks.grpo.tools import Runner
    from xtrain.tasks.predicting import pad_id, to_model

    tokenizer, model = loaded.tokenizer, loaded.model
    eos = [t for t in (stop, tokenizer.eos_token_id) if t is not None]
    n = request.max_new_tokens
    limits = Limits(AGENT_TURNS, n, AGENT_TURNS * n * 2, AGENT_CALLS)
    agent = Agent(
        tokenizer, ToolTurns(tokenizer, render, eos), Runner(request.functions or [], TOOL_SECONDS), limits
    )
    base = request.seed if request.seed is not None else random.randrange(2**62)
    rows = []
    for i, (prompt, text) in enumerate(zip(request.prompts, texts, strict=True)):
        enc = to_model(dict(tokenizer(text, return_tensors="pt", add_special_tokens=False)), model)
        sampling = Sampling(request.temperature or 1.0, request.top_p or 1.0) if request.sampling else None
        seeds = [mix_seed(base, i)] if sampling else None
        decoder = Decoder(model, pad_id(tokenizer), eos)
        e = agent.run(decoder, enc["input_ids"], enc["attention_mask"], 1, sampling, seeds)[0]
        rows.append({"input": prompt, "output": e.answer, "calls": calls_shown(e)})
        if done is not None:
            done.append(e)
    return rows
