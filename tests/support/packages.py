"""Installed packages as a test needs them to look."""

from __future__ import annotations

import importlib.metadata
import sys
from typing import Any


def hide_bitsandbytes(monkeypatch: Any) -> None:
    """bitsandbytes as if not installed: no distribution (``importlib.metadata.version`` raises
    PackageNotFoundError) and no module (every ``import bitsandbytes...`` fails)."""
    version = importlib.metadata.version

    def without(name: str) -> str:
        if name == "bitsandbytes":
            raise importlib.metadata.PackageNotFoundError(name)
        return version(name)

    monkeypatch.setattr(importlib.metadata, "version", without)
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)
    for name in [m for m in sys.modules if m.startswith("bitsandbytes.")]:
        monkeypatch.setitem(sys.modules, name, None)
