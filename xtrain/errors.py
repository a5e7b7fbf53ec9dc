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


class RowError(XtrainError):
    """A bad row of a data set: one line with the row and the file. A subclass names its ``HINT``
    (used when no hint is given).

    A DataLoader worker re-raises an exception in the main process as ``type(e)(traceback text)``;
    the constructor keeps only the original message from that text, so the user still sees one line.
    """

    HINT = ""

    def __init__(self, message: str, hint: str | None = None, exit_code: int = 2) -> None:
        if "Original Traceback" in message:
            last = message.rstrip().splitlines()[-1]
            message = last.split(": ", 1)[1] if ": " in last else last
            message = message.removesuffix(f" ({self.HINT})")
        super().__init__(message, hint or self.HINT, exit_code)
