"""The probes behind ``xtrain.machine.probe.collect``, by source: ``system.py`` (OS, memory,
hostname, port, packages), ``torch_stack.py`` (torch, backends, GPUs, P2P, libuv),
``nvidia.py`` (nvidia-smi), ``accelerate_config.py`` (accelerate's config file).

Each ``probe_x(facts) -> dict of field updates`` may raise: ``collect`` records the error.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from xtrain.machine.facts import Facts

if TYPE_CHECKING:
    from types import ModuleType

Probe = Callable[[Facts], dict[str, Any]]


def why(e: BaseException) -> str:
    """One line: the exception type and its text, lines joined (YAML errors say where on line 2)."""
    text = " ".join(line.strip() for line in str(e).splitlines() if line.strip())
    return f"{type(e).__name__}: {text}"[:300] if text else type(e).__name__


def loaded_torch() -> ModuleType | None:
    """torch if it imports (already imported by the torch probe), else None."""
    return sys.modules.get("torch")
