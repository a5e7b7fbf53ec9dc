"""Preference rows: what a row of preference data holds, and its answers as token ids.

Paired rows (DPO, IPO, ORPO, SimPO), one prompt and two answers, in the shapes people have:

- ``{prompt, chosen, rejected}``: strings (TRL's standard shape), or TRL's conversational shape:
  ``prompt`` a list of ``{role, content}`` turns, ``chosen``/``rejected`` one assistant turn each;
- ``{chosen, rejected}`` whole conversations sharing their turns up to the last answer (TRL's
  implicit prompt, Anthropic HH as chat): the shared turns are the prompt;
- LLaMA-Factory's alpaca shape ``{instruction, input?, system?, chosen, rejected}`` and its sharegpt
  shape ``{conversations: [{from, value}], chosen: {from, value}, rejected: {from, value}}``.

Unpaired rows (KTO): ``{prompt, completion, label}`` (TRL; ``label`` true for a desirable
completion), the prompt and completion strings or turns as above.

A row becomes token ids as SFT renders it: with a chat template (the tokenizer's or
``data.chat_template``) the prompt's turns and the answer as the last assistant turn
(``chat_data.encode``, the answer's tokens labelled, everything before -100); without one, the
prompt's tokens then the answer's and the end-of-sequence token (causal-lm's prompt/response).
The prompt is never cut: a prompt of ``data.max_length`` tokens or more leaves no room for an
answer and is refused; the answers are cut to ``data.max_length`` after the same prompt, so a pair
stays a pair. Bad rows are one line naming the row and the file (``BadPreferenceRow``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from xtrain.data.collate import IGNORE_INDEX
from xtrain.data.rows import chat as chat_data
from xtrain.data.rows.formats import SHAREGPT_KEYS, alpaca_fields, mapped_turns
from xtrain.errors import RowError, XtrainError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from datasets import Dataset
    from transformers import PreTrainedTokenizerBase

    from xtrain.data.encoded import Encoding

Turns = list[dict[str, Any]]
Render = Callable[[Turns, bool], str]
# Bump when the rows encoded here change what they hold (every cached encoding of them is redone).
VERSION = 1


class BadPreferenceRow(RowError):
    HINT = "fix or remove that row (docs/preference.md#data describes the shapes)"


@dataclass
class PreferenceRow:
    """One checked row: the prompt (a string, or the turns before the answer) and its answers;
    an unpaired (KTO) row has ``rejected`` None and ``desirable`` set."""

    prompt: str | Turns
    chosen: str
    rejected: str | None = None
    desirable: bool | None = None


def _answer(row: dict[str, Any], key: str, where: str) -> str:
    """An answer cell: text, one assistant turn (a list of one, TRL), or a sharegpt ``{from, value}``."""
    value = row.get(key)
    if isinstance(value, dict):
        value = value.get("value", value.get("content"))
    elif isinstance(value, list):
        if len(value) != 1 or not isinstance(value[0], dict) or value[0].get("role") != "assistant":
            raise BadPreferenceRow(f"{where}: field '{key}' must be one assistant turn (or text)")
        value = value[0].get("content")
    if not isinstance(value, str) or not value.strip():
        raise BadPreferenceRow(f"{where}: field '{key}' is missing or empty")
    return value


def _prompt(value: Any, where: str) -> str | Turns:
    if isinstance(value, str) and value.strip():
        return value
    if isinstance(value, list) and value and all(isinstance(t, dict) for t in value):
        return value
    raise BadPreferenceRow(f"{where}: field 'prompt' is missing, empty, or neither text nor turns")


def _shared_prefix(row: dict[str, Any], where: str) -> PreferenceRow:
    """TRL's implicit prompt: two whole conversations that differ in their last (assistant) turn."""
    chosen, rejected = row.get("chosen"), row.get("rejected")
    for key, cell in (("chosen", chosen), ("rejected", rejected)):
        if not isinstance(cell, list) or len(cell) < 2 or not isinstance(cell[-1], dict):
            raise BadPreferenceRow(
                f"{where}: no 'prompt' field, and '{key}' is not a conversation ending in an answer"
            )
        if cell[-1].get("role") != "assistant":
            raise BadPreferenceRow(f"{where}: the last turn of '{key}' is not the assistant's")
    assert isinstance(chosen, list) and isinstance(rejected, list)
    if chosen[:-1] != rejected[:-1]:
        raise BadPreferenceRow(f"{where}: 'chosen' and 'rejected' differ before their last turn")
    answers = [_answer({k: [cell[-1]]}, k, where) for k, cell in (("chosen", chosen), ("rejected", rejected))]
    return PreferenceRow(chosen[:-1], *answers)


