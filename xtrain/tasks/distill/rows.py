"""Distillation's data rows: prompts, each with the data's answer where the row has one (GKD
trains on the answers a share of its steps; on-policy distillation reads the prompts only).

The shapes people have, read as GRPO reads a prompt (``grpo.rows.read_row``: text, turns, alpaca)
plus the answer:

- ``{"prompt": ..., "completion": ...}`` (TRL's prompt-completion rows; the completion text or
  ``[{"role": "assistant", "content": ...}]``), ``{"prompt", "response"}`` (causal-lm's
  prompt/response rows), alpaca's ``output``;
- ``{"messages": [...]}`` (``data.messages_column``): the turns up to the last assistant turn are
  the prompt, that turn the answer (TRL's GKD collator reads them so); a conversation that ends
  on a user turn is a prompt alone.

A prompt is encoded as GRPO encodes it (the chat template with the assistant's turn opened, or the
text with the tokenizer's start token) and never cut (``data.max_length`` bounds it). The answer
is what the template writes after that prompt for the assistant's turn (its end-of-turn tokens
too), or a text answer's tokens and the end token (as causal-lm's prompt/response rows train it),
cut to ``distill.max_completion_length``. Each row is encoded once (``encoding``, cached); the
collator pads prompts on the left (generation continues them) and answers on the right.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from xtrain.data.encoded import Encoding
from xtrain.errors import RowError
from xtrain.tasks.grpo import rows as prompt_rows
from xtrain.tasks.grpo.rows import PromptEncoder, PromptRow, Turns

if TYPE_CHECKING:
    from datasets import Dataset

# Bump when the encoded rows change what they hold (every cached encoding of them is redone).
VERSION = 1
ANSWER_KEYS = ("completion", "response", "output")  # a row's answer, in this order


class BadDistillRow(RowError):
    HINT = "fix or remove that row (docs/distillation.md#data describes the shapes)"


@dataclass
class DistillRow:
    """One checked row: its prompt (text or turns) and the data's answer (None: a prompt alone)."""

    prompt: str | Turns
    answer: str | None = None

    @property
    def conversational(self) -> bool:
        return isinstance(self.prompt, list)

    @property
    def shown(self) -> str:
        return PromptRow(self.prompt).shown


