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


@pytest.fixture(scope="session", autouse=True)
def shared_hf_home(tmp_path_factory) -> Path:
    """The jobs' shared HF_HOME (support/jobs.py ``offline_env``): one for the test session."""
    from support import jobs

    jobs.SHARED_HF_HOME = tmp_path_factory.mktemp("hf-shared")
    return jobs.SHARED_HF_HOME


@pytest.fixture
def machine() -> Callable[[str], Facts]:
    """``machine("wsl2-2x4090")`` -> a fresh Facts for that fixture machine."""
    return load_machine


@pytest.fixture
def machines_dir() -> Path:
    return MACHINES_DIR


@pytest.fixture
def private_caches(tmp_path_factory, monkeypatch) -> Path:
    """Built-in assets (XTRAIN_CACHE) and the datasets cache in one temporary folder of the test
    session, shared by every module that uses it (each built-in is built once), and offline:
    hub lookups fail at once instead of retrying an unreachable network. A module makes it
    autouse with ``pytestmark = pytest.mark.usefixtures("private_caches")``."""
    import datasets
    import huggingface_hub.constants

    root = tmp_path_factory.getbasetemp() / "offline-caches"
    monkeypatch.setenv("XTRAIN_CACHE", str(root / "xtrain"))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(root / "datasets"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    return root
