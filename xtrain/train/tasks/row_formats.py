"""What the rows of causal-lm data hold (``data.row_format``), and the formats people already have
mapped onto causal-lm's two masked paths (docs/training.md#data-formats):

- ``text``: a text column, loss on every token;
- ``prompt_response``: prompt/response columns, loss on the response only;
- ``messages``: ``{role, content}`` conversations rendered by a chat template, loss on the
  assistant turns only (``chat_data``);
- ``alpaca``: ``instruction``, optional ``input``, ``output``, optional ``system``. With a chat
  template (the tokenizer's or ``data.chat_template``) a row becomes a conversation (system?, user:
  the instruction and the input after a blank line, assistant: the output), so the model learns the
  format its template prompts it in and ``xtrain predict`` renders prompts the same way; without
  one it becomes a prompt/response pair: ``[system + "\\n\\n"] instruction ["\\n\\n" + input] "\\n\\n"``
  (the blank line tells the model where the answer starts) and the output;
- ``sharegpt``: a ``conversations`` list of ``{from: human|gpt|system (also user|assistant), value}``
  turns, which become ``messages``.

``auto`` decides from the columns (``detect``). Imported by the config's values: nothing heavy here.
"""

from __future__ import annotations

from typing import Any

from xtrain.errors import RowError, XtrainError

ROW_FORMATS = ("auto", "text", "prompt_response", "messages", "alpaca", "sharegpt")
CHAT = ("messages", "sharegpt")  # always conversations; alpaca becomes one with a chat template
ALPACA_REQUIRED = ("instruction", "output")
ALPACA_OPTIONAL = ("input", "system")
SHAREGPT_COLUMN = "conversations"
SPEAKERS = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}
# Bump when the alpaca prompt/response text changes (invalidates the datasets cache).
ALPACA_VERSION = 1


class BadRow(RowError):
    """A malformed alpaca or sharegpt row: one line naming the file, the row and the field."""

    HINT = "fix or remove that row (docs/training.md#data-formats describes the formats)"


def detect(
    row_format: str, columns: list[str], text_column: str, messages_column: str, prompt_set: bool
) -> str:
    """``data.row_format``, or for ``auto`` what the columns hold: prompt/response when its columns
    are configured; alpaca (``instruction`` + ``output``) and sharegpt (``conversations``) even
    beside a text column (alpaca sets often carry a rendered ``text`` column, which would put the
    loss on the prompt); then the text column; then conversations; then ``prompt`` + ``response``
    columns; else text (its missing column is then the one-line error)."""
    if row_format != "auto":
        return row_format
    names = set(columns)
    if prompt_set:
        return "prompt_response"
    if set(ALPACA_REQUIRED) <= names:
        return "alpaca"
    if SHAREGPT_COLUMN in names:
        return "sharegpt"
    if text_column in names:
        return "text"
    if messages_column in names:
        return "messages"
    if {"prompt", "response"} <= names:
        return "prompt_response"
    return "text"


def require(ds: Any, columns: tuple[str, ...], source: str, row_format: str) -> None:
    """The columns a format needs, in one line naming what is there."""
    missing = [c for c in columns if c not in ds.column_names]
    if missing:
        raise XtrainError(
            f"{source} has no column {', '.join(repr(c) for c in missing)} for data.row_format={row_format} "
            f"(columns: {', '.join(ds.column_names)})",
            "set data.row_format to what the rows hold (docs/training.md#data-formats)",
        )


def _text(row: dict[str, Any], name: str, where: str, required: bool) -> str | None:
    value = row.get(name)
    if value is None or (isinstance(value, str) and not value.strip()):
        if required:
            raise BadRow(f"{where}: field '{name}' is missing or empty")
        return None
    if not isinstance(value, str):
        raise BadRow(f"{where}: field '{name}' holds {type(value).__name__}, not text")
    return value


def alpaca_fields(row: dict[str, Any], index: int, source: str) -> tuple[str | None, str, str]:
    """(system or None, the user's text, the answer) of one alpaca row, checked."""
    where = f"row {index} of {source}"
    instruction = _text(row, "instruction", where, required=True)
    output = _text(row, "output", where, required=True)
    extra = _text(row, "input", where, required=False)
    system = _text(row, "system", where, required=False)
    assert instruction is not None and output is not None
    return system, instruction + (f"\n\n{extra}" if extra else ""), output