def read_row(row: dict[str, Any], index: int, source: str) -> PreferenceRow:
    """Row ``index`` of ``source`` in any shape above, checked: answers present and different,
    a KTO label that is true or false."""
    where = f"row {index} of {source}"
    if "label" in row and "completion" in row:  # KTO, unpaired
        label = row["label"]
        if not isinstance(label, bool):
            raise BadPreferenceRow(f"{where}: field 'label' is {label!r:.40}, not true or false")
        completion = _answer(row, "completion", where)
        return PreferenceRow(_prompt(row.get("prompt"), where), completion, None, label)
    if "instruction" in row:  # LLaMA-Factory, alpaca shape
        system, user, _ = alpaca_fields({**row, "output": "-"}, index, source)
        turns = [{"role": "system", "content": system}] if system else []
        prompt: str | Turns = [*turns, {"role": "user", "content": user}]
    elif "conversations" in row:  # LLaMA-Factory, sharegpt shape
        prompt = mapped_turns(row["conversations"], SHAREGPT_KEYS, index, source, "conversations")
    elif "prompt" in row:
        prompt = _prompt(row["prompt"], where)
    else:
        found = _shared_prefix(row, where)
        prompt = found.prompt
    if "prompt" in row or "instruction" in row or "conversations" in row:
        chosen, rejected = _answer(row, "chosen", where), _answer(row, "rejected", where)
    else:
        chosen, rejected = found.chosen, found.rejected or ""
    if chosen.strip() == rejected.strip():
        raise BadPreferenceRow(f"{where}: 'chosen' and 'rejected' are the same answer: nothing to prefer")
    return PreferenceRow(prompt, chosen, rejected)


def read_rows(ds: Dataset | Sequence[dict[str, Any]], source: str) -> list[PreferenceRow]:
    """Every row of ``ds`` (a ``datasets.Dataset`` or a list of dicts), all of one kind: paired,
    or unpaired (KTO)."""
    rows: list[PreferenceRow] = []
    for i in range(len(ds)):
        row = read_row(dict(ds[i]), i, source)
        if rows and (row.rejected is None) != (rows[0].rejected is None):
            kinds = ("an unpaired {prompt, completion, label}", "a paired {prompt, chosen, rejected}")
            first, this = (kinds[0], kinds[1]) if rows[0].rejected is None else (kinds[1], kinds[0])
            raise BadPreferenceRow(f"row {i} of {source} is {this} row after {first} row 0")
        rows.append(row)
    return rows


def is_unpaired(rows: list[PreferenceRow]) -> bool:
    return bool(rows) and rows[0].rejected is None


# ---------------------------------------------------------------------------------------------
# Rows -> token ids


@dataclass
class Encoder:
    """How answers become token ids: ``render`` (a chat template) or plain prompt + answer text."""

    tokenizer: PreTrainedTokenizerBase
    max_length: int
    render: Render | None = None  # None: no chat template, prompt and answer as plain text

    def encode(self, prompt: str | Turns, answer: str, where: str) -> tuple[list[int], list[int], int]:
        """(ids, labels, prompt tokens) of ``answer`` after ``prompt``, not yet cut."""
        if self.render is not None:
            turns = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
            conv = _conversation([*turns, {"role": "assistant", "content": answer}], where)
            enc = chat_data.encode(self.render, self.tokenizer, conv, where, last_only=True)
            ids, labels = enc.input_ids, enc.labels
            first = next(i for i, t in enumerate(labels) if t != IGNORE_INDEX)
            return ids, labels, first
        if not isinstance(prompt, str):
            raise XtrainError(
                f"{where}: the prompt is a conversation, and the tokenizer has no chat template",
                "set data.chat_template to a Jinja template (the format the model should learn)",
            )
        tok = self.tokenizer
        p = list(tok(prompt, add_special_tokens=True)["input_ids"])
        a = list(tok(answer, add_special_tokens=False)["input_ids"])
        a += [tok.eos_token_id] if tok.eos_token_id is not None else []
        return p + a, [IGNORE_INDEX] * len(p) + a, len(p)

    def answer(self, prompt: str | Turns, answer: str, where: str) -> tuple[list[int], list[int]]:
        """``encode``, cut to ``max_length`` after the whole prompt (refused when no answer fits)."""
        ids, labels, prompt_tokens = self.encode(prompt, answer, where)
        if prompt_tokens >= self.max_length:
            raise BadPreferenceRow(
                f"{where}: the prompt is {prompt_tokens} tokens, data.max_length {self.max_length}: "
                "no answer token fits",
                "raise data.max_length or shorten that prompt",
            )
        return ids[: self.max_length], labels[: self.max_length]


def _conversation(turns: Turns, where: str) -> chat_data.Conversation:
    try:
        return chat_data.parse_conversation(turns, 0, "", allow_images=False)
    except chat_data.BadConversation as e:  # named by this row, not "row 0 of"
        raise BadPreferenceRow(f"{where}: {e.message.split(': ', 1)[-1]}") from None


def _kind(row: PreferenceRow, first: PreferenceRow, index: int, source: str) -> PreferenceRow:
    """``row`` when it is of the kind of row 0 (``first``): paired, or unpaired (KTO)."""
    if (row.rejected is None) != (first.rejected is None):
        kinds = ("an unpaired {prompt, completion, label}", "a paired {prompt, chosen, rejected}")
        earlier, this = (kinds[0], kinds[1]) if first.rejected is None else (kinds[1], kinds[0])
        raise BadPreferenceRow(f"row {index} of {source} is {this} row after {earlier} row 0")
    return row


