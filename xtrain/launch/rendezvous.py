"""Single-machine rendezvous that opens no public socket.

A TCPStore server listens on every interface whatever host it is given (FIELD_NOTES, checked
with ``ss -ltnp`` on torch 2.13), so a rendezvous on "127.0.0.1:PORT" is still reachable from the
network. For one machine xtrain uses instead:

- the spawn launcher: a ``FileStore`` in a private temporary folder (``init_method="file://..."``,
  works on Windows too): no socket at all. The launcher puts its URL in ``XTRAIN_RENDEZVOUS``;
  the workers join it (``xtrain.runtime.process_group.init_worker_group``) before accelerate would
  create a process group.
- accelerate launch (torchrun in this process): torchrun's agent creates the TCPStore server. It
  is handed a socket already bound to 127.0.0.1 (``master_listen_fd``), so it listens on loopback
  only (``loopback_agent_store``). The workers are clients of that store.
- gloo's and NCCL's own transports bind to the interface ``GLOO_SOCKET_IFNAME`` /
  ``NCCL_SOCKET_IFNAME`` name (else the address the hostname resolves to): the loopback
  interface for one machine, unless the user set them
  (``xtrain.runtime.process_group.loopback_transport_env``).

Several machines keep the main address (they must reach it). torch is imported inside the
functions.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xtrain.planning.plan import Plan

if TYPE_CHECKING:
    from torch.distributed import TCPStore

LOOPBACK = "127.0.0.1"


def file_url(folder: str | Path) -> str:
    """The ``init_method`` URL of a FileStore in ``folder`` (which must be new and private)."""
    return Path(folder, "rendezvous").resolve().as_uri()


def loopback_listener(port: int) -> int:
    """A listening TCP socket on 127.0.0.1:``port`` whose descriptor is handed over (the caller
    owns it: a TCPStore server takes it with ``master_listen_fd``)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        if os.name == "posix":  # reuse a port in TIME_WAIT, as TCPStore itself does
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((LOOPBACK, port))
        s.listen(128)
    except OSError:
        s.close()
        raise
    return s.detach()


@contextlib.contextmanager
def loopback_agent_store() -> Iterator[None]:
    """While torchrun's agent runs in this process, its static rendezvous store (the TCPStore
    server of a single-machine accelerate launch) listens on 127.0.0.1 only."""
    from torch.distributed.elastic.rendezvous import static_tcp_rendezvous as static

    original = static.TCPStore

    def store(
        host: str, port: int, world_size: int | None = None, is_master: bool = False, *args: Any, **kw: Any
    ) -> TCPStore:
        if is_master and host in (LOOPBACK, "localhost") and "master_listen_fd" not in kw:
            kw["master_listen_fd"] = loopback_listener(int(port))
        return original(host, port, world_size, is_master, *args, **kw)

    static.TCPStore = store  # type: ignore[assignment]
    try:
        yield
    finally:
        static.TCPStore = original  # type: ignore[assignment]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def pick_port(plan: Plan, port: int | None) -> int:
    """An explicit port wins. On one machine a busy planned port is replaced by a free one
    (as accelerate does); several machines must agree on the port, so it is kept as is."""
    if port is not None:
        return port
    if plan.num_machines > 1 or port_is_free(plan.main_port):
        return plan.main_port
    return free_port()
