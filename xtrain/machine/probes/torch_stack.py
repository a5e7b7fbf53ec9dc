"""Probes of torch: its build, its distributed backends, the GPUs and P2P it sees, libuv for its
TCPStore, torchrun's stores."""

from __future__ import annotations

import importlib
from typing import Any

from xtrain.machine.facts import GPU, Facts
from xtrain.machine.probes import loaded_torch, why

STORE_TIMEOUT_S = 2.0
TORCHRUN_STORES = (
    "torch.distributed.elastic.rendezvous.static_tcp_rendezvous",
    "torch.distributed.elastic.rendezvous.c10d_rendezvous_backend",
)


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
    torch = loaded_torch()
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
    torch = loaded_torch()
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
    torch = loaded_torch()
    n = len(facts.gpus)
    if torch is None or n < 2:
        return {}
    return {
        "p2p": [[i == j or bool(torch.cuda.can_device_access_peer(i, j)) for j in range(n)] for i in range(n)]
    }


def probe_torchrun_libuv(facts: Facts) -> dict[str, Any]:
    """Do torchrun's rendezvous stores (accelerate's ``rdzv_backend: static`` and ``c10d``) pass
    ``use_libuv`` to their TCPStore? In torch 2.13 they do not, so the C++ default (libuv) applies
    whatever USE_LIBUV says, and a Windows wheel (no libuv) cannot start torchrun (pytorch#148283;
    fixes #175316 closed, #196855 open). A torch whose store code names ``use_libuv`` has the fix."""
    if loaded_torch() is None:
        return {}
    import importlib
    import inspect

    for name in TORCHRUN_STORES:
        if "use_libuv" not in inspect.getsource(importlib.import_module(name)):
            return {"torchrun_honours_use_libuv": False}
    return {"torchrun_honours_use_libuv": True}


def probe_libuv(facts: Facts) -> dict[str, Any]:
    """Can a TCPStore with libuv start? Windows wheels lack libuv (pytorch#139990, #148283)."""
    torch = loaded_torch()
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
        return {"libuv_ok": False, "libuv_error": why(e)}
    ok = bool(getattr(store, "libuvBackend", True))
    del store
    return {"libuv_ok": ok}
