"""`xtrain doctor` (placeholder: replaced by the full command)."""

from __future__ import annotations


def doctor() -> None:
    """Check this machine for multi-GPU training and print findings with fixes."""
    raise NotImplementedError