def encoding(
    ds: Dataset, source: str, encoder: Encoder, kto: bool, tokenizer_key: str, processes: int | None = None
) -> Encoding:
    """The rows of ``ds`` as ``paired_rows`` (pairs) or ``unpaired_rows`` (``kto``: KTO rows, a
    pair becoming two) make them, a map batch at a time (``encoded.encode``); ``tokenizer_key``:
    the tokenizer's fingerprint. Row 0 decides the kind every row must have."""
    from xtrain.data.encoded import Encoding
    from xtrain.data.rows.render import template_of

    first = read_row(dict(ds[0]), 0, source)
    template = template_of(encoder.render) if encoder.render is not None else None
    key = (
        "preference rows",
        VERSION,
        kto,
        first.rejected is None,
        encoder.max_length,
        template,
        tokenizer_key,
    )
    kwargs = {"encoder": encoder, "source": source, "first": first, "kto": kto, "rows": ds}
    return Encoding("preference rows", columns, kwargs, key, processes=processes)


def columns(
    batch: dict[str, list[Any]],
    indices: list[int],
    encoder: Encoder,
    source: str,
    first: PreferenceRow,
    kto: bool,
    rows: Dataset,
) -> dict[str, list[Any]]:
    """A map batch of rows -> ``paired_rows`` / ``unpaired_rows`` columns (top-level: it runs in
    the encoding processes). A KTO row's KL sequence takes the next row's completion: the one
    after the batch read from ``rows`` (the first one after the last row)."""
    names = list(batch)
    read = [
        _kind(read_row({n: batch[n][k] for n in names}, i, source), first, i, source)
        for k, i in enumerate(indices)
    ]
    if not kto:
        out = paired_rows(read, encoder, source, indices)
    else:
        after = (indices[-1] + 1) % len(rows)
        following = _kind(read_row(dict(rows[after]), after, source), first, after, source).chosen
        items = read if first.rejected is None else as_unpaired(read)
        wheres = [i for i in indices for _ in range(len(items) // len(read))]
        out = unpaired_rows(items, encoder, source, wheres, following)
    return {k: [row[k] for row in out] for k in out[0]} if out else {}


def as_unpaired(rows: list[PreferenceRow]) -> list[PreferenceRow]:
    """Pairs as KTO rows (TRL's conversion): the chosen answer desirable, the rejected not."""
    out = []
    for r in rows:
        out += [
            PreferenceRow(r.prompt, r.chosen, None, True),
            PreferenceRow(r.prompt, r.rejected or "", None, False),
        ]
    return out


def paired_rows(
    rows: list[PreferenceRow], encoder: Encoder, source: str, indices: list[int] | None = None
) -> list[dict[str, Any]]:
    """Pairs -> ``{chosen_input_ids, chosen_labels, rejected_input_ids, rejected_labels}`` rows;
    ``indices``: the rows' numbers in ``source`` (their refusals name them)."""
    out = []
    for i, row in zip(indices or range(len(rows)), rows, strict=True):
        where = f"row {i} of {source}"
        assert row.rejected is not None
        c_ids, c_labels = encoder.answer(row.prompt, row.chosen, where)
        r_ids, r_labels = encoder.answer(row.prompt, row.rejected, where)
        out.append({"chosen_input_ids": c_ids, "chosen_labels": c_labels,
                    "rejected_input_ids": r_ids, "rejected_labels": r_labels})  # fmt: skip
    return out


def unpaired_rows(
    rows: list[PreferenceRow],
    encoder: Encoder,
    source: str,
    indices: list[int] | None = None,
    following: str | None = None,
) -> list[dict[str, Any]]:
    """KTO rows -> ``{completion_*, kl_*, desirable}``: the row's completion, and for the KL
    estimate its prompt with the next row's completion (the last row's: ``following``, else the
    first's), as TRL pairs them, fixed by the data so any process count reads the same;
    ``indices``: each row's number in ``source``."""
    out = []
    for k, (i, row) in enumerate(zip(indices or range(len(rows)), rows, strict=True)):
        where = f"row {i} of {source}"
        after = (
            rows[k + 1].chosen
            if k + 1 < len(rows)
            else (following if following is not None else rows[0].chosen)
        )
        ids, labels = encoder.answer(row.prompt, row.chosen, where)
        kl_ids, kl_labels = encoder.answer(row.prompt, after, where)
        out.append({"completion_input_ids": ids, "completion_labels": labels, "kl_input_ids": kl_ids,
                    "kl_labels": kl_labels, "desirable": int(bool(row.desirable))})  # fmt: skip
    return out


PAIRED_PARTS = ("chosen", "rejected")
UNPAIRED_PARTS = ("completion", "kl")
