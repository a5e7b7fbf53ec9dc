"""GRPO's data rows: prompts only, in the shapes people have, with any other columns kept for the
reward functions (an answer, test cases).

- ``{"prompt": "..."}``: the text as it is (the tokenizer's start token added);
- ``{"prompt": [{"role": ..., "content": ...}, ...]}``: conversational (TRL's), rendered by the chat
  template (``data.chat_template`` or the tokenizer's) with the assistant's turn opened;
- alpaca ``{"instruction", "input"?, "system"?}``: the instruction (and input) as the user's turn
  under a chat template, else ``instruction\\n\\ninput`` as text.

A prompt is never cut: one of ``data.max_length`` tokens or more is refused (one line naming the
row and the file), since the completion follows it. Each row is encoded once into its prompt's
token ids (``encoding``: through ``encoded.encode``, cached); the collator pads them on the left
(generation continues every prompt at its end). The rows themselves stay in the memory-mapped data
set, read when a step scores its completions (``PromptRows``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, overload

from xtrain.data.encoded import Encoding
from xtrain.errors import RowError, XtrainError

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import PreTrainedTokenizerBase

# Bump when the encoded prompts change what they hold (every cached encoding of them is redone).
VERSION = 1

Turns = list[dict[str, Any]]
PROMPT_KEYS = ("prompt", "instruction", "input", "system")  # what a row's prompt is read from


class BadPromptRow(RowError):
    HINT = "fix or remove that row (docs/grpo.md#data describes the shapes)"


@dataclass
class PromptRow:
    """One checked row: its prompt (text or turns) and its other columns (for the rewards)."""

    prompt: str | Turns
    columns: dict[str, Any] = field(default_factory=dict)

    @property
    def conversational(self) -> bool:
        return isinstance(self.prompt, list)

    @property
    def shown(self) -> str:
        """The prompt as a person reads it: a conversation's last user turn (its system turn and
        template text are the same on every row), a text prompt as it is."""
        if isinstance(self.prompt, str):
            return self.prompt
        users = [t for t in self.prompt if t.get("role") == "user"] or self.prompt
        return str(users[-1]["content"])


def _turns(value: list[Any], where: str) -> Turns:
    for turn in value:
        if not isinstance(turn, dict) or "role" not in turn or "content" not in turn:
            raise BadPromptRow(f"{where}: a conversational prompt is a list of {{role, content}} turns")
    return list(value)


def untemplated(turns: Turns) -> str:
    """Turns without a chat template, as the model reads them: their words, a blank line apart."""
    return "\n\n".join(str(t["content"]) for t in turns)


def read_row(row: dict[str, Any], index: int, source: str) -> PromptRow:
    """One row as a ``PromptRow`` (a row without a prompt: one line)."""
    where = f"row {index} of {source}"
    rest = {k: v for k, v in row.items() if k not in PROMPT_KEYS}
    prompt = row.get("prompt")
    if isinstance(prompt, str) and prompt.strip():
        return PromptRow(prompt, rest)
    if isinstance(prompt, list) and prompt:
        return PromptRow(_turns(prompt, where), rest)
    instruction = row.get("instruction")
    if isinstance(instruction, str) and instruction.strip():
        extra, system = row.get("input"), row.get("system")
        user = instruction + (f"\n\n{extra}" if isinstance(extra, str) and extra else "")
        turns = [{"role": "system", "content": system}] if isinstance(system, str) and system else []
        return PromptRow([*turns, {"role": "user", "content": user}], rest)
    raise BadPromptRow(
        f"{where} has no prompt: GRPO reads 'prompt' (text or turns) or alpaca's 'instruction' "
        f"(its columns: {', '.join(sorted(row)) or 'none'})"
    )


class PromptRows(Sequence[PromptRow]):
    """The rows of a data set, each read as a ``PromptRow`` when asked for (a step's prompts and
    their reward columns): the data set stays memory-mapped, no list of all the rows is made."""

    def __init__(self, ds: Dataset, source: str) -> None:
        self.ds, self.source = ds, source

    def __len__(self) -> int:
        return len(self.ds)

    @overload
    def __getitem__(self, i: int) -> PromptRow: ...

    @overload
    def __getitem__(self, i: slice) -> list[PromptRow]: ...

    def __getitem__(self, i: int | slice) -> PromptRow | list[PromptRow]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        index = int(i) + (len(self) if int(i) < 0 else 0)
        return read_row(dict(self.ds[index]), index, self.source)


def read_rows(ds: Dataset, source: str) -> PromptRows:
    """The rows of ``ds``, read on access (``encoding`` checks every one of them)."""
    if len(ds) == 0:
        raise XtrainError(f"{source} has no rows")
    return PromptRows(ds, source)


@dataclass
class PromptEncoder:
    """A prompt as token ids: the chat template (``template``: its text, None without one) with
    the tools' schemas (``tools``) where episodes call tools."""

    tokenizer: PreTrainedTokenizerBase
    max_length: int
    template: str | None = None
    tools: list[dict[str, Any]] | None = None  # grpo.tools' schemas, rendered by the template

    def text(self, row: PromptRow) -> str:
        """The prompt as the model reads it (rendered)."""
        if not row.conversational:
            assert isinstance(row.prompt, str)
            return row.prompt
        if self.template is None:
            return untemplated(row.prompt)
        return self.tokenizer.apply_chat_template(
            row.prompt,
            tokenize=False,
            add_generation_prompt=True,
            chat_template=self.template,
            tools=self.tools,
        )

    def encode(self, row: PromptRow, where: str) -> list[int]:
        text = self.text(row)
        special = not (row.conversational and self.template is not None)  # a template writes its own
        ids = list(self.tokenizer(text, add_special_tokens=special)["input_ids"])
        if len(ids) >= self.max_length:
            raise BadPromptRow(
                f"{where}: its prompt is {len(ids)} tokens, data.max_length is {self.max_length} "
                "(the prompt is never cut: the completion follows it)",
                "raise data.max_length or shorten that prompt",
            )
        return ids


