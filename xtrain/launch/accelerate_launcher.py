"""The ``accelerate`` launcher: accelerate's own ``launch_command`` called in this process with
args built by its own parser (``accelerate_args``), i.e. exactly ``accelerate launch --multi_gpu
... -m MODULE`` (torchrun underneath; on one machine its agent's TCPStore listens on 127.0.0.1
only)."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Sequence
from typing import Any

from xtrain.errors import XtrainError
from xtrain.launch.env import patched_environ, plan_env
from xtrain.launch.rendezvous import loopback_agent_store, pick_port
from xtrain.launch.worker_errors import WorkerFailed, WorkerStopped, last_line, quiet_launcher_logs
from xtrain.planning.plan import Plan
from xtrain.runtime import lifetime
from xtrain.runtime.process_group import loopback_transport_env
from xtrain.runtime.signals import LauncherSignals, StopRequested


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
    sharding: Sequence[str] = (),
) -> list[str]:
    """The `accelerate launch` arguments for the plan (also what `--dry-run` would show).
    ``sharding``: ``--use_fsdp`` / ``--use_deepspeed`` and their settings (``launch.sharding``),
    in place of ``--multi_gpu`` (accelerate takes one of them), also for one process."""
    n = plan.num_processes if nprocs is None else nprocs
    args: list[str] = []
    if config_file:
        args += ["--config_file", str(config_file)]
    if sharding:
        args += list(sharding)
    elif n * plan.num_machines > 1 and plan.launcher != "spawn":
        # also on CPU: the worker passes cpu=True (see the module docstring). One process gets
        # accelerate's simple launcher (a plain child process), as `accelerate launch` does.
        # A spawn plan (Windows) gets the simple launcher too: torchrun's stores need libuv,
        # and xtrain.run starts the workers itself (LaunchContext.single_launch).
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
        str(pick_port(plan, port)),
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


def accelerate_launch_raising(argv_tail: list[str], plan: Plan, **options: Any) -> None:
    """accelerate_launch that raises ``WorkerFailed`` instead of returning a code. ``options``:
    the keyword arguments of ``accelerate_args`` (module, config_file, extra, port, nprocs,
    sharding)."""
    from accelerate.commands.launch import launch_command, launch_command_parser
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    if not argv_tail:
        raise XtrainError("nothing to launch", "name a module or script")
    target, rest = argv_tail[0], argv_tail[1:]
    parser = launch_command_parser()
    args = parser.parse_args(accelerate_args(target, rest, plan, **options))
    from torch.distributed.elastic.multiprocessing.api import SignalException

    local = plan.num_machines == 1
    env = {**plan_env(plan), **(loopback_transport_env() if local else {}), **lifetime.child_env()}
    agent_store = loopback_agent_store() if local else contextlib.nullcontext()
    lifetime.kill_children_on_exit()

    def before_agent(signum: int) -> None:  # a stop before torchrun's agent took the signals over
        raise StopRequested(signum)

    import torch.distributed.run  # noqa: F401  (its loggers exist before they are quieted)

    quiet = quiet_launcher_logs("torch.distributed.elastic")
    with patched_environ(env), agent_store, quiet, LauncherSignals(before_agent):
        try:
            launch_command(args)
        except StopRequested as e:
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
            msg = f"worker rank {rank} failed ({how})" + (f": {last_line(detail)}" if detail else "")
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


def accelerate_launch(argv_tail: list[str], plan: Plan, **options: Any) -> int:
    """``accelerate launch --multi_gpu ... [-m] MODULE ARGS`` in this process; returns the exit
    code (0, or the first failed worker's code). ``options``: those of ``accelerate_launch_raising``.
    The worker's own traceback has already gone to stderr; the failure's one-line summary goes
    to the ``xtrain.launch.launcher`` logger."""
    try:
        accelerate_launch_raising(argv_tail, plan, **options)
    except WorkerFailed as e:
        import logging

        logging.getLogger("xtrain.launch.launcher").error(e.one_line())
        return e.exit_code
    return 0
