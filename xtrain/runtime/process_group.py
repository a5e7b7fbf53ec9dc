"""Joining the process group from inside a worker: the launcher's FileStore rendezvous and the
loopback transports of a one-machine run.

xtrain's spawn launcher (``xtrain.launch.spawn``) puts the URL of a FileStore in a private folder
in ``XTRAIN_RENDEZVOUS`` (no socket at all; ``xtrain.launch.rendezvous`` has the launcher side);
``init_worker_group`` joins it before accelerate would create a process group. gloo's and NCCL's
own transports bind to the interface ``GLOO_SOCKET_IFNAME`` / ``NCCL_SOCKET_IFNAME`` name (else
the address the hostname resolves to): the loopback interface for one machine, unless the user
set them (``loopback_transport_env``). torch is imported inside the functions.
"""

from __future__ import annotations

import os
import socket
import sys
from datetime import timedelta

from xtrain.planning.context import RENDEZVOUS_ENV


def loopback_interface() -> str | None:
    """The loopback interface's name as gloo/NCCL want it (Linux "lo", macOS "lo0"); None where
    xtrain cannot name it (Windows: gloo's default device follows the hostname there)."""
    if sys.platform == "win32":
        return None
    try:
        names = {name for _, name in socket.if_nameindex()}
    except OSError:
        return None
    for name in ("lo", "lo0"):
        if name in names:
            return name
    return None


def loopback_transport_env(environ: dict[str, str] | os._Environ[str] | None = None) -> dict[str, str]:
    """GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME for a one-machine run, except where the user set
    them already (a value set by the user always wins)."""
    env = os.environ if environ is None else environ
    name = loopback_interface()
    if name is None:
        return {}
    return {k: name for k in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME") if not env.get(k)}


def init_worker_group(backend: str | None, rank: int, world_size: int, timeout_s: float) -> bool:
    """Join the launcher's FileStore rendezvous when it sent one (``XTRAIN_RENDEZVOUS``); returns
    whether a process group was created here. accelerate then finds the group and keeps it.

    Also pins gloo/NCCL to the loopback interface for the one-machine run."""
    url = os.environ.get(RENDEZVOUS_ENV)
    if not url or world_size < 2 or not backend:
        return False
    import torch.distributed as dist

    if dist.is_initialized():
        return False
    os.environ.update(loopback_transport_env())
    dist.init_process_group(
        backend=backend,
        init_method=url,
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout_s),
    )
    return True
