"""``xtrain predict`` for a reward run: prompt + answer -> its reward (``scoring.Scorer``).

- ``--prompt TEXT --answer TEXT`` (each repeatable): every answer scored after every prompt; a
  chat run's prompt is a user turn (``--system`` adds a system turn before it), as it trained.
- ``--data FILE``: every row of a file, read in the shapes people have:
  - preference pairs in any shape the run trains on (``xtrain.data.rows.preference``): both answers
    scored, the output the one the model prefers, scored against ``chosen`` (the reward accuracy
    over the file);
  - one answer a row: ``{prompt, completion}`` (TRL's; ``answer``/``response`` too), KTO's
    ``{prompt, completion, label}``, a conversation ending in the answer (``messages``), and the
    rows ``xtrain predict`` writes (``input`` and ``output`` from ``--data``, ``text`` from
    ``--prompt``), so a policy's answers score in one command: ``xtrain predict POLICY --data
    prompts.jsonl -o answers.jsonl``, then ``xtrain predict RM_RUN --data answers.jsonl``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from xtrain.errors import XtrainError

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from xtrain.config.schema import TrainConfig
    from xtrain.data.rows.preference import Turns
    from xtrain.tasks.contract import Example, Loaded, PredictRequest
    from xtrain.tasks.reward.scoring import Scorer

PROMPT_KEYS = ("prompt", "input", "question")  # a row's prompt; predict writes ``input``
ANSWER_KEYS = ("completion", "answer", "response", "output", "text")  # its answer; predict: output, text
CHOSEN, REJECTED, TIE = "chosen", "rejected", "tie"
SCORER = "reward_scorer"  # Loaded.parts: the scorer, made once


def load(
    folder: Path, base: str, record: dict[str, Any]
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, dict]:
    """``Predicts.load``: the base as the one-logit classifier (``scoring.load_model``)."""
    from xtrain.tasks.reward.scoring import load_model

    return (*load_model(folder, base, record), {})


def scorer(loaded: Loaded) -> Scorer:
    """The loaded result as a ``Scorer`` (its record's data settings: the run's encoder)."""
    from xtrain.tasks.reward.scoring import Scorer, encoder_for

    if SCORER not in loaded.parts:
        data = loaded.parts.get("data") if isinstance(loaded.parts.get("data"), dict) else {}
        encoder = encoder_for(data, loaded.tokenizer, loaded.source)
        loaded.parts[SCORER] = Scorer(loaded.model, loaded.tokenizer, encoder)
    return loaded.parts[SCORER]


def run(loaded: Loaded, request: PredictRequest) -> list[dict[str, Any]]:
    """``--prompt`` x ``--answer``: one row per pair, ``{input, answer, score}``."""
    if request.inputs:
        raise XtrainError(
            f"{loaded.source} is a reward model: it scores text answers, it reads no images or audio",
            "give it --prompt TEXT and --answer TEXT",
        )
    if not request.answers:
        raise XtrainError(
            f"{loaded.source} is a reward model: it scores an answer to a prompt",
            'give --answer TEXT with --prompt TEXT, e.g. -p "What is 2+2?" -a "4" -a "5"',
        )
    system = [{"role": "system", "content": request.system}] if request.system else []
    items: list[tuple[str | Turns, str]] = []
    for prompt in request.prompts:
        turns = [*system, {"role": "user", "content": prompt}] if system else prompt
        items += [(turns, answer) for answer in request.answers]
    scores = scorer(loaded).scores(items)
    shown = [(p, a) for p in request.prompts for a in request.answers]
    return [{"input": p, "answer": a, "score": s} for (p, a), s in zip(shown, scores, strict=True)]


def read_file(cfg: TrainConfig, record: dict[str, Any]) -> list[Example]:
    """``FileRows.read``: every row as a pair or one answer (the module docstring's shapes); a row
    of none of them is one line naming it."""
    from xtrain.data.rows import preference as rows_
    from xtrain.tasks.contract import Example
    from xtrain.tasks.predicting import load_file

    ds, source, _ = load_file(cfg)
    out = []
    for i in range(len(ds)):
        row = dict(ds[i])
        if "chosen" in row or "rejected" in row:
            pair = rows_.read_row(row, i, source)
            shown = {"prompt": pair.prompt, CHOSEN: pair.chosen, REJECTED: pair.rejected}
            out.append(Example(i, shown, (pair.prompt, pair.chosen, pair.rejected), CHOSEN))
            continue
        prompt, answer = _one_answer(row, i, source)
        out.append(Example(i, {"prompt": prompt, "answer": answer}, (prompt, answer)))
    return out


def _one_answer(row: dict[str, Any], index: int, source: str) -> tuple[str | Turns, str]:
    """(prompt, answer) of a row holding one answer: under one of ``PROMPT_KEYS``/``ANSWER_KEYS``,
    or the last turn of a conversation (``messages``)."""
    from xtrain.data.rows import preference as rows_

    where = f"row {index} of {source}"
    messages = row.get("messages")
    last = messages[-1] if isinstance(messages, list) and len(messages) > 1 else None
    if isinstance(last, dict) and last.get("role") == "assistant":
        return messages[:-1], str(last.get("content") or "")
    prompt = next((row[k] for k in PROMPT_KEYS if row.get(k) is not None), None)
    answer = next((row[k] for k in ANSWER_KEYS if row.get(k) is not None), None)
    if prompt is None or answer is None:
        raise rows_.BadPreferenceRow(
            f"{where}: no answer to score: give a pair (prompt, chosen, rejected), or a prompt "
            f"({'/'.join(PROMPT_KEYS)}) and an answer ({'/'.join(ANSWER_KEYS)}), or messages "
            "ending in the assistant's turn",
            "docs/reward-models.md#scoring-answers describes the rows",
        )
    if isinstance(answer, list) and answer and isinstance(answer[-1], dict):  # TRL's conversational one
        answer = answer[-1].get("content") or ""
    return prompt, str(answer)


def answer_rows(loaded: Loaded, examples: list[Example], request: PredictRequest) -> list[dict[str, Any]]:
    """``FileRows.answer``: a batch of rows scored in one call of the scorer; a pair's output is
    the answer the model prefers (``tie`` when their rewards are equal)."""
    items: list[tuple[Any, str]] = []
    for e in examples:
        items += [(e.feed[0], a) for a in e.feed[1:]]
    scores = iter(scorer(loaded).scores(items, "row"))
    out = []
    for e in examples:
        if len(e.feed) == 2:
            out.append({"score": next(scores)})
            continue
        c, r = next(scores), next(scores)
        preferred = CHOSEN if c > r else REJECTED if r > c else TIE
        out.append({"output": preferred, "score_chosen": c, "score_rejected": r, "margin": c - r})
    return out


def accuracy(references: list[str], outputs: list[str]) -> dict[str, float]:
    """``FileRows.score``: the share of pairs whose chosen answer the model prefers (a tie half),
    as training's ``rewards/accuracy`` counts them."""
    pairs = list(zip(references, outputs, strict=True))
    if not pairs:
        return {}
    return {
        "reward_accuracy": sum(1.0 if r == o else 0.5 if o == TIE else 0.0 for r, o in pairs) / len(pairs)
    }
