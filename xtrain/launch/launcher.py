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

torch and accelerate are imported inside the functions: ``xtrain.cli`` stays light.
"""

from __future__ import annotations

import contextlib
import os
import runpy
import signal
import socket
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from xtrain.errors import XtrainError
from xtrain.launch import lifetime, stops
from xtrain.launch.env import visible_entries
from xtrain.launch.rendezvous import RENDEZVOUS_ENV, file_url, loopback_agent_store, loopback_transport_env
from xtrain.planning.plan import Plan

PLAN_ENV = "XTRAIN_PLAN"


class WorkerFailed(XtrainError):
    """A worker process failed. ``rank`` is its global rank, ``exit_code`` what it exited with,
    ``details`` the worker's traceback when one came back (the one-line message keeps only its
    last line)."""

    def __init__(self, rank: int | None, exit_code: int, message: str, details: str = "") -> None:
        super().__init__(message, None, exit_code=exit_code if exit_code > 0 else 1)
        self.rank = rank
        self.worker_exit_code = exit_code
        self.details = details
        self.outcome: dict[str, Any] | None = None  # rank 0's report (xtrain.launch.stops), when made


class WorkerStopped(WorkerFailed):
    """The launcher got SIGINT/SIGTERM and passed it on: the workers stopped (and saved, when
    the loop was running). ``outcome`` is rank 0's own report when it made one (it then printed
    its one line already); ``at_once``: a second Ctrl+C killed them without saving."""

    def __init__(self, signum: int, at_once: bool = False, outcome: dict[str, Any] | None = None) -> None:
        code = stops.exit_code(signum)
        super().__init__(None, code, f"stopped on {stops.signal_name(signum)}")
        self.exit_code = code
        self.signum = signum
        self.at_once = at_once
        self.outcome = outcome


# -- small pieces ---------------------------------------------------------------------------
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


def _visible_devices(gpu_ids: list[int]) -> str:
    """CUDA_VISIBLE_DEVICES for the plan's GPU ids, mapped through the current one."""
    current = os.environ.get("CUDA_VISIBLE_DEVICES")
    mapped = visible_entries(gpu_ids, current)
    if mapped is None:
        raise XtrainError(
            f"GPU ids {gpu_ids} do not fit CUDA_VISIBLE_DEVICES={current!r}",
            "run `xtrain doctor` again in this shell and pick ids from its GPU list",
        )
    return mapped


def plan_env(plan: Plan) -> dict[str, str]:
    """The environment every worker needs, whichever launcher starts it.

    CUDA_VISIBLE_DEVICES is set whenever the plan names GPUs, so worker ``LOCAL_RANK`` i uses
    ``cuda:i`` and sees only the planned cards (also for a ``--gpus 1,3`` selection)."""
    env = {k: str(v) for k, v in plan.env.items()}
    if plan.device == "cuda" and plan.gpu_ids:
        env["CUDA_VISIBLE_DEVICES"] = _visible_devices(plan.gpu_ids)
    env[PLAN_ENV] = plan.to_json()
    return env


