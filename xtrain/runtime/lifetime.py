"""Workers live and die with their launcher.

Signals do not reach every worker: torchrun starts each worker in a session of its own, so
killing the launcher's process group misses them (FIELD_NOTES), and SIGKILL of the launcher
alone reaches nobody. So each worker watches its launcher with the OS's own means:

- Linux: ``prctl(PR_SET_PDEATHSIG, SIGKILL)``: the kernel kills the worker when its parent
  dies (no delay, nothing more is written).
- everywhere (the fallback, also for macOS and Windows): a daemon thread that checks the parent
  every ``WATCH_INTERVAL_S`` and kills this process once it is gone (on POSIX the parent id
  changes; on Windows a handle to the parent is waited on, so a reused PID cannot fool it).
- Windows launchers: ``kill_children_on_exit`` puts the launcher in a Job Object with
  JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE: when the launcher ends in any way (console closed, Ctrl+C,
  killed in Task Manager) Windows ends every process it started.

A worker only watches when a launcher started it (its ``LaunchContext``: ``WORLD_SIZE`` set, or
``accelerate launch``'s one-process launcher: ``ACCELERATE_USE_CPU`` set and the parent's command
line names accelerate;
there the end is a stop with a checkpoint, see ``watch_parent``) or xtrain did
(``XTRAIN_PARENT_PID``): a run started by hand under ``nohup`` must outlive its shell.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, NoReturn

from xtrain.planning.context import LaunchContext

if TYPE_CHECKING:
    from collections.abc import Mapping

PARENT_ENV = "XTRAIN_PARENT_PID"
STOP_GRACE_S = 120.0  # after a stop is passed on, workers that have not ended by then are killed
WATCH_INTERVAL_S = 0.5
_watching = False


def _set_pdeathsig() -> bool:
    """Linux only: SIGKILL this process when its parent thread exits."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        return libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _die() -> None:
    """End this process now, writing nothing more (no atexit, no finally blocks)."""
    if os.name == "posix":
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(137)


class _WindowsParent:
    """A handle to the parent process; ``gone()`` is true once it has exited."""

    SYNCHRONIZE = 0x00100000
    WAIT_OBJECT_0 = 0

    def __init__(self, pid: int) -> None:
        import ctypes
        from ctypes import wintypes

        k32 = ctypes.WinDLL("kernel32", use_last_error=True)  # type: ignore[attr-defined]
        k32.OpenProcess.restype = wintypes.HANDLE  # 64-bit handles: not the default c_int
        k32.OpenProcess.argtypes = [wintypes.DWORD, wintypes.BOOL, wintypes.DWORD]
        k32.WaitForSingleObject.restype = wintypes.DWORD
        k32.WaitForSingleObject.argtypes = [wintypes.HANDLE, wintypes.DWORD]
        self._k32 = k32
        self._handle = k32.OpenProcess(self.SYNCHRONIZE, False, pid)

    def gone(self) -> bool:
        if not self._handle:
            return False  # cannot watch (no right to open it): rely on the launcher's job object
        return self._k32.WaitForSingleObject(self._handle, 0) == self.WAIT_OBJECT_0


def parent_to_watch(
    context: LaunchContext | None = None, environ: Mapping[str, str] | None = None
) -> int | None:
    """The launcher's PID when this process was started by one, else None: xtrain's launcher
    names itself (``XTRAIN_PARENT_PID``); another launcher is this process's parent when the
    launch ``context`` says one started it (None: only xtrain's own launcher is looked for)."""
    env = os.environ if environ is None else environ
    sent = env.get(PARENT_ENV, "")
    if sent.strip().isdigit():
        return int(sent)
    if context is not None and (context.launched or _under_accelerate_simple_launcher(context)):
        return os.getppid()
    return None


def _under_accelerate_simple_launcher(context: LaunchContext | None) -> bool:
    """``accelerate launch`` with one process (its ``simple_launcher``: a 1-process config, or
    xtrain's Windows config, where xtrain.run spawns the workers) sets ``ACCELERATE_USE_CPU`` but
    no ``WORLD_SIZE`` (``LaunchContext.accelerate_simple``); SIGTERM ends it at once (it installs
    no handler) and would leave this run going on alone."""
    if context is None or not context.accelerate_simple:
        return False
    import psutil

    try:
        return any("accelerate" in part for part in psutil.Process(os.getppid()).cmdline())
    except psutil.Error:
        return False


