"""The GPU suite: skipped without CUDA. On a CUDA machine:

    python -m pytest -q tests/gpu

Two-GPU cases skip on one GPU. tests/gpu is a package so that this conftest does not shadow
tests/conftest.py (both would be the module ``conftest``). docs/performance.md records what it
measured on which GPU."""

from __future__ import annotations

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
