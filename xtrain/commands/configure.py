"""`xtrain configure` (placeholder: replaced by the full command)."""

from __future__ import annotations


def configure() -> None:
    """Check this machine for multi-GPU training and print findings with fixes."""
    raise NotImplementedError