def _stop_then_die(grace_s: float) -> None:
    """The parent is gone but had no way to pass a stop on: stop as on SIGTERM (the loop saves at
    the next step boundary and exits 143), and end for good after ``grace_s``."""
    timer = threading.Timer(grace_s, _die)
    timer.daemon = True
    timer.start()
    os.kill(os.getpid(), signal.SIGTERM)


def watch_parent(
    context: LaunchContext | None = None,
    parent_pid: int | None = None,
    interval_s: float = WATCH_INTERVAL_S,
) -> bool:
    """Make this process end when ``parent_pid`` (default: the launcher that started it, see
    ``parent_to_watch``: xtrain's, or the one the launch ``context`` names) ends. Idempotent;
    returns whether a watch is active.

    Under ``accelerate launch``'s one-process launcher the end is a stop, not a kill: a Ctrl+C
    reaches this process and accelerate alike, and accelerate exits at once (its KeyboardInterrupt)
    while this process is still saving its stop checkpoint; a SIGTERM to accelerate alone reaches
    only accelerate. So there the watch thread sends this process SIGTERM (stop at the next step,
    save) and kills it only ``STOP_GRACE_S`` later; no PR_SET_PDEATHSIG."""
    global _watching
    graceful = parent_pid is None and _under_accelerate_simple_launcher(context)
    pid = parent_to_watch(context) if parent_pid is None else parent_pid
    if pid is None or pid <= 1:
        return False
    if _watching:
        return True
    if os.name == "nt":
        parent = _WindowsParent(pid)
        gone = parent.gone
    else:
        if os.getppid() == pid and not graceful:
            _set_pdeathsig()

        def gone() -> bool:
            return os.getppid() != pid

    if gone() and not graceful:  # the launcher died before the watch started
        _die()

    def watch() -> None:
        while True:
            if gone():
                if graceful:
                    _stop_then_die(STOP_GRACE_S)
                    return
                _die()
            time.sleep(interval_s)

    threading.Thread(target=watch, name="xtrain-parent-watch", daemon=True).start()
    _watching = True
    return True


# What a finished rank of a multi-process run holds on to until ``end_rank``'s ``os._exit``.
_KEPT: list[object] = []


def keep_until_exit(obj: object) -> None:
    """Hold ``obj`` (a finished run: its DDP reducer, accelerate's references, the process group
    they hold) until this rank ends with ``end_rank``. Freeing it earlier runs gloo's
    process-group destructor, which deadlocked a finished rank whose peers had gone (seen: rank
    1 of ``xtrain train --processes 2`` blocked for good in ``~ProcessGroupGloo`` under
    ``~Reducer`` as the finished recipe was freed, after rank 0 had written every output)."""
    _KEPT.append(obj)


def end_rank(code: int) -> NoReturn:
    """End this rank of a multi-process run with ``code`` once it is done (its outputs written,
    its process group destroyed, its trackers ended), skipping the interpreter's teardown: at
    that teardown gloo now and then aborts a rank whose peer closed its sockets first
    ("terminate called without an active exception", SIGABRT; seen in the 2-process tests under
    accelerate launch, rank 1, after rank 0 had written every output), which turns a finished run
    into a failed one. ``multiprocessing`` ends its forked children the same way."""
    import logging

    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    logging.shutdown()
    os._exit(code)


def child_env() -> dict[str, str]:
    """What a launcher adds to a child's environment so the child watches it."""
    return {PARENT_ENV: str(os.getpid())}


def kill_children_on_exit() -> bool:
    """Windows: every process this one starts from now on ends when this one ends (a Job Object
    with kill-on-close that holds this process). Elsewhere a no-op (workers watch their parent).
    Best effort: returns False when Windows refused (e.g. a job that forbids nesting)."""
    if os.name != "nt":
        return False
    try:
        return _windows_kill_on_close_job()
    except OSError:
        return False


_job_handle: Any = None  # kept open for the life of this process: closing it kills the job


JOB_OBJECT_EXTENDED_LIMIT_INFORMATION_CLASS = 9  # JOBOBJECTINFOCLASS.JobObjectExtendedLimitInformation
JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE = 0x2000


