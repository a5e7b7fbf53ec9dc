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
