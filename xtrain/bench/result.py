"""What ``xtrain bench`` reports: ``BenchResult`` (``--json`` prints it) and the machine it ran on."""

from __future__ import annotations

import os
import platform as _platform
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from xtrain.bench.rates import RunFigures

if TYPE_CHECKING:
    from xtrain.machine.facts import Facts


@dataclass
class BenchResult:
    """What `xtrain bench` measured (``--json`` prints ``to_dict()``)."""

    size: str
    model: dict[str, Any]  # layers, hidden, seq_len, params, trainable, flops_per_token, ...
    mode: str  # lora | full
    device: str
    gpu: str | None
    precision: str
    tf32: bool
    launcher: str
    runs: list[RunFigures] = field(default_factory=list)
    speedup: float | None = None
    efficiency: float | None = None
    allreduce: dict[str, Any] | None = None  # from xtrain.launch.smoke (busbw_gbps, algbw_gbps, ...)
    peak_tflops: float | None = None
    peak_name: str | None = None  # the table entry used; None: "unknown"
    peak_source: str | None = None
    machine: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def machine_info(facts: Facts) -> dict[str, Any]:
    """Machine and versions, for the record."""
    import torch

    info: dict[str, Any] = {
        "os": f"{_platform.system()} {_platform.release()}",
        "os_kind": facts.os_kind,
        "python": _platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cpu": _platform.processor() or _platform.machine(),
        "cpu_count": os.cpu_count(),
        "gpus": [g.name for g in facts.gpus],
        "load_average": load_average(),
    }
    for pkg in ("accelerate", "transformers", "peft", "datasets"):
        info[pkg] = (facts.packages or {}).get(pkg) or _version(pkg)
    return info


def load_average() -> float | None:
    """The 1-minute load average (None where the OS has none, e.g. Windows)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def _version(pkg: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(pkg)
    except PackageNotFoundError:
        return None
