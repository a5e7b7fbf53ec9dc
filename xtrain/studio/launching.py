"""A run started from the studio: ``xtrain train`` itself (the same launcher, plan and checks as
on the command line: spawned workers and gloo on Windows), as a process that outlives the page
and the studio; stopped through its stop request; resumed by the same command.

- **Detached.** POSIX: a session of its own (``start_new_session``), so neither the studio's
  Ctrl+C nor its terminal closing reaches it. Windows: a process group of its own
  (CREATE_NEW_PROCESS_GROUP: no Ctrl+C from the studio's console), a console without a window
  (CREATE_NO_WINDOW, rather than DETACHED_PROCESS: the spawned workers, console programs, then
  share that hidden console instead of each opening a window), and out of the studio's Job
  Object where one is allowed (CREATE_BREAKAWAY_FROM_JOB; a terminal or IDE may put the studio
  in a job that kills its children with it). stdin is closed; stdout and stderr go to the log.
- **Recorded.** Before it starts, its YAML is in the run's folder; once started, the launch
  record (``runs.LAUNCH_RECORD``: pid, time, command, its stages) beside it. The studio keeps
  nothing else: the status is read from the files (``runs.status``).
- **Stop.** A running run: its stop request (``runtime.run_control``; a checkpoint, then the
  stop, as Ctrl+C). A run still starting has nothing to save: its process tree is ended.
- **Resume.** The same configs again with ``run.resume=auto``: a recipe skips its finished stages.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from xtrain import atomic
from xtrain.errors import XtrainError
from xtrain.runtime import run_control
from xtrain.studio.runs import LAUNCH_RECORD, LOG, Launch, launch_of, status

# what a launch by the studio must not inherit: a launcher's variables (the studio's own could
# come from a test or a wrapper), and the parent watch that would end the run with the studio
_DROPPED = ("XTRAIN_PARENT_PID", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
            "MASTER_PORT", "XTRAIN_PLAN", "XTRAIN_REPORT_DIR")  # fmt: skip
CREATE_NEW_PROCESS_GROUP, CREATE_NO_WINDOW, CREATE_BREAKAWAY_FROM_JOB = 0x200, 0x08000000, 0x01000000


RESUME = "run.resume=auto"


def command(configs: list[Path], more: list[str] | None = None) -> list[str]:
    """``python -m xtrain train CONFIG... [options and key=value...]`` with this interpreter."""
    return [sys.executable, "-m", "xtrain", "train", *map(str, configs), *(more or [])]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _DROPPED}
    env["PYTHONUNBUFFERED"] = "1"  # the log fills as the run goes
    env["PYTHONIOENCODING"] = "utf-8"  # (non-ASCII paths and answers in a Windows log)
    return env


def detached(argv: list[str], log: Path, cwd: Path) -> int:
    """Start ``argv`` detached from this process (module docstring), its output appended to
    ``log``; returns its pid. This process reaps it when it ends (a thread waits on it)."""
    with open(log, "ab") as out:
        kwargs: dict = {"stdin": subprocess.DEVNULL, "stdout": out, "stderr": subprocess.STDOUT, "cwd": cwd,
                        "env": _env(), "close_fds": True}  # fmt: skip
        if os.name == "nt":
            flags = CREATE_NEW_PROCESS_GROUP | CREATE_NO_WINDOW
            try:
                proc = subprocess.Popen(argv, creationflags=flags | CREATE_BREAKAWAY_FROM_JOB, **kwargs)
            except OSError:  # a job that allows no breakaway: started inside it
                proc = subprocess.Popen(argv, creationflags=flags, **kwargs)
        else:
            proc = subprocess.Popen(argv, start_new_session=True, **kwargs)
    threading.Thread(target=proc.wait, daemon=True, name=f"reap-{proc.pid}").start()
    return proc.pid


def start(folder: Path, configs: list[Path], stages: list[str], more: list[str] | None = None) -> Launch:
    """``xtrain train`` on ``configs`` (saved already) and ``more`` (its options, overrides),
    detached, its log and launch record in ``folder``; refused in one line while a run of it is
    running or starting."""
    busy = [s for s in stages if status(folder / s).state in ("running", "starting")]
    if busy:
        raise XtrainError(f"{folder.name} is running", "stop it first, or start a new run")
    log = folder / LOG
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    argv = command(configs, more)
    with open(log, "a", encoding="utf-8") as f:
        f.write(f"\n--- xtrain studio, {stamp}: {' '.join(argv[1:])}\n")
    started = time.time()
    pid = detached(argv, log, folder)
    launch = Launch(pid, started, argv, stages, LOG)
    atomic.write_text(folder / LAUNCH_RECORD, launch.to_json())
    return launch


def stop(run: Path) -> str:
    """Ask the run in ``run`` to stop (a running one: its stop request; one still starting: its
    process tree ended, nothing to save yet). Returns what was done, in one line."""
    found = status(run)
    if found.state == "running":
        run_control.request_stop(run)
        return "stop requested: it saves a checkpoint at its next step, then stops"
    launched = launch_of(run)
    if found.state == "starting" and launched is not None:
        _end_tree(launched[1].pid)
        return "stopped before training began (nothing to save)"
    raise XtrainError(f"{run.name} is not running ({found.state})", "there is nothing to stop")


def resume(run: Path) -> Launch:
    """The run's launch again (its configs, ``run.resume=auto``): it goes on from its newest
    checkpoint; a recipe skips its finished stages."""
    launched = launch_of(run)
    if launched is None:
        raise XtrainError(
            f"{run.name} was not started by the studio: its command is not known here",
            "resume it with the command that started it (xtrain train CONFIG: run.resume is auto)",
        )
    folder, record = launched
    if (state := status(run).state) in ("running", "starting"):  # (a launch that said how it ended is over)
        raise XtrainError(f"{run.name} is {state}", "stop it first")
    run_control.clear_stop(run)  # (a request left by a launch that ended before honouring it)
    given = record.argv[4:]  # its configs, then its options (--gpus, --processes) and overrides
    configs = [Path(a) for a in given if Path(a).is_file()]
    more = [a for a in given if not Path(a).is_file() and a != RESUME]
    return start(folder, configs, record.stages, [*more, RESUME])


def _end_tree(pid: int) -> None:
    """End the process ``pid`` and everything it started (a launch still loading)."""
    import psutil

    try:
        parent = psutil.Process(pid)
        procs = [*parent.children(recursive=True), parent]
    except psutil.Error:
        return
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    _, alive = psutil.wait_procs(procs, timeout=5)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
