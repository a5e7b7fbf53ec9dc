"""The ``spawn`` launcher: ``torch.multiprocessing.start_processes(start_method="spawn")`` with a
FileStore rendezvous in a private folder (``rendezvous.py``): no torchrun, no TCPStore, the
Windows path, used on every OS."""

from __future__ import annotations

import contextlib
import os
import runpy
import signal
import sys
import warnings
from collections.abc import Callable, Sequence

from xtrain import atomic
from xtrain.errors import XtrainError
from xtrain.launch.env import patched_environ, plan_env
from xtrain.launch.rendezvous import file_url, pick_port
from xtrain.launch.worker_errors import WorkerFailed, WorkerStopped, last_line, quiet_launcher_logs
from xtrain.planning.plan import Plan
from xtrain.runtime import lifetime
from xtrain.runtime.process_group import RENDEZVOUS_ENV, loopback_transport_env
from xtrain.runtime.signals import LauncherSignals, StopAtOnce


def _spawn_entry(
    local_rank: int, fn: Callable[..., object], args: tuple, env: dict[str, str], first_rank: int
) -> None:
    """First code in each spawned child: rank variables, then the user's function.

    torch.multiprocessing passes the local index first; ``env`` carries the shared variables
    (they are also in the child's inherited environment; setting them again here makes the child
    independent of how it was started); ``first_rank``: this machine's first rank."""
    os.environ.update(env)
    os.environ["LOCAL_RANK"] = str(local_rank)
    os.environ["RANK"] = str(first_rank + local_rank)
    lifetime.watch_parent()  # a killed launcher takes this worker with it
    fn(*args)


def spawn(
    fn: Callable[..., object],
    args: tuple = (),
    plan: Plan | None = None,
    nprocs: int | None = None,
    port: int | None = None,
) -> None:
    """Run ``fn(*args)`` in ``nprocs`` spawned processes (default: the plan's processes on this
    machine). ``fn`` must be a top-level importable function: spawn pickles it by name.

    Raises ``WorkerFailed`` naming the first rank that failed; torch.multiprocessing then stops
    the other ranks (SIGTERM, SIGKILL after 30 s), so a crash never leaves the caller hanging.
    SIGINT/SIGTERM to this process is passed on as SIGTERM (the ranks stop at the next step and
    save) and ends as ``WorkerStopped``; a second Ctrl+C kills them at once."""
    import torch.multiprocessing as mp

    if plan is None:
        raise XtrainError("spawn needs a plan", "pass the plan from xtrain.planning.rules.make_plan")
    n = plan.num_processes if nprocs is None else nprocs
    if n < 1:
        raise XtrainError(f"cannot start {n} processes", "use 1 or more")
    world_size = n * plan.num_machines
    env = {
        **plan_env(plan),
        "MASTER_ADDR": plan.main_address,
        "MASTER_PORT": str(pick_port(plan, port)),
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(n),
        **lifetime.child_env(),
    }
    lifetime.kill_children_on_exit()  # Windows: a job object ends the workers with this process

    def forward(signum: int) -> None:
        # Ctrl+C in a terminal reaches the whole group; a signal sent to this process alone is
        # passed on as SIGTERM (the same stop in the workers, not a second Ctrl+C there).
        import multiprocessing

        for child in multiprocessing.active_children():
            if child.pid and os.name == "posix":
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child.pid, signal.SIGTERM)
            elif child.pid:
                child.terminate()

    with contextlib.ExitStack() as stack:
        if plan.num_machines == 1:  # a FileStore in a private folder: no socket (xtrain.launch.rendezvous)
            folder = stack.enter_context(atomic.temporary_folder("xtrain-rdzv-"))
            env = {**env, **loopback_transport_env(), RENDEZVOUS_ENV: file_url(folder)}
        # Also in the parent's environment while the children start, so they have it from their
        # first line (CUDA_VISIBLE_DEVICES must be there before CUDA initialises).
        stack.enter_context(patched_environ(env))
        stack.enter_context(quiet_launcher_logs("torch.multiprocessing"))
        signals = stack.enter_context(LauncherSignals(forward))
        try:
            first_rank = plan.machine_rank * n
            mp.start_processes(
                _spawn_entry, args=(fn, args, env, first_rank), nprocs=n, join=True, start_method="spawn"
            )
        except StopAtOnce:
            raise WorkerStopped(signal.SIGINT, at_once=True) from None
        except (mp.ProcessRaisedException, mp.ProcessExitedException) as e:
            if signals.signum is not None:
                raise WorkerStopped(signals.signum) from None
            _spawn_failure(e, plan, n)


def _spawn_failure(e: Exception, plan: Plan, n: int) -> None:
    import torch.multiprocessing as mp

    if isinstance(e, mp.ProcessRaisedException):
        rank = plan.machine_rank * n + e.error_index
        raise WorkerFailed(
            rank, 1, f"worker rank {rank} failed: {last_line(e.msg) or 'an exception'}", e.msg
        ) from None
    if isinstance(e, mp.ProcessExitedException):
        rank = plan.machine_rank * n + e.error_index
        how = f"signal {e.signal_name}" if e.signal_name else f"exit code {e.exit_code}"
        raise WorkerFailed(
            rank, e.exit_code if e.exit_code > 0 else 1, f"worker rank {rank} died ({how})"
        ) from None
    raise e


def run_module(module: str, argv: Sequence[str]) -> None:
    """Run ``module`` as ``python -m module *argv`` would, in this process (the spawn worker of
    a module target). ``sys.exit(0)`` in the module counts as success."""
    sys.argv = [module, *argv]
    try:
        with warnings.catch_warnings():
            # the module may already be imported (the spawned child re-imports the parent's
            # main module); runpy still runs a fresh copy as __main__, which is what we want
            warnings.filterwarnings("ignore", message=".*found in sys.modules.*", category=RuntimeWarning)
            runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        if e.code not in (None, 0):
            raise
