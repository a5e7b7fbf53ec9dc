"""Checks: pure functions from machine facts and the plan to findings with exact fixes.

Each ``check_x(facts, plan)`` returns zero or more ``Finding``s (a stable code, a severity,
one sentence, the fix in the user's shell); ``CHECKS`` is the order doctor shows them in. The
facts behind each check are in ``../shared/FIELD_NOTES.md`` and explained for users in
docs/findings.md.

- ``gpu.py``: torch, the NVIDIA driver, the GPUs (visible, matched).
- ``comms.py``: the backend (NCCL, gloo; Windows builds without gloo's transport), libuv, NCCL's
  P2P and shared memory.
- ``network.py``: the hostname and the rendezvous port.
- ``environment.py``: packages, accelerate's config file, probes that failed.
- ``quantization.py``: bitsandbytes (model.quantization, 8-bit optimizers): missing, too old, a
  build without this torch's native library.
- ``precision.py``: the plan's precision against the weights' dtype (fp16 over bf16 weights).
- ``cpu.py``: a CPU plan on a CPU other work keeps busy (the compute threads: planning/threads.py).
- ``fixes.py``: the fix lines several of them share (torch wheel, pip, driver update).
"""

from __future__ import annotations

from collections.abc import Callable

from xtrain.machine.facts import Facts
from xtrain.planning.checks.comms import check_backend, check_libuv, check_p2p, check_shm, check_windows_gloo
from xtrain.planning.checks.cpu import check_cpu_busy
from xtrain.planning.checks.environment import check_accelerate_config, check_packages, check_probe_errors
from xtrain.planning.checks.gpu import (
    check_driver,
    check_mismatched_gpus,
    check_no_gpu,
    check_torch,
    check_visible_devices,
)
from xtrain.planning.checks.network import check_hostname, check_port
from xtrain.planning.checks.precision import check_precision_weights
from xtrain.planning.checks.quantization import check_bitsandbytes
from xtrain.planning.plan import Finding, Plan

Check = Callable[[Facts, Plan], list[Finding]]


CHECKS: tuple[Check, ...] = (
    check_torch,
    check_driver,
    check_no_gpu,
    check_backend,
    check_windows_gloo,
    check_libuv,
    check_p2p,
    check_shm,
    check_hostname,
    check_port,
    check_visible_devices,
    check_mismatched_gpus,
    check_cpu_busy,
    check_precision_weights,
    check_packages,
    check_bitsandbytes,
    check_accelerate_config,
    check_probe_errors,
)