def _answer_text(value: Any, where: str) -> str | None:
    """A completion cell as text: a string, or TRL's ``[{"role": "assistant", "content": ...}]``."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and all(isinstance(t, dict) for t in value):
        said = [t.get("content") for t in value if t.get("role", "assistant") == "assistant"]
        if said and all(isinstance(s, str) for s in said):
            return "".join(said)
    raise BadDistillRow(
        f"{where}: an answer is text or a list of assistant turns, got {type(value).__name__}"
    )


def read_row(row: dict[str, Any], index: int, source: str, messages_key: str = "messages") -> DistillRow:
    """One row as a ``DistillRow`` (a row without a prompt: one line)."""
    where = f"row {index} of {source}"
    messages = row.get(messages_key)
    if isinstance(messages, list) and messages:
        turns = prompt_rows.read_row({"prompt": messages}, index, source).prompt
        assert isinstance(turns, list)
        if turns[-1].get("role") != "assistant":
            return DistillRow(turns)
        if len(turns) < 2:
            raise BadDistillRow(f"{where}: its conversation is one assistant turn, with no prompt before it")
        return DistillRow(turns[:-1], _answer_text(turns[-1]["content"], where))
    try:
        prompt = prompt_rows.read_row(row, index, source).prompt
    except RowError:
        raise BadDistillRow(
            f"{where} has no prompt: distillation reads 'prompt' (text or turns), alpaca's "
            f"'instruction' or '{messages_key}' conversations (its columns: "
            f"{', '.join(sorted(row)) or 'none'})"
        ) from None
    answer = next((row[k] for k in ANSWER_KEYS if row.get(k) is not None), None)
    return DistillRow(prompt, _answer_text(answer, where))


@dataclass
class RowEncoder:
    """Prompts (``prompts``: GRPO's encoder, the chat template or text) and their answers as token
    ids, answers cut to ``max_answer`` tokens; ``answers_needed``: a row without one is refused
    (GKD's data steps train on them)."""

    prompts: PromptEncoder
    max_answer: int
    answers_needed: bool = False

    def encode(self, row: DistillRow, where: str) -> dict[str, list[int]]:
        """``{"input_ids": the prompt, "answer_ids": the answer (empty: none), "answer_cut": [0|1]}``."""
        prompt = PromptRow(row.prompt)
        ids = self.prompts.encode(prompt, where)
        if row.answer is None:
            if self.answers_needed:
                raise BadDistillRow(
                    f"{where} has no answer: distill.mode=gkd trains on the data's answers in the steps not "
                    "on the student's samples (completion, response, output or a last assistant turn)",
                    "give every row an answer, or set distill.seq_kd=true (the teacher answers) or "
                    "distill.lmbda=1 (the student's samples only)",
                )
            return {"input_ids": ids, "answer_ids": [], "answer_cut": [0]}
        answer = self.answer_ids(prompt, row.answer, where)
        return {"input_ids": ids, "answer_ids": answer[: self.max_answer],
                "answer_cut": [int(len(answer) > self.max_answer)]}  # fmt: skip

    def answer_ids(self, prompt: PromptRow, answer: str, where: str) -> list[int]:
        """The answer's tokens after the prompt: the template's assistant turn (what it writes after
        the opened turn), else the text and the end token."""
        tok = self.prompts.tokenizer
        if prompt.conversational and self.prompts.template is not None:
            opened = self.prompts.text(prompt)
            assert isinstance(prompt.prompt, list)
            whole = tok.apply_chat_template(
                [*prompt.prompt, {"role": "assistant", "content": answer}], tokenize=False,
                chat_template=self.prompts.template, tools=self.prompts.tools,
            )  # fmt: skip
            if not whole.startswith(opened):
                raise BadDistillRow(
                    f"{where}: the chat template writes its answer's turn in a way that does not continue "
                    "the opened assistant turn (the prompt the student samples after)",
                    "use a chat template whose generation prompt is the start of the assistant's turn",
                )
            return list(tok(whole[len(opened) :], add_special_tokens=False)["input_ids"])
        eos = [tok.eos_token_id] if tok.eos_token_id is not None else []  # (turns without a template too)
        return list(tok(answer, add_special_tokens=False)["input_ids"]) + eos


def encoding(source: str, encoder: RowEncoder, tokenizer_key: str, messages_key: str,
             processes: int | None = None) -> Encoding:  # fmt: skip
    """Every row of ``source`` checked and encoded (``RowEncoder.encode`` and its ``row``), a map
    batch at a time (``encoded.encode``); ``tokenizer_key``: the tokenizer's fingerprint."""
    import datasets

    p = encoder.prompts
    key = ("distill rows", VERSION, p.max_length, p.template, p.tools, encoder.max_answer,
           encoder.answers_needed, messages_key, tokenizer_key)  # fmt: skip
    ints = datasets.List(datasets.Value("int32"))
    features = datasets.Features(
        {"input_ids": ints, "answer_ids": ints, "answer_cut": ints, "row": datasets.Value("int64")}
    )
    kwargs = {"encoder": encoder, "source": source, "messages_key": messages_key}
    return Encoding("distill rows", columns, kwargs, key, features, processes=processes)


def columns(batch: dict[str, list[Any]], indices: list[int], encoder: RowEncoder, source: str,
            messages_key: str) -> dict[str, list[Any]]:  # fmt: skip
    """A map batch of rows -> their encodings and ``row`` numbers (top-level: it runs in the
    encoding processes)."""
    names = list(batch)
    out: dict[str, list[Any]] = {"input_ids": [], "answer_ids": [], "answer_cut": [], "row": []}
    for k, i in enumerate(indices):
        row = read_row({n: batch[n][k] for n in names}, i, source, messages_key)
        for name, value in encoder.encode(row, f"row {i} of {source}").items():
            out[name].append(value)
        out["row"].append(i)
    return out


class DistillRows:
    """The rows of a data set, each read as a ``DistillRow`` when asked for (the eval's prompts
    shown): the data set stays memory-mapped."""

    def __init__(self, ds: Dataset, source: str, messages_key: str) -> None:
        self.ds, self.source, self.messages_key = ds, source, messages_key

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int) -> DistillRow:
        return read_row(dict(self.ds[int(i)]), int(i), self.source, self.messages_key)


class DistillCollator:
    """Prompts padded on the left to the longest (``input_ids``, ``attention_mask``), answers on
    the right (``answer_ids``, ``answer_mask``: all 0 for a row without one), and ``row``.
    Top-level and picklable (spawned DataLoader workers)."""

    def __init__(self, pad_id: int) -> None:
        self.pad_id = pad_id

    def __call__(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        import torch

        batch = prompt_rows.PromptCollator(self.pad_id)(items)
        width = max(1, max(len(x["answer_ids"]) for x in items))
        answers = [list(x["answer_ids"]) + [self.pad_id] * (width - len(x["answer_ids"])) for x in items]
        mask = [[1] * len(x["answer_ids"]) + [0] * (width - len(x["answer_ids"])) for x in items]
        batch["answer_ids"] = torch.tensor(answers, dtype=torch.long)
        batch["answer_mask"] = torch.tensor(mask, dtype=torch.long)
        return batch
