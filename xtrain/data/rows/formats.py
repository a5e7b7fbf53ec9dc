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

The turns of ``messages`` and ``sharegpt`` rows can be spelt otherwise (LLaMA-Factory's
dataset_info ``tags``): ``data.role_tag`` / ``data.content_tag`` name the keys of a turn and
``data.user_tag`` / ``data.assistant_tag`` / ``data.system_tag`` the speakers (``TurnKeys``,
decided once by ``turn_keys``); vision-language reads them too (``vision_rows``).

``auto`` decides from the columns (``detect``). Imported by the config's values: nothing heavy here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from xtrain.errors import RowError, XtrainError

if TYPE_CHECKING:
    from datasets import Dataset

    from xtrain.config.schema import DataConfig, TrainConfig
    from xtrain.data.rows.chat import Conversation

CHAT = ("messages", "sharegpt")  # always conversations; alpaca becomes one with a chat template
ALPACA_REQUIRED = ("instruction", "output")
ALPACA_OPTIONAL = ("input", "system")
SHAREGPT_COLUMN = "conversations"
SPEAKERS = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}
# agent turns (xtrain/data/rows/tools.py reads them): LLaMA-Factory's sharegpt calls and results
SPEAKERS.update({"function_call": "function_call", "observation": "observation"})
# Bump when the alpaca prompt/response text changes (invalidates the datasets cache).
ALPACA_VERSION = 1


# Columns every reader takes as text when it finds them (alpaca, prompt/response, preference
# pairs, vision-language questions): read as text whatever they look like (``text_names``)
TEXT_NAMES = (*ALPACA_REQUIRED, *ALPACA_OPTIONAL, "text", "prompt", "response", "chosen", "rejected")
TEXT_NAMES += ("completion", "question", "answer")


def text_names(d: DataConfig) -> tuple[str, ...]:
    """The columns the config's readers take as text: the formats' own names and the ``data.*``
    columns that name text (a CSV's are then read as written: ``sources.load_source``)."""
    named = (d.text_column, d.text_pair_column, d.prompt_column, d.response_column)
    return tuple(dict.fromkeys([*TEXT_NAMES, *(c for c in named if c)]))


class BadRow(RowError):
    """A malformed alpaca or sharegpt row: one line naming the file, the row and the field."""

    HINT = "fix or remove that row (docs/training.md#data-formats describes the formats)"


class NotText(BadRow):
    """A text field whose value the file stores as another type."""

    HINT = "write it as text in the file: a quoted JSON string, a string column in Parquet"


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


def require(ds: Dataset, columns: tuple[str, ...], source: str, row_format: str) -> None:
    """The columns a format needs, in one line naming what is there."""
    missing = [c for c in columns if c not in ds.column_names]
    if missing:  # (rows/columns.py checks this first, with the closest column)
        raise XtrainError(
            f"{row_format} rows need {' and '.join(repr(c) for c in missing)}; "
            f"{source} has {', '.join(ds.column_names)}",
            "set data.row_format to what the rows hold (docs/training.md#data-formats)",
        )


def text_field(row: dict[str, Any], name: str, where: str, required: bool) -> str | None:
    value = row.get(name)
    if value is None or (isinstance(value, str) and not value.strip()):
        if required:
            raise BadRow(f"{where}: field '{name}' is missing or empty")
        return None
    if not isinstance(value, str):
        # the file's own type (a JSON number, a Parquet column of dates): text columns of JSON and
        # CSV files are read as written (sources.load_source), so this is what the file says
        raise NotText(f"{where}: field '{name}' holds {type(value).__name__}, not text")
    return value


def alpaca_fields(row: dict[str, Any], index: int, source: str) -> tuple[str | None, str, str]:
    """(system or None, the user's text, the answer) of one alpaca row, checked."""
    where = f"row {index} of {source}"
    instruction = text_field(row, "instruction", where, required=True)
    output = text_field(row, "output", where, required=True)
    extra = text_field(row, "input", where, required=False)
    system = text_field(row, "system", where, required=False)
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


def alpaca_as_prompt_response(ds: Dataset, source: str) -> Dataset:
    """An alpaca dataset as ``prompt``/``response`` columns, encoded once (``encoded.encode``:
    cached under a fingerprint of the data and this mapping; every process of the run reads the
    first one's result)."""
    from xtrain.data.encoded import Encoding, encode

    require(ds, ALPACA_REQUIRED, source, "alpaca")
    mapping = Encoding("alpaca rows", alpaca_prompt_response, {"source": source}, ("alpaca", ALPACA_VERSION))
    return encode(ds, mapping, "alpaca rows")