def encoded(rows: Sequence[PromptRow], encoder: PromptEncoder, source: str) -> list[dict[str, Any]]:
    """The data set the loop reads: ``{"input_ids": prompt ids, "row": its index}`` per row."""
    return [{"input_ids": encoder.encode(r, f"row {i} of {source}"), "row": i} for i, r in enumerate(rows)]


def encoding(
    source: str, encoder: PromptEncoder, tokenizer_key: str, processes: int | None = None
) -> Encoding:
    """Every row of ``source`` checked and its prompt encoded (``encoded``'s rows), a map batch at
    a time (``encoded.encode``); ``tokenizer_key``: the tokenizer's fingerprint."""
    import datasets

    key = ("grpo prompts", VERSION, encoder.max_length, encoder.template, encoder.tools, tokenizer_key)
    features = datasets.Features(
        {"input_ids": datasets.List(datasets.Value("int32")), "row": datasets.Value("int64")}
    )
    return Encoding("grpo prompts", columns, {"encoder": encoder, "source": source}, key, features,
                    processes=processes)  # fmt: skip


def columns(
    batch: dict[str, list[Any]], indices: list[int], encoder: PromptEncoder, source: str
) -> dict[str, list[Any]]:
    """A map batch of rows -> their prompts' ``input_ids`` and ``row`` numbers (top-level: it runs
    in the encoding processes)."""
    names = list(batch)
    rows = [read_row({n: batch[n][k] for n in names}, i, source) for k, i in enumerate(indices)]
    ids = [encoder.encode(r, f"row {i} of {source}") for i, r in zip(indices, rows, strict=True)]
    return {"input_ids": ids, "row": list(indices)}


class PromptCollator:
    """Prompts padded on the left to the longest (``input_ids``, ``attention_mask``, ``row``).
    Top-level and picklable (spawned DataLoader workers)."""

    def __init__(self, pad_id: int) -> None:
        self.pad_id = pad_id

    def __call__(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        import torch

        width = max(len(x["input_ids"]) for x in items)
        ids = [[self.pad_id] * (width - len(x["input_ids"])) + list(x["input_ids"]) for x in items]
        mask = [[0] * (width - len(x["input_ids"])) + [1] * len(x["input_ids"]) for x in items]
        return {
            "input_ids": torch.tensor(ids, dtype=torch.long),
            "attention_mask": torch.tensor(mask, dtype=torch.long),
            "row": torch.tensor([x["row"] for x in items], dtype=torch.long),
        }
