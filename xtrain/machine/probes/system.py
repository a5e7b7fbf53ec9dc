"""Probes of the operating system and the Python around xtrain: OS, CPUs, memory, hostname, the
launch variables, /dev/shm, package versions, the rendezvous port."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import socket
import sys
import threading
from typing import Any

from xtrain.machine.facts import Facts
from xtrain.machine.quant_support import PACKAGE as BITSANDBYTES
from xtrain.machine.quant_support import library_backends

PACKAGES = ("accelerate", "transformers", "peft", "datasets", "triton", "bitsandbytes")
# where a package ships under another distribution name on some platform (the module is the same)
DISTRIBUTIONS = {"triton": ("triton", "triton-windows")}
# Variables a user may already have set that change how processes connect or compute (shown by
# doctor, kept in facts so `xtrain train` and doctor see the same environment).
LAUNCH_ENV = (
    "NCCL_P2P_DISABLE",
    "NCCL_P2P_LEVEL",
    "NCCL_IB_DISABLE",
    "NCCL_SHM_DISABLE",
    "NCCL_SOCKET_IFNAME",
    "GLOO_SOCKET_IFNAME",
    "USE_LIBUV",
    "OMP_NUM_THREADS",  # compute threads a process starts (planning/threads.py: one set wins)
)
RESOLVE_TIMEOUT_S = 2.0


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


def probe_load(facts: Facts) -> dict[str, Any]:
    """The 1-minute load average where the OS keeps one (not Windows): how busy the CPU is."""
    if not hasattr(os, "getloadavg"):
        return {}
    return {"load_average": round(os.getloadavg()[0], 2)}


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


def probe_env(facts: Facts) -> dict[str, Any]:
    return {
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "launch_env": {k: os.environ[k] for k in LAUNCH_ENV if k in os.environ},
    }


def probe_shm(facts: Facts) -> dict[str, Any]:
    if facts.os_kind not in ("linux", "wsl2") or not os.path.isdir("/dev/shm"):
        return {}
    st = os.statvfs("/dev/shm")
    return {"shm_mib": st.f_blocks * st.f_frsize // 2**20}


def probe_packages(facts: Facts) -> dict[str, Any]:
    """Installed versions from package metadata: nothing is imported."""
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        versions[name] = None
        for dist in DISTRIBUTIONS.get(name, (name,)):
            try:
                versions[name] = importlib.metadata.version(dist)
                break
            except importlib.metadata.PackageNotFoundError:
                continue
    return {"packages": versions}


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


def probe_bitsandbytes(facts: Facts) -> dict[str, Any]:
    """The native backends the installed bitsandbytes ships (its library files' names), found
    without importing it (seconds: it imports torch and loads a library); None when it is not
    installed."""
    spec = importlib.util.find_spec(BITSANDBYTES)  # a top-level package: located, not run
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    if not folders:
        return {"bitsandbytes_backends": None}
    names = [entry.name for folder in folders if os.path.isdir(folder) for entry in os.scandir(folder)]
    return {"bitsandbytes_backends": library_backends(names)}