@dataclass(frozen=True)
class TurnKeys:
    """How the turns of a chat column are spelt: the keys tried for the speaker and for the text,
    and which speaker tag (compared case-insensitively) is which role."""

    role: tuple[str, ...]
    content: tuple[str, ...]
    tags: tuple[tuple[str, str], ...]  # (tag, casefolded; role)

    def role_of(self, speaker: Any) -> str | None:
        if not isinstance(speaker, str):
            return None
        return next((role for tag, role in self.tags if tag == speaker.casefold()), None)


SHAREGPT_KEYS = TurnKeys(("from", "role"), ("value", "content"), tuple(SPEAKERS.items()))
_ROLES = ("system", "user", "assistant", "tool")
MESSAGES_KEYS = TurnKeys(("role",), ("content",), tuple((r, r) for r in _ROLES))
TAG_KEYS = ("user_tag", "assistant_tag", "system_tag")  # data.*: the speaker of each role


def turn_keys(d: DataConfig, fmt: str) -> TurnKeys | None:
    """The one place that decides how a ``messages`` or ``sharegpt`` turn is read: the format's
    spelling with ``data.role_tag``, ``data.content_tag`` and the role tags put in; None for
    ``messages`` rows with none of them set (the turns are read as they are)."""
    chosen = {key.removesuffix("_tag"): getattr(d, key) for key in TAG_KEYS if getattr(d, key) is not None}
    if fmt != "sharegpt" and d.role_tag is None and d.content_tag is None and not chosen:
        return None
    base = SHAREGPT_KEYS if fmt == "sharegpt" else MESSAGES_KEYS
    tags = [(tag, role) for tag, role in base.tags if role not in chosen]
    return TurnKeys(
        (d.role_tag,) if d.role_tag is not None else base.role,
        (d.content_tag,) if d.content_tag is not None else base.content,
        tuple([(tag.casefold(), role) for role, tag in chosen.items()] + tags),
    )


def check_tags(d: DataConfig) -> None:
    """The turn keys and the role tags: only for conversations, and told apart (a key or tag
    given twice is refused)."""
    given = [k for k in ("role_tag", "content_tag", *TAG_KEYS) if getattr(d, k) is not None]
    if given and d.row_format not in ("auto", *CHAT):
        raise XtrainError(
            f"data.{given[0]} spells the turns of conversations, and data.row_format={d.row_format}",
            f"leave data.{given[0]} unset, or set data.row_format to messages or sharegpt",
        )
    if d.role_tag is not None and d.role_tag == d.content_tag:
        raise XtrainError(
            f"data.role_tag and data.content_tag are both {d.role_tag!r}",
            "name the key of the speaker and the key of the text (e.g. from and value)",
        )
    chosen = [(key, getattr(d, key)) for key in TAG_KEYS if getattr(d, key) is not None]
    for key, tag in chosen:
        if not tag.strip():
            raise XtrainError(f"data.{key} is empty", "set it to the speaker's name in the data, or unset it")
    for i, (key, tag) in enumerate(chosen):
        for other, again in chosen[i + 1 :]:
            if tag.casefold() == again.casefold():
                raise XtrainError(
                    f"data.{key} and data.{other} are both {tag!r}: the roles cannot be told apart",
                    "give each role the tag its turns carry in the data",
                )


def chat_column(d: DataConfig, fmt: str, columns: list[str]) -> str:
    """The column of a chat format's conversations: ``data.messages_column``; for sharegpt rows
    ``conversations`` unless the data has a ``data.messages_column``."""
    if fmt == "sharegpt" and d.messages_column not in columns:
        return SHAREGPT_COLUMN
    return d.messages_column


def mapped_turns(cell: Any, keys: TurnKeys, index: int, source: str, column: str) -> list[dict[str, Any]]:
    """One conversation cell as ``{role, content}`` turns (``chat_data.parse_conversation`` checks
    the rest: an assistant turn after a user turn, no empty answer, the content's parts)."""
    where = f"row {index} of {source}"
    shape = f"{{{keys.role[0]}, {keys.content[0]}}}"
    if not isinstance(cell, list) or not cell:
        raise BadRow(f"{where}: field '{column}' must be a non-empty list of {shape} turns")
    out = []
    for k, turn in enumerate(cell):
        if not isinstance(turn, dict):
            raise BadRow(f"{where}: {column}[{k}] is not a {shape} object")
        speaker = next((turn[key] for key in keys.role if turn.get(key) is not None), None)
        role = keys.role_of(speaker)
        if role is None:
            tags = ", ".join(dict.fromkeys(tag for tag, _ in keys.tags))
            name = keys.role[0]
            raise BadRow(f"{where}: {column}[{k}] field '{name}' is {speaker!r:.60} ({name}: {tags:.120})")
        value = next((turn[key] for key in keys.content if turn.get(key) is not None), None)
        if not isinstance(value, (str, list)):
            raise BadRow(f"{where}: {column}[{k}] field '{keys.content[0]}' is missing or not text")
        out.append({"role": role, "content": value})
    return out


