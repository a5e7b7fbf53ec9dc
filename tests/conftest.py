"""Shared test fixtures. Other test modules may append their own fixtures below."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from xtrain.machine.facts import Facts  # imports none of the Hugging Face libraries

# No test downloads anything, and the Hugging Face libraries read these once, at import: set
# before any test imports them, so an in-process lookup of a hub id fails at once instead of
# retrying an unreachable network (the docs' hub ids took minutes where a test had imported
# transformers before the docs session set them). Subprocesses inherit them.
for _name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
    os.environ.setdefault(_name, "1")

if os.environ.get("CI"):  # .ci/run: the property tests draw the same examples every run
    from hypothesis import settings

    # CI decides whether a change lands: a new example found by chance there would stop an
    # unrelated change. Everywhere else the draws stay random and keep exploring.
    settings.register_profile("ci", derandomize=True)
    settings.load_profile("ci")

if os.environ.get("PYTEST_XDIST_WORKER"):  # one of several test processes on the cores
    import torch

    # one compute thread each: two workers' OpenMP threads spinning on two cores slow both down
    # by far more than the second thread gains
    torch.set_num_threads(1)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto`` (pyproject's addopts): two test processes for the suite or a folder of it, none
    for named files or tests (starting the workers costs more than they save there). Two, not one
    a core: each holds its own warm interpreters (support/warm.py) and the multi-process tests
    start processes of their own."""
    named = [a for a in config.args if "::" in a or a.endswith(".py")]
    return 0 if named else 2


# Files whose few tests outlast most whole files (the benchmarks' smoke run: minutes), handed to a
# test process first: the other process works through the rest meanwhile, instead of one process
# starting them last while the other waits (xdist's own order, the most tests first, put them last).
LONG_FIRST = ("test_benchmarks_smoke.py",)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The order the test processes take files in (``--no-loadscope-reorder`` in pyproject's
    addopts keeps it): ``LONG_FIRST``, then the files with the most tests first (xdist's usual)."""
    from collections import Counter

    counts = Counter(item.path for item in items)
    items.sort(key=lambda item: (item.path.name not in LONG_FIRST, -counts[item.path]))


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


LAUNCH_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture(autouse=True)
def launch_variables_as_they_were() -> Iterator[None]:
    """A test leaves the launch variables as it found them: accelerate's in-process state writes
    RANK, LOCAL_WORLD_SIZE and MASTER_PORT into os.environ on a CPU group. test_bad_inputs.py runs
    a rank of a 2-process launch in this process (WORLD_SIZE monkeypatched, LOCAL_WORLD_SIZE
    not), and its LOCAL_WORLD_SIZE=1 stayed behind for the next test on that test process (the
    suite's only such leak, found by logging every test's changes over a full run)."""
    before = {k: os.environ.get(k) for k in LAUNCH_VARIABLES}
    yield
    for key, value in before.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


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