def job_limit_struct(dword: Any = None) -> Any:
    """The ctypes type of Win32's JOBOBJECT_EXTENDED_LIMIT_INFORMATION (winnt.h). ``dword``: the
    32-bit unsigned type (``wintypes.DWORD`` on Windows; tests pass ``c_uint32`` to check the x64
    layout elsewhere, where ``wintypes.DWORD`` is a C long of 8 bytes)."""
    import ctypes

    if dword is None:
        from ctypes import wintypes

        dword = wintypes.DWORD

    class IO_COUNTERS(ctypes.Structure):
        _fields_ = [(n, ctypes.c_ulonglong) for n in (
            "ReadOperationCount", "WriteOperationCount", "OtherOperationCount",
            "ReadTransferCount", "WriteTransferCount", "OtherTransferCount",
        )]  # fmt: skip

    class JOBOBJECT_BASIC_LIMIT_INFORMATION(ctypes.Structure):
        _fields_ = [
            ("PerProcessUserTimeLimit", ctypes.c_int64),  # LARGE_INTEGER
            ("PerJobUserTimeLimit", ctypes.c_int64),
            ("LimitFlags", dword),
            ("MinimumWorkingSetSize", ctypes.c_size_t),  # SIZE_T
            ("MaximumWorkingSetSize", ctypes.c_size_t),
            ("ActiveProcessLimit", dword),
            ("Affinity", ctypes.c_size_t),  # ULONG_PTR
            ("PriorityClass", dword),
            ("SchedulingClass", dword),
        ]

    class JOBOBJECT_EXTENDED_LIMIT_INFORMATION(ctypes.Structure):
        _fields_ = [
            ("BasicLimitInformation", JOBOBJECT_BASIC_LIMIT_INFORMATION),
            ("IoInfo", IO_COUNTERS),
            ("ProcessMemoryLimit", ctypes.c_size_t),
            ("JobMemoryLimit", ctypes.c_size_t),
            ("PeakProcessMemoryUsed", ctypes.c_size_t),
            ("PeakJobMemoryUsed", ctypes.c_size_t),
        ]

    return JOBOBJECT_EXTENDED_LIMIT_INFORMATION


def _kernel32() -> Any:
    import ctypes
    from ctypes import wintypes

    k32 = ctypes.WinDLL("kernel32", use_last_error=True)  # type: ignore[attr-defined]
    k32.CreateJobObjectW.restype = wintypes.HANDLE
    k32.CreateJobObjectW.argtypes = [ctypes.c_void_p, wintypes.LPCWSTR]
    k32.SetInformationJobObject.restype = wintypes.BOOL
    k32.SetInformationJobObject.argtypes = [wintypes.HANDLE, ctypes.c_int, ctypes.c_void_p, wintypes.DWORD]
    k32.AssignProcessToJobObject.restype = wintypes.BOOL
    k32.AssignProcessToJobObject.argtypes = [wintypes.HANDLE, wintypes.HANDLE]
    k32.GetCurrentProcess.restype = wintypes.HANDLE
    k32.CloseHandle.argtypes = [wintypes.HANDLE]
    return k32


def _windows_kill_on_close_job(k32: Any = None, limits: Any = None) -> bool:
    """Create a kill-on-close job and put this process in it. ``k32``/``limits``: kernel32 and the
    limit struct type, injected by tests (the real ones exist only on Windows)."""
    global _job_handle
    if _job_handle is not None:
        return True
    import ctypes

    k32 = k32 if k32 is not None else _kernel32()
    info = (limits or job_limit_struct())()
    job = k32.CreateJobObjectW(None, None)
    if not job:
        return False
    info.BasicLimitInformation.LimitFlags = JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE
    ok = k32.SetInformationJobObject(
        job, JOB_OBJECT_EXTENDED_LIMIT_INFORMATION_CLASS, ctypes.byref(info), ctypes.sizeof(info)
    ) and k32.AssignProcessToJobObject(job, k32.GetCurrentProcess())
    if not ok:
        k32.CloseHandle(job)
        return False
    _job_handle = job  # never closed: Windows closes it when this process ends, killing the job
    return True


def kill_process_tree(timeout_s: float = 5.0) -> int:
    """SIGKILL every descendant of this process (a second Ctrl+C: stop at once). Returns how
    many were killed."""
    import psutil

    try:
        children = psutil.Process().children(recursive=True)
    except psutil.Error:
        return 0
    for child in children:
        with contextlib.suppress(psutil.Error):
            child.kill()
    psutil.wait_procs(children, timeout=timeout_s)
    return len(children)