def chat_turns(d: DataConfig, fmt: str, row: dict[str, Any], index: int, source: str) -> Any:
    """Row ``index`` of ``source`` (a chat-shaped format: messages, sharegpt, alpaca) as its
    ``messages`` cell, not yet checked by ``chat_data.parse_conversation``."""
    if fmt == "alpaca":
        return alpaca_messages(row, index, source)
    column = chat_column(d, fmt, list(row))
    keys = turn_keys(d, fmt)
    cell = row.get(column)
    return cell if keys is None else mapped_turns(cell, keys, index, source, column)


def chat_conversation(d: DataConfig, fmt: str, row: dict[str, Any], index: int, source: str) -> Conversation:
    """Row ``index`` of ``source`` read as text chat (``fmt``: ``detect`` of its columns): the
    checked ``chat_data.Conversation``, or a ``RowError`` naming the file, the row and the field."""
    from xtrain.data.rows import chat as chat_data

    turns = text_chat_turns(d, fmt, row, index, source)
    return chat_data.parse_conversation(turns, index, source, allow_images=False)


def text_chat_turns(d: DataConfig, fmt: str, row: dict[str, Any], index: int, source: str) -> Any:
    """``chat_turns`` for text chat: a row that lists images (``data.images_column``: LLaVA or
    LLaMA-Factory rows) is refused, as its images would be dropped."""
    images = row.get(d.images_column)
    if isinstance(images, (list, tuple, str, dict)) and images:
        raise BadRow(
            f"row {index} of {source}: field '{d.images_column}' lists images; causal-lm chat is text only",
            "use model.task=vision-language with a vision-language model, or drop the images",
        )
    return chat_turns(d, fmt, row, index, source)


def chat_columns(ds: Dataset, d: DataConfig, fmt: str, source: str) -> list[str]:
    """The columns a chat-shaped format reads (alpaca: its fields; else the conversations' column
    and the row's image list, which text chat refuses), refused in one line when missing."""
    if fmt == "alpaca":
        require(ds, ALPACA_REQUIRED, source, fmt)
        return [c for c in (*ALPACA_REQUIRED, *ALPACA_OPTIONAL) if c in ds.column_names]
    column = chat_column(d, fmt, list(ds.column_names))
    if column not in ds.column_names:  # (rows/columns.py checks this first, with the closest column)
        raise XtrainError(
            f"{fmt} rows need '{column}'; {source} has {', '.join(ds.column_names)}",
            "set data.messages_column to the column of conversations"
            if column == d.messages_column
            else "rename the column in the file, or set data.row_format to what the rows hold",
        )
    return [column, *([d.images_column] if d.images_column in ds.column_names else [])]


def conversations(ds: Dataset, d: DataConfig, fmt: str, source: str) -> list[Any]:
    """The ``messages`` cells of a chat-shaped dataset for text chat (``text_chat_turns``): as
    they are (``messages``), or mapped from sharegpt (or re-spelt messages) or alpaca rows."""
    names = chat_columns(ds, d, fmt, source)
    columns = {c: ds[c] for c in names}
    rows = ({c: columns[c][i] for c in names} for i in range(len(ds)))
    return [text_chat_turns(d, fmt, row, i, source) for i, row in enumerate(rows)]


def text_columns(cfg: TrainConfig, fmt: str) -> tuple[str | None, str | None, dict[str, str]]:
    """(prompt column, response column, the columns to require) of a non-chat format."""
    d = cfg.data
    if fmt == "alpaca":  # mapped to these two columns first (row_formats.alpaca_as_prompt_response)
        return "prompt", "response", {}
    if fmt == "prompt_response":
        prompt, response = d.prompt_column or "prompt", d.response_column or "response"
        return prompt, response, {"data.prompt_column": prompt, "data.response_column": response}
    return None, None, {"data.text_column": d.text_column}
