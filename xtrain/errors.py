"""The one exception type for mistakes a user can make (bad input, bad environment).

The CLI catches it at the edge and prints ``message`` (what is wrong) and ``hint`` (what to
do) on one line, then exits non-zero. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class XtrainError(Exception):
    """A user-facing error: one clear line, a non-zero exit code, no traceback."""

    def __init__(self, message: str, hint: str | None = None, exit_code: int = 2) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.exit_code = exit_code

    def one_line(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message

    def __str__(self) -> str:
        return self.one_line()


class NoTokenizer(XtrainError):
    """A model folder without tokenizer files (a config.json alone: the memory plan of a model not
    downloaded yet). The run cannot tokenize; the dry run's data check reads the rows untokenized."""


class RowError(XtrainError):
    """A bad row of a data set: one line with the row and the file. A subclass names its ``HINT``
    (used when no hint is given).

    A DataLoader worker re-raises an exception in the main process as ``type(e)(traceback text)``;
    the constructor keeps only the original message from that text, so the user still sees one line,
    with its own hint when that is the ``HINT`` or one of the ``OTHER_HINTS`` of the subclass.
    """

    HINT = ""
    OTHER_HINTS: tuple[str, ...] = ()  # the other hints a subclass's errors carry

    def __init__(self, message: str, hint: str | None = None, exit_code: int = 2) -> None:
        if "Original Traceback" in message:
            last = message.rstrip().splitlines()[-1]
            message = last.split(": ", 1)[1] if ": " in last else last
            for known in (self.HINT, *self.OTHER_HINTS):
                if known and message.endswith(f" ({known})"):
                    message, hint = message.removesuffix(f" ({known})"), hint or known
                    break
        super().__init__(message, hint or self.HINT, exit_code)


# A value the user wrote, shown in an error line, takes at most this many characters: a config
# value can be a whole expanded structure, a data cell a whole document.
SHOWN_CHARS = 80


def shorten(text: str, limit: int = SHOWN_CHARS) -> str:
    """``text`` cut to ``limit`` characters, ending in "..." when cut."""
    return text if len(text) <= limit else text[: max(0, limit - 3)] + "..."


def shown(value: object, limit: int = SHOWN_CHARS) -> str:
    """A user's value as an error line shows it: text in quotes (its repr), anything else as
    Python prints it, cut to ``limit`` characters. Bounded work too: only the first items of a
    long or deeply nested list or mapping are rendered (``reprlib``), never the whole of it."""
    import reprlib

    if isinstance(value, str):
        return shorten(repr(value[: limit + 1]) if len(value) > limit else repr(value), limit)
    r = reprlib.Repr()
    r.maxlevel, r.maxdict = 3, 8
    r.maxlist = r.maxtuple = r.maxset = r.maxfrozenset = r.maxdeque = r.maxarray = 10
    r.maxstring = r.maxlong = r.maxother = limit
    return shorten(r.repr(value), limit)
