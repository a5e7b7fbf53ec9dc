"""Shared test fixtures. Other test modules may append their own fixtures below."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from xtrain.machine.facts import Facts

MACHINES_DIR = Path(__file__).parent / "fixtures" / "machines"
MACHINE_NAMES = sorted(p.stem for p in MACHINES_DIR.glob("*.json"))


def load_machine(name: str) -> Facts:
    """A saved machine snapshot from tests/fixtures/machines (e.g. "windows-2x4090")."""
    return Facts.load(MACHINES_DIR / f"{name}.json")


@pytest.fixture
def machine() -> Callable[[str], Facts]:
    """``machine("wsl2-2x4090")`` -> a fresh Facts for that fixture machine."""
    return load_machine


@pytest.fixture
def machines_dir() -> Path:
    return MACHINES_DIR
