"""Collect ``Facts`` from the real machine.

Each fact comes from one small probe function ``probe_x(facts) -> dict of field updates``.
``collect`` runs them in order and records any exception in ``facts.probe_errors[name]``
instead of raising: a broken driver, a missing nvidia-smi or a torch that fails to import is
something to report, not a crash. Later probes read what earlier ones found (the GPU probe
needs torch, the P2P probe needs the GPUs).

``collect(quick=True)`` is what `xtrain train` and the training workers plan from. It skips what
is slow and does not change the plan (hostname resolution, the port check, the TCPStore test,
accelerate's own config loader) but collects every fact the plan reads the same way doctor does:
the P2P matrix (a few CUDA calls, only with 2+ GPUs), the driver version (one nvidia-smi call,
only where it changes the plan: 2+ RTX 40 cards, whose P2P report is trusted only from driver
550.40.07 on) and the launch variables already set (NCCL_P2P_DISABLE, ...). It costs little
beyond ``import torch``.

Parsing is kept in pure functions (``classify_os``, ``parse_smi_header``, ``parse_smi_query``,
``accelerate_config_path``) so it is tested without the hardware.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from xtrain.machine.facts import DEFAULT_PORT, GPU, Facts

PACKAGES = ("accelerate", "transformers", "peft", "datasets")
# Variables a user may already have set that change how processes connect (shown by doctor,
# kept in facts so `xtrain train` and doctor see the same environment).
LAUNCH_ENV = (
    "NCCL_P2P_DISABLE",
    "NCCL_P2P_LEVEL",
    "NCCL_IB_DISABLE",
    "NCCL_SHM_DISABLE",
    "NCCL_SOCKET_IFNAME",
    "GLOO_SOCKET_IFNAME",
    "USE_LIBUV",
)
SMI_TIMEOUT_S = 5.0
RESOLVE_TIMEOUT_S = 2.0
STORE_TIMEOUT_S = 2.0

Probe = Callable[[Facts], dict[str, Any]]


# -- pure helpers (tested directly) -------------------------------------------------------------
def classify_os(system: str, release: str) -> str:
    """windows | wsl2 | linux | macos from ``platform.system()`` and ``platform.uname().release``."""
    s = system.lower()
    if s == "windows" or s.startswith(("cygwin", "msys", "mingw")):
        return "windows"
    if s == "darwin":
        return "macos"
    # WSL2 kernels are named like 5.15.167.4-microsoft-standard-WSL2 (WSL1: 4.4.0-19041-Microsoft).
    if "microsoft" in release.lower():
        return "wsl2"
    return "linux"


def parse_smi_header(text: str) -> tuple[str | None, str | None]:
    """(driver version, highest CUDA version the driver supports) from plain ``nvidia-smi`` output."""
    driver = re.search(r"Driver Version:\s*([\d.]+)", text)
    cuda = re.search(r"CUDA Version:\s*([\d.]+)", text)
    return (driver.group(1) if driver else None, cuda.group(1) if cuda else None)


def parse_smi_query(text: str) -> list[tuple[str, int | None, str | None]]:
    """Rows of ``--query-gpu=name,memory.total,driver_version --format=csv,noheader,nounits``."""
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = [p.strip() for p in line.rsplit(",", 2)]
        if len(parts) != 3:
            continue
        name, mem, driver = parts
        mem_mib = int(float(mem)) if re.fullmatch(r"[\d.]+", mem) else None
        rows.append((name, mem_mib, driver if re.fullmatch(r"[\d.]+", driver) else None))
    return rows


def accelerate_config_path(environ: Mapping[str, str] | None = None) -> Path:
    """accelerate's default config file, computed as accelerate 1.x does (config_args.py).

    ``$HF_HOME/accelerate/default_config.yaml``, else ``$XDG_CACHE_HOME/huggingface/...``, else
    ``~/.cache/huggingface/...``, read at call time with ``os.environ.get(name, default)`` exactly
    as accelerate reads them (a set but empty variable counts as set). Computed here so that
    probing does not import accelerate; ``xtrain configure`` writes to the same path.
    """
    env = os.environ if environ is None else environ
    hf_home = env.get("HF_HOME", os.path.join(env.get("XDG_CACHE_HOME", "~/.cache"), "huggingface"))
    return Path(os.path.expanduser(hf_home)) / "accelerate" / "default_config.yaml"


def _why(e: BaseException) -> str:
    """One line: the exception type and its text, lines joined (YAML errors say where on line 2)."""
    text = " ".join(line.strip() for line in str(e).splitlines() if line.strip())
    return f"{type(e).__name__}: {text}"[:300] if text else type(e).__name__


def _torch() -> Any:
    """torch if it imports (already imported by the torch probe), else None."""
    return sys.modules.get("torch")


# -- probes: each returns the Facts fields it found ------------------------------------------------
def probe_platform(facts: Facts) -> dict[str, Any]:
    uname = platform.uname()
    kind = classify_os(uname.system, uname.release)
    if kind == "windows":
        release = platform.version()  # 10.0.22631 (Windows 11 keeps the 10.0 prefix)
    elif kind == "macos":
        release = platform.mac_ver()[0] or uname.release
    else:
        release = uname.release
    try:
        cpus = len(os.sched_getaffinity(0))  # the cores this process may use (containers, taskset)
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return {
        "os_kind": kind,
        "os_release": release,
        "arch": uname.machine,
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "cpu_count": cpus,
    }


def probe_memory(facts: Facts) -> dict[str, Any]:
    if sys.platform == "win32":
        import ctypes

        class MemoryStatus(ctypes.Structure):
            _fields_ = [
                ("dwLength", ctypes.c_ulong),
                ("dwMemoryLoad", ctypes.c_ulong),
                ("ullTotalPhys", ctypes.c_ulonglong),
                ("ullAvailPhys", ctypes.c_ulonglong),
                ("ullTotalPageFile", ctypes.c_ulonglong),
                ("ullAvailPageFile", ctypes.c_ulonglong),
                ("ullTotalVirtual", ctypes.c_ulonglong),
                ("ullAvailVirtual", ctypes.c_ulonglong),
                ("ullAvailExtendedVirtual", ctypes.c_ulonglong),
            ]

        status = MemoryStatus()
        status.dwLength = ctypes.sizeof(MemoryStatus)
        if not ctypes.windll.kernel32.GlobalMemoryStatusEx(ctypes.byref(status)):  # type: ignore[attr-defined]
            raise OSError("GlobalMemoryStatusEx failed")
        return {"memory_mib": status.ullTotalPhys // 2**20}
    return {"memory_mib": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20}


def probe_hostname(facts: Facts) -> dict[str, Any]:
    return {"hostname": socket.gethostname()}


def probe_hostname_resolves(facts: Facts) -> dict[str, Any]:
    """getaddrinfo has no timeout of its own: ask in a daemon thread and stop waiting after 2 s."""
    name = facts.hostname
    if not name.strip():
        return {"hostname_resolves": False}
    result: list[bool] = []

    def resolve() -> None:
        try:
            result.append(bool(socket.getaddrinfo(name, None)))
        except OSError:
            result.append(False)

    worker = threading.Thread(target=resolve, name="xtrain-resolve", daemon=True)
    worker.start()
    worker.join(RESOLVE_TIMEOUT_S)
    return {"hostname_resolves": result[0] if result else False}


def probe_torch(facts: Facts) -> dict[str, Any]:
    # Any exception, not only ImportError: a broken install fails with OSError (Windows DLLs).
    torch = importlib.import_module("torch")
    mps = getattr(torch.backends, "mps", None)
    return {
        "torch_version": str(torch.__version__),
        "torch_cuda": torch.version.cuda,
        "cuda_available": bool(torch.cuda.is_available()),
        "mps_available": bool(mps is not None and mps.is_available()),
    }


def probe_backends(facts: Facts) -> dict[str, Any]:
    torch = _torch()
    if torch is None:
        return {}
    import torch.distributed as dist

    if not dist.is_available():
        return {"nccl_available": False, "gloo_available": False, "mpi_available": False}
    nccl = bool(dist.is_nccl_available())
    version = None
    if nccl:
        v = torch.cuda.nccl.version()
        version = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    return {
        "nccl_available": nccl,
        "nccl_version": version,
        "gloo_available": bool(dist.is_gloo_available()),
        "mpi_available": bool(dist.is_mpi_available()),
    }


def probe_gpus(facts: Facts) -> dict[str, Any]:
    torch = _torch()
    if torch is None or not facts.cuda_available:
        return {}
    gpus = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        gpus.append(
            GPU(
                index=i,
                name=str(props.name),
                memory_mib=int(props.total_memory // 2**20),
                capability=(int(props.major), int(props.minor)),
            )
        )
    return {"gpus": gpus}


def probe_p2p(facts: Facts) -> dict[str, Any]:
    torch = _torch()
    n = len(facts.gpus)
    if torch is None or n < 2:
        return {}
    return {
        "p2p": [[i == j or bool(torch.cuda.can_device_access_peer(i, j)) for j in range(n)] for i in range(n)]
    }


def find_nvidia_smi() -> str | None:
    found = shutil.which("nvidia-smi")
    if found:
        return found
    for candidate in (
        "/usr/lib/wsl/lib/nvidia-smi",  # WSL2: the Windows driver's tools, not always on PATH
        r"C:\Windows\System32\nvidia-smi.exe",
        r"C:\Program Files\NVIDIA Corporation\NVSMI\nvidia-smi.exe",
    ):
        if os.path.isfile(candidate):
            return candidate
    return None


def probe_nvidia_smi_present(facts: Facts) -> dict[str, Any]:
    return {"nvidia_smi": find_nvidia_smi() is not None}


def probe_nvidia_smi(facts: Facts) -> dict[str, Any]:
    exe = find_nvidia_smi()
    if exe is None:
        return {"nvidia_smi": False}
    facts.nvidia_smi = True  # present even if running it fails below (a driver that does not answer)

    def run(*args: str) -> str:
        done = subprocess.run(
            [exe, *args], capture_output=True, text=True, timeout=SMI_TIMEOUT_S, check=False
        )
        if done.returncode != 0:
            out = (done.stdout + done.stderr).strip().splitlines()
            raise RuntimeError(f"nvidia-smi exited {done.returncode}: {out[0] if out else ''}".strip())
        return done.stdout

    driver, driver_cuda = parse_smi_header(run())
    rows = parse_smi_query(
        run("--query-gpu=name,memory.total,driver_version", "--format=csv,noheader,nounits")
    )
    return {
        "nvidia_smi": True,
        "driver_version": driver or next((r[2] for r in rows if r[2]), None),
        "driver_cuda": driver_cuda,
        "smi_gpu_count": len(rows),
        "smi_gpu_names": [r[0] for r in rows],
    }


TORCHRUN_STORES = (
    "torch.distributed.elastic.rendezvous.static_tcp_rendezvous",
    "torch.distributed.elastic.rendezvous.c10d_rendezvous_backend",
)


def probe_torchrun_libuv(facts: Facts) -> dict[str, Any]:
    """Do torchrun's rendezvous stores (accelerate's ``rdzv_backend: static`` and ``c10d``) pass
    ``use_libuv`` to their TCPStore? In torch 2.13 they do not, so the C++ default (libuv) applies
    whatever USE_LIBUV says, and a Windows wheel (no libuv) cannot start torchrun (pytorch#148283;
    fixes #175316 closed, #196855 open). A torch whose store code names ``use_libuv`` has the fix."""
    if _torch() is None:
        return {}
    import importlib
    import inspect

    for name in TORCHRUN_STORES:
        if "use_libuv" not in inspect.getsource(importlib.import_module(name)):
            return {"torchrun_honours_use_libuv": False}
    return {"torchrun_honours_use_libuv": True}


def probe_env(facts: Facts) -> dict[str, Any]:
    return {
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "launch_env": {k: os.environ[k] for k in LAUNCH_ENV if k in os.environ},
    }


def needs_driver_version(facts: Facts) -> bool:
    """The plan reads the driver version only for 2+ RTX 40 cards (rules._p2p_missing)."""
    from xtrain.planning.rules import is_rtx40  # pure; imported here to keep probe -> rules one-way

    return len(facts.gpus) >= 2 and any(is_rtx40(g) for g in facts.gpus)


def probe_driver_for_plan(facts: Facts) -> dict[str, Any]:
    """Quick mode: the driver version by one nvidia-smi query, only where the plan needs it."""
    if not needs_driver_version(facts):
        return {}
    exe = find_nvidia_smi()
    if exe is None:
        return {}
    done = subprocess.run(
        [exe, "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=SMI_TIMEOUT_S,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"nvidia-smi exited {done.returncode}")
    rows = parse_smi_query(done.stdout)
    return {
        "driver_version": next((r[2] for r in rows if r[2]), None),
        "smi_gpu_count": len(rows),
        "smi_gpu_names": [r[0] for r in rows],
    }


def probe_libuv(facts: Facts) -> dict[str, Any]:
    """Can a TCPStore with libuv start? Windows wheels lack libuv (pytorch#139990, #148283)."""
    torch = _torch()
    if torch is None:
        return {}
    import torch.distributed as dist

    if not dist.is_available():
        return {}
    from datetime import timedelta

    try:
        store = dist.TCPStore(
            "127.0.0.1",
            0,  # any free port
            is_master=True,
            use_libuv=True,
            wait_for_workers=False,
            timeout=timedelta(seconds=STORE_TIMEOUT_S),
        )
    except Exception as e:  # the libuv error is a RuntimeError; keep its text for doctor
        return {"libuv_ok": False, "libuv_error": _why(e)}
    ok = bool(getattr(store, "libuvBackend", True))
    del store
    return {"libuv_ok": ok}


def probe_shm(facts: Facts) -> dict[str, Any]:
    if facts.os_kind not in ("linux", "wsl2") or not os.path.isdir("/dev/shm"):
        return {}
    st = os.statvfs("/dev/shm")
    return {"shm_mib": st.f_blocks * st.f_frsize // 2**20}


def probe_packages(facts: Facts) -> dict[str, Any]:
    """Installed versions from package metadata: nothing is imported."""
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return {"packages": versions}


def probe_accelerate_config(facts: Facts) -> dict[str, Any]:
    """accelerate's default config: where it is, what it says, or why it cannot be read."""
    path = accelerate_config_path()
    found: dict[str, Any] = {"accelerate_config_path": str(path)}
    if not path.is_file():
        return found
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        found["accelerate_config_error"] = _why(e)
        return found
    if not isinstance(data, dict):
        found["accelerate_config_error"] = f"expected a mapping of settings, found {type(data).__name__}"
        return found
    # YAML may hold dates or other objects: keep the snapshot JSON-serialisable.
    found["accelerate_config"] = json.loads(json.dumps(data, default=str))
    return found


def probe_accelerate_loads(facts: Facts) -> dict[str, Any]:
    """Full mode: let accelerate's own (strict) loader judge the file, as `accelerate launch` will."""
    if facts.accelerate_config is None or not facts.packages.get("accelerate"):
        return {}
    from accelerate.commands.config.config_args import load_config_from_file

    try:
        load_config_from_file(facts.accelerate_config_path)
    except Exception as e:  # unknown keys, bad enum values: exactly what `accelerate launch` hits
        return {"accelerate_config_error": _why(e)}
    return {}


def probe_port(facts: Facts) -> dict[str, Any]:
    """Is the rendezvous port free on 127.0.0.1 (where xtrain's single-machine store listens)?"""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        if sys.platform != "win32":
            # Like the TCPStore server: a socket in TIME_WAIT does not count as busy. (On Windows
            # SO_REUSEADDR would let us bind over a live listener, so it stays off there.)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", facts.port))
        except OSError:
            return {"port_free": False}
    return {"port_free": True}


# -- the collection -------------------------------------------------------------------------------
QUICK_PROBES: tuple[tuple[str, Probe], ...] = (
    ("platform", probe_platform),
    ("memory", probe_memory),
    ("hostname", probe_hostname),
    ("torch", probe_torch),
    ("backends", probe_backends),
    ("torchrun_libuv", probe_torchrun_libuv),
    ("gpus", probe_gpus),
    ("p2p", probe_p2p),
    ("nvidia_smi", probe_nvidia_smi_present),
    ("driver", probe_driver_for_plan),
    ("env", probe_env),
    ("shm", probe_shm),
    ("packages", probe_packages),
    ("accelerate_config", probe_accelerate_config),
)
FULL_PROBES: tuple[tuple[str, Probe], ...] = (
    ("platform", probe_platform),
    ("memory", probe_memory),
    ("hostname", probe_hostname),
    ("hostname_resolves", probe_hostname_resolves),
    ("torch", probe_torch),
    ("backends", probe_backends),
    ("gpus", probe_gpus),
    ("p2p", probe_p2p),
    ("nvidia_smi", probe_nvidia_smi),
    ("env", probe_env),
    ("libuv", probe_libuv),
    ("torchrun_libuv", probe_torchrun_libuv),
    ("shm", probe_shm),
    ("packages", probe_packages),
    ("accelerate_config", probe_accelerate_config),
    ("accelerate_loads", probe_accelerate_loads),
    ("port", probe_port),
)


def run_probe(facts: Facts, name: str, probe: Probe) -> None:
    """Apply one probe's findings to ``facts``; a failure becomes ``probe_errors[name]``."""
    try:
        updates = probe(facts)
    except Exception as e:
        facts.probe_errors[name] = _why(e)
        return
    for key, value in updates.items():
        setattr(facts, key, value)


def collect(quick: bool = False, port: int = DEFAULT_PORT) -> Facts:
    """Snapshot this machine. Never raises for what the machine lacks; see ``probe_errors``."""
    facts = Facts(port=port)
    for name, probe in QUICK_PROBES if quick else FULL_PROBES:
        run_probe(facts, name, probe)
    return facts
