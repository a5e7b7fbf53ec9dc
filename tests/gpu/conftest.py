"""The GPU suite: skipped without CUDA. On a CUDA machine:

    python -m pytest -q tests/gpu

Two-GPU cases skip on one GPU. The suite's test processes (pytest-xdist) take the GPUs in turn:
one GPU test at a time holds a lock (``one_gpu_test_at_a_time``), so no test shares a card's
memory or its timings with another. tests/gpu is a package so that this conftest does not shadow
tests/conftest.py (both would be the module ``conftest``). docs/performance.md records what it
measured on which GPU."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


def _cuda_count() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        return 0


CUDA_COUNT = _cuda_count()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).resolve().parent
    for item in items:
        if here not in Path(str(item.fspath)).resolve().parents:
            continue
        if CUDA_COUNT == 0:
            item.add_marker(pytest.mark.skip(reason="no CUDA GPU (the GPU suite runs on a CUDA machine)"))
        elif item.get_closest_marker("two_gpus") and CUDA_COUNT < 2:
            item.add_marker(pytest.mark.skip(reason="needs 2 CUDA GPUs"))


@pytest.fixture(autouse=True)
def one_gpu_test_at_a_time() -> Iterator[None]:
    """Across the suite's test processes: the GPUs belong to one test at a time."""
    if CUDA_COUNT == 0:
        yield
        return
    from filelock import FileLock  # with huggingface_hub and datasets

    with FileLock(str(Path(tempfile.gettempdir()) / "xtrain-gpu-tests.lock")):
        yield
