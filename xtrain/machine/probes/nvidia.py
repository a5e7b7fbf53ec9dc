"""Probes of the NVIDIA driver through nvidia-smi (found also where it is not on PATH: WSL2,
Windows), with the parsing kept in pure functions."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from typing import Any

from xtrain.machine.facts import Facts, is_rtx40

SMI_TIMEOUT_S = 5.0


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
    driver, driver_cuda = parse_smi_header(_run_smi(exe))
    found = _query_gpus(exe)
    return {
        "nvidia_smi": True,
        **found,
        "driver_version": driver or found["driver_version"],
        "driver_cuda": driver_cuda,
    }


def _run_smi(exe: str, *args: str) -> str:
    """nvidia-smi's output; a non-zero exit raises with its first line."""
    done = subprocess.run([exe, *args], capture_output=True, text=True, timeout=SMI_TIMEOUT_S, check=False)
    if done.returncode != 0:
        out = (done.stdout + done.stderr).strip().splitlines()
        raise RuntimeError(f"nvidia-smi exited {done.returncode}: {out[0] if out else ''}".strip())
    return done.stdout


def _query_gpus(exe: str) -> dict[str, Any]:
    """The driver version and the GPUs nvidia-smi lists (one query)."""
    rows = parse_smi_query(
        _run_smi(exe, "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader,nounits")
    )
    return {
        "driver_version": next((r[2] for r in rows if r[2]), None),
        "smi_gpu_count": len(rows),
        "smi_gpu_names": [r[0] for r in rows],
    }


def needs_driver_version(facts: Facts) -> bool:
    """The plan reads the driver version only for 2+ RTX 40 cards (rules._p2p_missing)."""
    return len(facts.gpus) >= 2 and any(is_rtx40(g) for g in facts.gpus)


def probe_driver_for_plan(facts: Facts) -> dict[str, Any]:
    """Quick mode: the driver version by one nvidia-smi query, only where the plan needs it."""
    if not needs_driver_version(facts):
        return {}
    exe = find_nvidia_smi()
    if exe is None:
        return {}
    return _query_gpus(exe)