def alpaca_messages(row: dict[str, Any], index: int, source: str) -> list[dict[str, str]]:
    system, user, answer = alpaca_fields(row, index, source)
    turns = [{"role": "system", "content": system}] if system else []
    return [*turns, {"role": "user", "content": user}, {"role": "assistant", "content": answer}]


def alpaca_prompt_response(
    batch: dict[str, list[Any]], indices: list[int], source: str
) -> dict[str, list[str]]:
    """A ``Dataset.map`` batch of alpaca rows -> ``prompt``/``response`` columns (top-level:
    datasets may run it in worker processes)."""
    prompts, responses = [], []
    for k, index in enumerate(indices):
        row = {name: values[k] for name, values in batch.items()}
        system, user, answer = alpaca_fields(row, index, source)
        prompts.append((f"{system}\n\n" if system else "") + user + "\n\n")
        responses.append(answer)
    return {"prompt": prompts, "response": responses}


def alpaca_as_prompt_response(ds: Any, source: str) -> Any:
    """An alpaca dataset as ``prompt``/``response`` columns, cached under a fingerprint of the
    data and this mapping (every process of the run reads the first one's result)."""
    from datasets.fingerprint import Hasher

    require(ds, ALPACA_REQUIRED, source, "alpaca")
    return ds.map(
        alpaca_prompt_response,
        batched=True,
        with_indices=True,
        fn_kwargs={"source": source},
        remove_columns=list(ds.column_names),
        new_fingerprint=Hasher.hash([getattr(ds, "_fingerprint", None), "alpaca", ALPACA_VERSION, source]),
        desc="alpaca rows",
    )


def sharegpt_messages(cell: Any, index: int, source: str) -> list[dict[str, str]]:
    """One ``conversations`` cell as ``messages`` (``chat_data.parse_conversation`` checks the
    rest: an assistant turn after a user turn, no empty answer)."""
    where = f"row {index} of {source}"
    if not isinstance(cell, list) or not cell:
        raise BadRow(f"{where}: field '{SHAREGPT_COLUMN}' must be a non-empty list of {{from, value}} turns")
    out = []
    for k, turn in enumerate(cell):
        if not isinstance(turn, dict):
            raise BadRow(f"{where}: {SHAREGPT_COLUMN}[{k}] is not a {{from, value}} object")
        speaker = turn.get("from") or turn.get("role")  # a column mixing both spellings has both keys
        role = SPEAKERS.get(speaker.lower()) if isinstance(speaker, str) else None
        if role is None:
            raise BadRow(
                f"{where}: {SHAREGPT_COLUMN}[{k}] field 'from' is {speaker!r} "
                "(from: human, gpt, system; also user, assistant)"
            )
        value = turn.get("value") if turn.get("value") is not None else turn.get("content")
        if not isinstance(value, str):
            raise BadRow(f"{where}: {SHAREGPT_COLUMN}[{k}] field 'value' is missing or not text")
        out.append({"role": role, "content": value})
    return out


def conversations(ds: Any, row_format: str, messages_column: str, source: str) -> list[Any]:
    """The ``messages`` cells of a chat-shaped dataset: as they are (``messages``), or mapped from
    sharegpt or alpaca rows."""
    from xtrain.train.tasks import chat_data

    if row_format == "messages":
        return chat_data.messages_column_of(ds, messages_column, source)
    if row_format == "sharegpt":
        require(ds, (SHAREGPT_COLUMN,), source, row_format)
        return [sharegpt_messages(cell, i, source) for i, cell in enumerate(ds[SHAREGPT_COLUMN])]
    require(ds, ALPACA_REQUIRED, source, row_format)
    names = [c for c in (*ALPACA_REQUIRED, *ALPACA_OPTIONAL) if c in ds.column_names]
    columns = {c: ds[c] for c in names}
    return [alpaca_messages({c: columns[c][i] for c in names}, i, source) for i in range(len(ds))]