@contextlib.contextmanager
def patched_environ(values: dict[str, str]) -> Iterator[None]:
    """Set environment variables for the duration of a block, then restore them exactly."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, old in saved.items():
            if old is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = old


def _pick_port(plan: Plan, port: int | None) -> int:
    """An explicit port wins. On one machine a busy planned port is replaced by a free one
    (as accelerate does); several machines must agree on the port, so it is kept as is."""
    if port is not None:
        return port
    if plan.num_machines > 1 or port_is_free(plan.main_port):
        return plan.main_port
    return free_port()


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""


# -- spawn (torch.multiprocessing) ----------------------------------------------------------------
def _spawn_entry(local_rank: int, fn: Callable[..., Any], args: tuple, env: dict[str, str]) -> None:
    """First code in each spawned child: rank variables, then the user's function.

    torch.multiprocessing passes the local index first; ``env`` carries the shared variables
    (they are also in the child's inherited environment; setting them again here makes the child
    independent of how it was started)."""
    os.environ.update(env)
    node_rank = int(env["XTRAIN_NODE_RANK"])
    nprocs = int(env["LOCAL_WORLD_SIZE"])
    os.environ["LOCAL_RANK"] = str(local_rank)
    os.environ["RANK"] = str(node_rank * nprocs + local_rank)
    lifetime.watch_parent()  # a killed launcher takes this worker with it
    fn(*args)


def spawn(
    fn: Callable[..., Any],
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
        "MASTER_PORT": str(_pick_port(plan, port)),
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(n),
        "XTRAIN_NODE_RANK": str(plan.machine_rank),
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
            folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="xtrain-rdzv-"))
            env = {**env, **loopback_transport_env(), RENDEZVOUS_ENV: file_url(folder)}
        # Also in the parent's environment while the children start, so they have it from their
        # first line (CUDA_VISIBLE_DEVICES must be there before CUDA initialises).
        stack.enter_context(patched_environ(env))
        stack.enter_context(_quiet_launcher_logs("torch.multiprocessing"))
        signals = stack.enter_context(stops.LauncherSignals(forward))
        try:
            mp.start_processes(_spawn_entry, args=(fn, args, env), nprocs=n, join=True, start_method="spawn")
        except stops.StopAtOnce:
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
            rank, 1, f"worker rank {rank} failed: {_last_line(e.msg) or 'an exception'}", e.msg
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


# -- accelerate launch ------------------------------------------------------------------------------
def accelerate_args(
    module_or_script: str,
    argv: Sequence[str],
    plan: Plan,
    *,
    module: bool = True,
    config_file: str | None = None,
    extra: Sequence[str] = (),
    port: int | None = None,
    nprocs: int | None = None,
) -> list[str]:
    """The `accelerate launch` arguments for the plan (also what `--dry-run` would show)."""
    n = plan.num_processes if nprocs is None else nprocs
    args: list[str] = []
    if config_file:
        args += ["--config_file", str(config_file)]
    if n * plan.num_machines > 1 and plan.launcher != "spawn":
        # also on CPU: the worker passes cpu=True (see the module docstring). One process gets
        # accelerate's simple launcher (a plain child process), as `accelerate launch` does.
        # A spawn plan (Windows) gets the simple launcher too: torchrun's stores need libuv,
        # and xtrain.run starts the workers itself (xtrain.run.accelerate_single_launch).
        args.append("--multi_gpu")
    args += [
        "--num_processes",
        str(n * plan.num_machines),  # accelerate counts processes over all machines
        "--num_machines",
        str(plan.num_machines),
        "--machine_rank",
        str(plan.machine_rank),
        "--main_process_ip",
        plan.main_address,
        "--main_process_port",
        str(_pick_port(plan, port)),
        "--mixed_precision",
        plan.mixed_precision,
        "--dynamo_backend",
        "no",
        # the plan already names GPUs through CUDA_VISIBLE_DEVICES; "all" keeps a default
        # config's gpu_ids from overriding that
        "--gpu_ids",
        "all",
    ]
    args += list(extra)
    if module:
        args.append("-m")
    args.append(module_or_script)
    return args + list(argv)


def _accelerate_launch(
    argv_tail: list[str],
    plan: Plan,
    module: bool = True,
    config_file: str | None = None,
    extra: Sequence[str] = (),
    port: int | None = None,
    nprocs: int | None = None,
) -> None:
    """accelerate_launch that raises ``WorkerFailed`` instead of returning a code."""
    from accelerate.commands.launch import launch_command, launch_command_parser
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    if not argv_tail:
        raise XtrainError("nothing to launch", "name a module or script")
    target, rest = argv_tail[0], argv_tail[1:]
    parser = launch_command_parser()
    args = parser.parse_args(
        accelerate_args(
            target, rest, plan, module=module, config_file=config_file, extra=extra, port=port, nprocs=nprocs
        )
    )
    from torch.distributed.elastic.multiprocessing.api import SignalException

    local = plan.num_machines == 1
    env = {**plan_env(plan), **(loopback_transport_env() if local else {}), **lifetime.child_env()}
    agent_store = loopback_agent_store() if local else contextlib.nullcontext()
    lifetime.kill_children_on_exit()

    def before_agent(signum: int) -> None:  # a stop before torchrun's agent took the signals over
        raise stops.StopRequested(signum)

    import torch.distributed.run  # noqa: F401  (its loggers exist before they are quieted)

    quiet = _quiet_launcher_logs("torch.distributed.elastic")
    with patched_environ(env), agent_store, quiet, stops.LauncherSignals(before_agent):
        try:
            launch_command(args)
        except stops.StopRequested as e:
            raise WorkerStopped(e.signum) from None
        except SignalException as e:
            # torchrun's agent passed the signal on and waited for the workers; workers still
            # alive mean a second signal cut that wait short: end them now
            at_once = lifetime.kill_process_tree() > 0
            raise WorkerStopped(int(e.sigval), at_once=at_once) from None
        except ChildFailedError as e:
            rank, failure = e.get_first_failure()
            code = failure.exitcode if failure.exitcode is not None else 1
            detail = failure.message if isinstance(failure.message, str) else ""
            how = f"exit code {code}" if code >= 0 else f"signal {-code}"
            if "error_file" in detail or "To enable traceback" in detail:
                detail = ""  # torchelastic's hint about @record, not the worker's error
            msg = f"worker rank {rank} failed ({how})" + (f": {_last_line(detail)}" if detail else "")
            raise WorkerFailed(rank, code if code > 0 else 1, msg, detail) from None
        except subprocess.CalledProcessError as e:  # accelerate's simple launcher (one process)
            raise WorkerFailed(0, e.returncode, f"worker failed (exit code {e.returncode})") from None
        except SystemExit as e:  # the simple launcher under --quiet exits instead
            if e.code not in (None, 0):
                code = e.code if isinstance(e.code, int) else 1
                raise WorkerFailed(0, code, f"worker failed (exit code {code})") from None
        except (ValueError, ConnectionError) as e:  # accelerate's own argument/port checks
            raise XtrainError(
                f"accelerate launch refused: {e}", "check the plan with `xtrain doctor`"
            ) from None


@contextlib.contextmanager
def _quiet_launcher_logs(prefix: str) -> Iterator[None]:
    """torchrun's agent and torch.multiprocessing log every worker exit and signal ("Sending
    process ... closing signal", "failed (exitcode: 2)") after the worker's own one-line error;
    xtrain reports failures itself, so those records are dropped while they run here."""
    import logging

    names = [n for n in logging.Logger.manager.loggerDict if n.startswith(prefix)]
    loggers = [logging.getLogger(n) for n in names]
    saved = [lg.disabled for lg in loggers]
    for lg in loggers:
        lg.disabled = True
    try:
        yield
    finally:
        for lg, was in zip(loggers, saved, strict=True):
            lg.disabled = was


def accelerate_launch(
    argv_tail: list[str],
    plan: Plan,
    module: bool = True,
    config_file: str | None = None,
    extra: Sequence[str] = (),
    port: int | None = None,
    nprocs: int | None = None,
) -> int:
    """``accelerate launch --multi_gpu ... [-m] MODULE ARGS`` in this process; returns the exit
    code (0, or the first failed worker's code). The worker's own traceback has already gone
    to stderr; the failure's one-line summary goes to the ``xtrain.launch.launcher`` logger."""
    try:
        _accelerate_launch(argv_tail, plan, module, config_file, extra, port, nprocs)
    except WorkerFailed as e:
        import logging

        logging.getLogger("xtrain.launch.launcher").error(e.one_line())
        return e.exit_code
    return 0


# -- one entry for everything ------------------------------------------------------------------
def launch(
    module: str,
    argv: Sequence[str],
    plan: Plan,
    *,
    port: int | None = None,
    config_file: str | None = None,
) -> None:
    """Run ``python -m module *argv`` on every process the plan asks for, with the plan's
    environment, through the plan's launcher. Raises ``WorkerFailed`` when a worker fails.

    A single process (world size 1) runs as one child ``python -m module`` with the plan's
    environment: a fresh interpreter gets CUDA_VISIBLE_DEVICES and the plan variables before
    torch initialises (this process may already have initialised CUDA while probing), and it is
    the same entry as the multi-process paths. No launcher, no rendezvous, nothing to hang on.
    """
    argv = list(argv)
    with (
        tempfile.TemporaryDirectory(prefix="xtrain-report-") as report,
        patched_environ({stops.REPORT_ENV: report}),
    ):
        try:
            _launch(module, argv, plan, port, config_file)
        except WorkerFailed as e:
            e.outcome = stops.read_outcome(report)  # rank 0's one line, when it said it already
            raise


def _launch(module: str, argv: list[str], plan: Plan, port: int | None, config_file: str | None) -> None:
    if plan.world_size == 1:
        _one_process(module, argv, plan)
    elif plan.launcher == "spawn":
        spawn(run_module, (module, argv), plan, port=port)
    else:
        _accelerate_launch([module, *argv], plan, module=True, config_file=config_file, port=port)


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
        with stops.LauncherSignals(forward) as signals:
            code = proc.wait()
    except stops.StopAtOnce:
        raise WorkerStopped(signal.SIGINT, at_once=True) from None
    if signals.signum is not None and code != 0:
        raise WorkerStopped(signals.signum)
    if code != 0:
        raise WorkerFailed(0, code, f"{module} failed (exit code {code})")
