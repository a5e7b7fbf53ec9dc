"""Test-only: make this interpreter's torch behave like a Windows wheel built without libuv.

Put this folder on PYTHONPATH and every TCPStore that asks for libuv (the C++ default, so every
call that does not pass ``use_libuv=False``) fails with the message Windows users see
(pytorch#139990, #148283); ``use_libuv=False`` works. torchrun's static and c10d rendezvous stores
(torch 2.13) pass no ``use_libuv``, so under this file they fail exactly as on Windows, while
``init_process_group`` with ``USE_LIBUV=0`` (torch/distributed/rendezvous.py) still works.
"""

import importlib
import os

if os.environ.get("XTRAIN_TEST_NO_LIBUV") == "1":
    import torch.distributed as dist

    _Real = dist.TCPStore
    MESSAGE = (
        "use_libuv was requested but PyTorch was built without libuv support, "
        "run with USE_LIBUV=0 to disable it."
    )

    class NoLibuvTCPStore(_Real):
        def __init__(self, *args, use_libuv=True, **kwargs):
            if use_libuv:
                raise RuntimeError(MESSAGE)
            super().__init__(*args, use_libuv=False, **kwargs)

    # Every module that bound the name at import time gets the stand-in.
    for name in (
        "torch.distributed",
        "torch.distributed.distributed_c10d",
        "torch.distributed.rendezvous",
        "torch.distributed.elastic.rendezvous.static_tcp_rendezvous",
        "torch.distributed.elastic.rendezvous.c10d_rendezvous_backend",
    ):
        module = importlib.import_module(name)
        if getattr(module, "TCPStore", None) is _Real:
            module.TCPStore = NoLibuvTCPStore
