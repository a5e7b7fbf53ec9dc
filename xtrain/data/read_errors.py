"""What a data file that ``datasets`` could not read has wrong, in one line: the line of a
JSON-lines file that does not parse, a file that is not UTF-8, a CSV with a header only, a
datasets cache that cannot be written; else the reader's own first line."""

from __future__ import annotations

from pathlib import Path

from xtrain import atomic, encoding
from xtrain.data.files import open_text
from xtrain.errors import XtrainError


def first_line(e: BaseException) -> str:
    """The first line of an exception's message (its type's name when it has none)."""
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[0][:300]


def read_error(e: Exception, original: Path, source: str, builder: str) -> XtrainError:
    """The one line for ``e``, raised by ``datasets`` reading ``original`` (``source``: the
    name the user gave) with ``builder``."""
    import datasets

    cache = datasets.config.HF_DATASETS_CACHE  # where load_dataset writes its Arrow copy
    if refused := atomic.cannot_write(atomic.DATASETS_CACHE, cache, e):  # read-only or full
        return refused
    chain = [e]  # datasets wraps pyarrow's error ("An error occurred while generating the dataset")
    while (up := chain[-1].__cause__ or chain[-1].__context__) is not None and up not in chain:
        chain.append(up)
    parse = next((c for c in chain if "JSON parse error" in str(c)), None)
    if builder == "json" and parse is not None:
        if bad := bad_json_line(original):
            line, why = bad
            return XtrainError(f"data file {source}, line {line}: {why}", "fix or remove that line")
        e = parse  # type: ignore[assignment]
    cause: BaseException | None = e
    while cause is not None and not isinstance(cause, UnicodeDecodeError):
        cause = cause.__cause__ or cause.__context__
    if isinstance(cause, UnicodeDecodeError) or "codec can't decode" in str(e):
        # a non-UTF-8 byte past the part utf8_copy checks
        return encoding.not_utf8(original, "data file")
    if "corresponds to no data" in str(e):  # a CSV with a header line only
        return XtrainError(f"data file {source} has no rows", "add examples below the header")
    return XtrainError(f"cannot read {source} as {builder}: {first_line(e)}")


def bad_json_line(path: Path) -> tuple[int, str] | None:
    """(the number of the first line of a JSON-lines file that is not one JSON object of valid
    text, what is wrong with it), read again after pyarrow refused the file (its message counts
    rows of a block, not lines); None for a file that is one JSON document."""
    import json

    with open_text(path, encoding="utf-8-sig", errors="replace") as f:
        for number, text in enumerate(f, 1):
            line = text.rstrip("\r\n")
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                json.dumps(row, ensure_ascii=False).encode("utf-8")
            except json.JSONDecodeError as e:
                if number == 1 and line.lstrip()[:1] in ("[", "{") and len(line.strip()) < 2:
                    return None  # one JSON document over several lines, not JSON lines
                return number, f"not valid JSON ({e.msg}, column {e.colno})"
            except UnicodeEncodeError:
                return number, "a \\u escape that is half of a character (a lone surrogate)"
            if not isinstance(row, dict):
                return number, f"a JSON {type(row).__name__}, not an object with named fields"
    return None
