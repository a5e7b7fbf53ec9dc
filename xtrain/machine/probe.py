"""Collect ``Facts`` from the real machine.

Each fact comes from one small probe function ``probe_x(facts) -> dict of field updates``.
``collect`` runs them in order and records any exception in ``facts.probe_errors[name]``
instead of raising: a broken driver, a missing nvidia-smi or a torch that fails to import is
something to report, not a crash. Later probes read what earlier ones found (the GPU probe
needs torch, the P2P probe needs the GPUs).

``collect`` is called in one place, ``xtrain.planning.resolve``, when a command or a worker has
no saved snapshot and no plan sent to it (doctor and quickstart probe in full).
``collect(quick=True)`` is what `xtrain train` and the training workers plan from. It skips what
is slow and does not change the plan (hostname resolution, the port check, the TCPStore test,
accelerate's own config loader) but collects every fact the plan reads the same way doctor does:
the P2P matrix (a few CUDA calls, only with 2+ GPUs), the driver version (one nvidia-smi call,
only where it changes the plan: 2+ RTX 40 cards, whose P2P report is trusted only from driver
550.40.07 on) and the launch variables already set (NCCL_P2P_DISABLE, ...). It costs little
beyond ``import torch``.

The probes live in ``xtrain/machine/probes/``, one module a source; their parsing is kept in
pure functions (``classify_os``, ``parse_smi_header``, ``parse_smi_query``,
``accelerate_config_path``) so it is tested without the hardware. This module is the collection:
which probes run in each mode, in what order.
"""

from __future__ import annotations

from xtrain.machine.facts import DEFAULT_PORT, Facts
from xtrain.machine.probes import Probe, why
from xtrain.machine.probes.accelerate_config import probe_accelerate_config, probe_accelerate_loads
from xtrain.machine.probes.nvidia import probe_driver_for_plan, probe_nvidia_smi, probe_nvidia_smi_present
from xtrain.machine.probes.system import (
    probe_bitsandbytes,
    probe_env,
    probe_hostname,
    probe_hostname_resolves,
    probe_load,
    probe_memory,
    probe_packages,
    probe_platform,
    probe_port,
    probe_shm,
)
from xtrain.machine.probes.torch_stack import (
    probe_backends,
    probe_gpus,
    probe_libuv,
    probe_p2p,
    probe_torch,
    probe_torchrun_libuv,
)

QUICK_PROBES: tuple[tuple[str, Probe], ...] = (
    ("platform", probe_platform),
    ("load", probe_load),
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
    ("bitsandbytes", probe_bitsandbytes),
    ("accelerate_config", probe_accelerate_config),
)
FULL_PROBES: tuple[tuple[str, Probe], ...] = (
    ("platform", probe_platform),
    ("load", probe_load),
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
    ("bitsandbytes", probe_bitsandbytes),
    ("accelerate_config", probe_accelerate_config),
    ("accelerate_loads", probe_accelerate_loads),
    ("port", probe_port),
)


def run_probe(facts: Facts, name: str, probe: Probe) -> None:
    """Apply one probe's findings to ``facts``; a failure becomes ``probe_errors[name]``."""
    try:
        updates = probe(facts)
    except Exception as e:
        facts.probe_errors[name] = why(e)
        return
    for key, value in updates.items():
        setattr(facts, key, value)


def collect(quick: bool = False, port: int = DEFAULT_PORT) -> Facts:
    """Snapshot this machine. Never raises for what the machine lacks; see ``probe_errors``."""
    facts = Facts(port=port)
    for name, probe in QUICK_PROBES if quick else FULL_PROBES:
        run_probe(facts, name, probe)
    return facts
