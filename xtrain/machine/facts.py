"""Machine facts: one plain, JSON-serialisable snapshot of what this machine is and can do.

Facts are data only. ``xtrain.machine.probe`` collects them from the real machine; ``xtrain.planning.rules``
turns them into a plan and findings without touching the machine, so every platform can be
tested here from a saved snapshot (``tests/fixtures/machines/*.json``).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from types import UnionType
from typing import Any, Union, get_args, get_origin, get_type_hints

from xtrain import structured
from xtrain.encoding import read_text
from xtrain.errors import XtrainError

SCHEMA_VERSION = 1
OS_KINDS = ("windows", "wsl2", "linux", "macos")
DEFAULT_PORT = 29500


@dataclass
class GPU:
    """One GPU visible to torch (after CUDA_VISIBLE_DEVICES)."""

    index: int
    name: str
    memory_mib: int
    capability: tuple[int, int] | None = None  # (major, minor), e.g. (8, 9) for a 4090

    @property
    def cc(self) -> float:
        """Compute capability as a comparable number (8.9), 0.0 when unknown."""
        return self.capability[0] + self.capability[1] / 10 if self.capability else 0.0


def is_geforce(gpu: GPU) -> bool:
    """Consumer GeForce cards (RTX 4090, 3090, ...), as opposed to datacenter/workstation parts."""
    name = gpu.name.upper()
    if "GEFORCE" in name or "TITAN" in name:
        return True
    # A bare "RTX 4090" is a GeForce card; "RTX 6000 Ada", "Quadro RTX 8000", "RTX A6000" are not.
    return bool(re.search(r"\bRTX [2-5]0[5-9]0\b", name)) and not re.search(r"QUADRO|ADA|\bRTX A", name)


def is_rtx40(gpu: GPU) -> bool:
    """Ada GeForce (RTX 40 series): no P2P between cards; NCCL hangs without NCCL_P2P_DISABLE."""
    return is_geforce(gpu) and bool(re.search(r"RTX 40\d\d", gpu.name.upper()))


def version_tuple(text: str | None) -> tuple[int, ...]:
    """A version as comparable numbers ("550.40.07" -> (550, 40, 7)); () when unknown."""
    if not text:
        return ()
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3])


def _matches(value: Any, hint: Any) -> bool:
    """A shallow isinstance for the annotations Facts uses (unions, list[...], dict[...])."""
    if hint is Any:
        return True
    if value is None:
        return hint is type(None) or type(None) in get_args(hint)
    origin = get_origin(hint)
    if origin in (Union, UnionType):
        return any(_matches(value, arg) for arg in get_args(hint) if arg is not type(None))
    if origin is not None:
        return isinstance(value, origin)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, hint)


def _as_list(value: Any, name: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ValueError(f"{name} should be a list, got {value!r}"[:200])
    return value


def _gpu_from_dict(g: object) -> GPU:
    if not isinstance(g, dict):
        raise ValueError(f"each GPU should be an object, got {g!r}"[:200])
    cap = g.get("capability")
    return GPU(
        index=int(g["index"]),
        name=str(g["name"]),
        memory_mib=int(g.get("memory_mib") or 0),
        capability=(int(cap[0]), int(cap[1])) if cap else None,
    )


def _impossible(facts: Facts) -> str | None:
    """The first value no machine can have (a hand-edited or truncated snapshot), else None."""
    if facts.cpu_count < 1:
        return f"cpu_count={facts.cpu_count}"
    if not 0 < facts.port < 65536:
        return f"port={facts.port}"
    for name in ("memory_mib", "shm_mib", "smi_gpu_count", "load_average"):
        value = getattr(facts, name)
        if value is not None and value < 0:
            return f"{name}={value}"
    indexes = [g.index for g in facts.gpus]
    if any(i < 0 for i in indexes) or len(set(indexes)) != len(indexes):
        return f"GPU indexes {indexes}"
    for g in facts.gpus:
        if g.memory_mib < 0:
            return f"GPU {g.index} memory_mib={g.memory_mib}"
    return None


def _check_types(values: dict[str, Any]) -> None:
    """Refuse a hand-edited snapshot whose values have the wrong type (one clear line)."""
    hints = get_type_hints(Facts)
    for name, value in values.items():
        if name != "gpus" and not _matches(value, hints[name]):
            expected = getattr(hints[name], "__name__", str(hints[name]))
            raise ValueError(f"{name} should be {expected}, got {value!r}"[:200])


@dataclass
class Facts:
    """Everything the rules need to know about one machine. Unknown values are None."""

    os_kind: str = "linux"  # windows | wsl2 | linux | macos
    os_release: str = ""
    arch: str = ""
    hostname: str = ""
    hostname_resolves: bool | None = None
    python: str = ""
    python_executable: str = ""  # sys.executable: fixes run pip with this interpreter
    cpu_count: int = 1
    # the 1-minute load average (runnable processes); None: unknown (Windows, older snapshots)
    load_average: float | None = None
    memory_mib: int | None = None
    # torch
    torch_version: str | None = None  # None: torch not importable
    torch_cuda: str | None = None  # torch.version.cuda; None for a CPU (or MPS) build
    cuda_available: bool = False
    mps_available: bool = False
    nccl_available: bool = False
    nccl_version: str | None = None
    gloo_available: bool = False
    mpi_available: bool = False
    libuv_ok: bool | None = None  # a TCPStore with use_libuv=True could start
    libuv_error: str | None = None  # why it could not (torch's own message)
    # torchrun's rendezvous stores pass use_libuv, so USE_LIBUV=0 reaches them (not in torch 2.13)
    torchrun_honours_use_libuv: bool | None = None
    # NVIDIA driver and GPUs
    nvidia_smi: bool = False
    driver_version: str | None = None
    driver_cuda: str | None = None  # highest CUDA the driver supports (nvidia-smi header)
    smi_gpu_count: int | None = None  # physical GPUs nvidia-smi lists (ignores CUDA_VISIBLE_DEVICES)
    smi_gpu_names: list[str] = field(default_factory=list)
    gpus: list[GPU] = field(default_factory=list)  # what torch sees
    cuda_visible_devices: str | None = None
    # variables already set in the environment that change how processes connect (LAUNCH_ENV)
    launch_env: dict[str, str] = field(default_factory=dict)
    p2p: list[list[bool]] | None = None  # p2p[i][j]: GPU i can access GPU j directly
    # OS resources
    shm_mib: int | None = None  # /dev/shm size (Linux/WSL2)
    # Python packages
    packages: dict[str, str | None] = field(default_factory=dict)
    # the native backends of the installed bitsandbytes, from its library files ("cpu",
    # "cuda126", ...; machine/quant_support.py); None: not installed or not probed (older snapshots)
    bitsandbytes_backends: list[str] | None = None
    # accelerate's default config file
    accelerate_config_path: str | None = None
    accelerate_config: dict[str, Any] | None = None
    accelerate_config_error: str | None = None
    # rendezvous
    port: int = DEFAULT_PORT
    port_free: bool | None = None
    # probe steps that failed, with why (a failed probe is a fact, not a crash)
    probe_errors: dict[str, str] = field(default_factory=dict)
    schema: int = SCHEMA_VERSION

    # -- serialisation -------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["gpus"] = [
            {**g, "capability": list(g["capability"]) if g["capability"] else None} for g in data["gpus"]
        ]
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Facts:
        if not isinstance(data, dict):
            raise XtrainError("facts must be a JSON object", "save one with `xtrain doctor --save`")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise XtrainError(
                # a key with a line break or other oddities is shown quoted: still one line
                f"facts have unknown keys: {', '.join(k if k.isidentifier() else repr(k) for k in unknown)}",
                "save a fresh one with `xtrain doctor --save FILE`",
            )
        values = dict(data)
        try:
            values["gpus"] = [_gpu_from_dict(g) for g in _as_list(values.get("gpus"), "gpus")]
            _check_types(values)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
            what = f"missing key {e}" if isinstance(e, KeyError) else str(e)
            raise XtrainError(
                f"facts are malformed: {what}", "save a fresh one with `xtrain doctor --save FILE`"
            ) from None
        facts = cls(**values)
        if facts.os_kind not in OS_KINDS:
            raise XtrainError(
                f"facts have os_kind={facts.os_kind!r}",
                f"use one of {', '.join(OS_KINDS)}",
            )
        impossible = _impossible(facts)
        if impossible:
            raise XtrainError(
                f"facts have an impossible value: {impossible}",
                "save a fresh one with `xtrain doctor --save FILE`",
            )
        return facts

    @classmethod
    def load(cls, path: str | Path) -> Facts:
        p = Path(path)
        try:
            # a snapshot saved with PowerShell's `>` is UTF-16; ANSI bytes get a one-line refusal
            text = read_text(p, "facts file")
        except OSError as e:
            raise XtrainError(
                f"cannot read facts file {p}: {e.strerror or e}",
                "check the path, or save one with `xtrain doctor --save FILE`",
            ) from None
        # no key twice, no nesting past any snapshot (json recurses: RecursionError otherwise)
        fresh = "save a fresh one with `xtrain doctor --save FILE`"
        data = structured.read_json(text, f"facts file {p}", fresh)
        if isinstance(data, dict) and {"facts", "plan", "findings"} <= set(data):
            data = data["facts"]  # `xtrain doctor --json > FILE` (PowerShell writes it as UTF-16)
        try:
            return cls.from_dict(data)
        except XtrainError as e:
            raise XtrainError(f"{p}: {e.message}", e.hint) from None

    # -- derived views ---------------------------------------------------------------------
    @property
    def gpu_count(self) -> int:
        return len(self.gpus)

    @property
    def is_windows(self) -> bool:
        return self.os_kind == "windows"
