"""Starting worker processes: the one launch path for `doctor --smoke`, `xtrain train` and
`python -m xtrain.run --processes N`.

Two launchers, chosen by the plan (``Plan.launcher``, decided in ``xtrain.planning.rules``):

- ``spawn``: ``torch.multiprocessing.start_processes(start_method="spawn")`` with a FileStore
  rendezvous in a private temporary folder on one machine (``xtrain.launch.rendezvous``: no socket;
  MASTER_ADDR/PORT stay set for code that uses env://). No torchrun, so no TCPStore that
  insists on libuv: the Windows path (FIELD_NOTES: torchrun's stores fail there). Spawn is
  used on every OS so that the code CI runs on Linux is the code Windows runs.
- ``accelerate``: accelerate's own launcher (``launch_command``), called in-process with args
  built by its own parser, i.e. exactly ``accelerate launch --multi_gpu ... -m MODULE``
  (torchrun underneath; on one machine its agent's TCPStore listens on 127.0.0.1 only).
  Always ``--multi_gpu`` for several processes, also on CPU: ``--cpu --num_processes 2``
  starts ONE process (FIELD_NOTES); the worker passes ``cpu=True`` itself.

Both give every worker the same environment, set before any process group exists:
MASTER_ADDR, MASTER_PORT, RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, the plan's variables
(USE_LIBUV, NCCL_*), CUDA_VISIBLE_DEVICES for a GPU selection, and ``XTRAIN_PLAN`` (the plan as
JSON, so workers do not probe the machine again). A failed worker becomes ``WorkerFailed``
(an ``XtrainError`` naming the rank); the other ranks are stopped, nothing hangs.

``spawn.py`` and ``accelerate_launcher.py`` hold the two launchers, ``worker_errors.py`` what comes
back from them, ``env.py`` the environment and ``rendezvous.py`` the port; this module chooses.
torch and accelerate are imported inside the functions: ``xtrain.cli`` stays light.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence

from xtrain import atomic
from xtrain.launch.accelerate_launcher import accelerate_launch_raising
from xtrain.launch.env import LAUNCH_KEYS, patched_environ, plan_env
from xtrain.launch.spawn import run_module, spawn
from xtrain.launch.worker_errors import WorkerFailed, WorkerStopped
from xtrain.planning.plan import Plan
from xtrain.runtime import lifetime, report
from xtrain.runtime.signals import LauncherSignals, StopAtOnce


def launch(
    module: str,
    argv: Sequence[str],
    plan: Plan,
    *,
    port: int | None = None,
    config_file: str | None = None,
    sharding: Sequence[str] = (),
) -> None:
    """Run ``python -m module *argv`` on every process the plan asks for, with the plan's
    environment, through the plan's launcher. Raises ``WorkerFailed`` when a worker fails.

    A single process (world size 1) runs in this process when nothing needs a fresh interpreter
    (``runs_here``): the module's ``main(argv)`` with the plan's environment, as ``python -m
    module`` would, without a second start of Python, torch and transformers (seconds). Else it
    runs as one child ``python -m module``: a fresh interpreter gets CUDA_VISIBLE_DEVICES before
    torch initialises (this process may already have initialised CUDA while probing). No
    launcher, no rendezvous, nothing to hang on.

    ``sharding`` (FSDP/DeepSpeed switches, ``launch.sharding``): always accelerate's launcher,
    also for one process: only it sets up the plugin's environment for the worker.
    """
    with _reports():
        _launch(module, list(argv), plan, port, config_file, tuple(sharding))


def spawn_module(module: str, argv: Sequence[str], plan: Plan) -> None:
    """``python -m module *argv`` on the plan's processes on this machine, started by the spawn
    launcher whatever the plan's (``python -m xtrain.run --processes N``): the same worker
    entry (``spawn.run_module``) and report channel as ``launch``'s spawn path."""
    with _reports():
        spawn(run_module, (module, list(argv)), plan)


@contextlib.contextmanager
def _reports() -> Iterator[None]:
    """The workers' report folder (``xtrain.runtime.report``) for the block; a ``WorkerFailed``
    leaving it carries what the ranks reported."""
    with (
        atomic.temporary_folder("xtrain-report-", atomic.REPORT_DIR) as folder,
        patched_environ({report.REPORT_ENV: folder}),
    ):
        try:
            yield
        except WorkerFailed as e:
            e.reports = report.read(folder)  # who said what already
            raise


def _launch(
    module: str,
    argv: list[str],
    plan: Plan,
    port: int | None,
    config_file: str | None,
    sharding: tuple[str, ...],
) -> None:
    if sharding:
        accelerate_launch_raising(
            [module, *argv], plan, module=True, config_file=config_file, port=port, sharding=sharding
        )
    elif runs_here(plan):
        _here(module, argv, plan)
    elif plan.world_size == 1:
        _one_process(module, argv, plan)
    elif plan.launcher == "spawn":
        spawn(run_module, (module, argv), plan, port=port)
    else:
        accelerate_launch_raising([module, *argv], plan, module=True, config_file=config_file, port=port)


def runs_here(plan: Plan) -> bool:
    """One process that needs no fresh interpreter: on the CPU or MPS, or on the first GPU this
    process sees (cuda:0 here is the card a child with the plan's CUDA_VISIBLE_DEVICES would
    get). Another GPU selection needs a child: CUDA may be initialised here already."""
    return plan.world_size == 1 and (plan.device != "cuda" or plan.gpu_ids in (None, [0]))


def _here(module: str, argv: list[str], plan: Plan) -> None:
    """``module.main(argv) -> exit code`` in this process with the plan's variables (minus
    CUDA_VISIBLE_DEVICES, see ``runs_here``). The module reports its own ending (one line,
    ``runtime.report.record``); a non-zero exit becomes ``WorkerFailed`` for ``launch`` to read it."""
    import importlib

    env = plan_env(plan)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    with patched_environ(env, also=LAUNCH_KEYS):  # accelerate's own writes undone too
        code = importlib.import_module(module).main(argv) or 0  # None: 0, as for sys.exit
    if code in (130, 143):  # stopped and said so: a further Ctrl+C during shutdown adds nothing
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    if code != 0:
        raise WorkerFailed(0, code, f"{module} failed (exit code {code})")


def _one_process(module: str, argv: list[str], plan: Plan) -> None:
    """``python -m module`` as a plain child that watches this process; a stop signal is passed
    on (SIGTERM) and waited for, a second Ctrl+C kills it."""
    lifetime.kill_children_on_exit()
    env = {**os.environ, **plan_env(plan), **lifetime.child_env()}
    proc = subprocess.Popen([sys.executable, "-m", module, *argv], env=env)

    def forward(signum: int) -> None:
        with contextlib.suppress(OSError):
            if os.name == "posix":
                os.kill(proc.pid, signal.SIGTERM)
            else:
                proc.terminate()  # Windows: Ctrl+C reaches the child through the console anyway

    try:
        with LauncherSignals(forward) as signals:
            code = proc.wait()
    except StopAtOnce:
        raise WorkerStopped(signal.SIGINT, at_once=True) from None
    if signals.signum is not None and code != 0:
        raise WorkerStopped(signals.signum)
    if code != 0:
        raise WorkerFailed(0, code, f"{module} failed (exit code {code})")
