"""A warm interpreter for the suite's ``python -m xtrain ...`` subprocesses.

Most of a subprocess test is its child importing torch, transformers, peft and accelerate once
more (about 4-5 s on CI's 2 cores). ``popen`` and ``run`` hand such a command to a server that
imported them once and forks a child for it. The child is a real process: its own pid and, like
``start_new_session``, its own session; the test's pipes as its stdio; the command's environment,
working folder and arguments; ``python -m``'s ``sys.path[0]``; real signals and exit codes (a
signal kills it as it kills a cold process; atexit handlers and thread joins run as at a normal
exit). What it starts (spawned workers, torchrun's and accelerate's workers) are ordinary cold
``python`` processes, as for a user.

A command goes to ``subprocess.Popen`` unchanged when the server cannot run it exactly as
``python -m`` would: another program or module (accelerate's launcher too: its worker reads the
launcher's command line, and a forked child shows the server's), a platform without fork
(Windows, macOS), an environment without ``OMP_NUM_THREADS=1`` (torch then starts a thread at
import), or a server that holds more than one thread after its imports (fork would copy a lock
another thread holds). Servers are keyed by the environment variables that imports read (``IMPORT_ENV``):
commands whose values differ get a server of their own, at most ``MAX_SERVERS`` at a time.

``XTRAIN_TEST_COLD=1`` sends every command to ``subprocess.Popen`` (to compare, or to rule the
server out when a test fails).
"""

from __future__ import annotations

import array
import atexit
import contextlib
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parents[1]
# The modules a command may run, and what the server imports for them before forking.
# Not accelerate's launcher: a worker reads its parent's command line to tell accelerate's
# one-process launcher (xtrain.launch.lifetime), and a forked child shows the server's.
WARM_MODULES = ("xtrain", "xtrain.run", "torch.distributed.run")
PRELOAD = (
    "torch",
    "transformers",
    "transformers.modeling_utils",
    "transformers.models.llama.modeling_llama",
    "peft",
    "accelerate",
    "accelerate.commands.launch",
    "torch.distributed.run",
    "xtrain.cli",
    "xtrain.run",
)
# Environment variables read at import time (by the interpreter, libgomp, torch, the Hugging Face
# libraries' constants, accelerate's config path, tempfile): a server serves one set of values.
IMPORT_ENV = re.compile(
    r"^(PYTHON\w*|HF_\w*|HUGGINGFACE\w*|TRANSFORMERS_\w*|DATASETS_\w*|ACCELERATE_\w*|TORCH\w*"
    r"|PYTORCH_\w*|OMP_\w*|MKL_\w*|KMP_\w*|GOMP_\w*|CUDA_\w*|NCCL_\w*|GLOO_\w*|TOKENIZERS_\w*"
    r"|BNB_\w*|BITSANDBYTES_\w*|XDG_\w*|HOME|TMPDIR|TEMP|TMP|LANG|LC_\w*|PATH|LD_\w*)$"
)
MAX_SERVERS = 3
START_TIMEOUT_S = 180


def _usable() -> bool:
    return sys.platform.startswith("linux") and os.environ.get("XTRAIN_TEST_COLD") != "1"


def _warm_module(cmd: list[str]) -> str | None:
    if len(cmd) >= 3 and cmd[0] == sys.executable and cmd[1] == "-m" and cmd[2] in WARM_MODULES:
        return cmd[2]
    return None


def _key(env: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in env.items() if IMPORT_ENV.match(k)))


# -- the client side (the pytest process) ------------------------------------------------------


class _Server:
    """One warm interpreter, started with the environment of the first command of its key."""

    def __init__(self, env: dict[str, str]) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="xtrain-warm-"))
        self.path = str(self.folder / "s")
        code = f"import sys; sys.path.insert(0, {str(TESTS)!r}); from support.warm import serve; serve()"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code, self.path],
            env=env,
            cwd=str(TESTS.parent),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.ready: bool | None = None

    def wait_ready(self) -> bool:
        if self.ready is None:
            line = ""
            if select.select([self.proc.stdout], [], [], START_TIMEOUT_S)[0]:
                line = self.proc.stdout.readline().strip()
            self.ready = line == "ready"
        return self.ready

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        with contextlib.suppress(Exception):
            self.proc.wait(10)
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        with contextlib.suppress(OSError):
            self.folder.rmdir()


_servers: OrderedDict[tuple[tuple[str, str], ...], _Server] = OrderedDict()
_lock = threading.Lock()


def _server_for(env: dict[str, str]) -> _Server | None:
    key = _key(env)
    with _lock:
        server = _servers.get(key)
        if server is None:
            while len(_servers) >= MAX_SERVERS:
                _servers.popitem(last=False)[1].close()
            server = _servers[key] = _Server(env)
        _servers.move_to_end(key)
    return server if server.wait_ready() else None


@atexit.register
def close_servers() -> None:
    with _lock:
        while _servers:
            _servers.popitem()[1].close()


class _Cold(Exception):
    """The server declined the command (more than one thread): run it cold."""


class WarmPopen:
    """The part of ``subprocess.Popen`` the tests use, for a child of a warm server."""

    def __init__(
        self,
        server: _Server,
        cmd: list[str],
        env: dict[str, str],
        cwd: str | os.PathLike | None,
        stdout: Any,
        stderr: Any,
        text: bool,
        start_new_session: bool,
    ) -> None:
        self.args = cmd
        self.returncode: int | None = None
        self.stdin = None
        mine: list[int] = []  # our ends of the pipes
        theirs: list[int] = []  # the child's ends, closed here once sent
        child_fds = [os.open(os.devnull, os.O_RDONLY)]
        theirs.append(child_fds[0])
        self.stdout = self.stderr = None
        for target, name in ((stdout, "stdout"), (stderr, "stderr")):
            if target == subprocess.PIPE:
                r, w = os.pipe()
                mine.append(r)
                theirs.append(w)
                child_fds.append(w)
                opened = {"encoding": "utf-8", "errors": "replace"} if text else {"mode": "rb"}
                setattr(self, name, open(r, **opened))  # noqa: SIM115 (the pipe, closed by its reader)
            elif target == subprocess.STDOUT and name == "stderr":
                child_fds.append(child_fds[1])
            elif target == subprocess.DEVNULL:
                fd = os.open(os.devnull, os.O_WRONLY)
                theirs.append(fd)
                child_fds.append(fd)
            elif target is None:
                child_fds.append(1 if name == "stdout" else 2)
            else:
                child_fds.append(target if isinstance(target, int) else target.fileno())
        request = {
            "module": cmd[2],
            "args": cmd[3:],
            "env": env,
            "cwd": str(cwd) if cwd is not None else os.getcwd(),
            "new_session": start_new_session,
        }
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.connect(server.path)
            payload = json.dumps(request).encode()
            self._sock.sendmsg(
                [len(payload).to_bytes(8, "big"), payload],
                [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", child_fds))],
            )
            reply = self._line()
        finally:
            for fd in theirs:
                os.close(fd)
        if not reply.startswith("P "):
            for stream in (self.stdout, self.stderr):
                if stream is not None:
                    stream.close()
            self._sock.close()
            raise _Cold(reply)
        self.pid = int(reply[2:])
        self._buffer = b""
        self._readers: list[threading.Thread] | None = None
        self._output: dict[str, Any] = {}

    def _line(self, timeout: float | None = None) -> str:
        while b"\n" not in getattr(self, "_buffer", b""):
            if timeout is not None and not select.select([self._sock], [], [], timeout)[0]:
                return ""
            chunk = self._sock.recv(64)
            if not chunk:
                raise RuntimeError("the warm server went away")
            self._buffer = getattr(self, "_buffer", b"") + chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode()

    def poll(self) -> int | None:
        if self.returncode is None:
            line = self._line(timeout=0)
            if line.startswith("X "):
                self.returncode = int(line[2:])
                self._sock.close()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            line = self._line(timeout=timeout)
            if not line:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self.returncode = int(line[2:])
            self._sock.close()
        return self.returncode

    def communicate(self, input: Any = None, timeout: float | None = None) -> tuple[Any, Any]:
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._readers is None:
            self._readers = []
            for name in ("stdout", "stderr"):
                stream = getattr(self, name)
                if stream is not None:
                    t = threading.Thread(target=self._read, args=(name, stream), daemon=True)
                    t.start()
                    self._readers.append(t)
        for t in self._readers:
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if t.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return self._output.get("stdout"), self._output.get("stderr")

    def _read(self, name: str, stream: Any) -> None:
        self._output[name] = stream.read()
        stream.close()

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def __enter__(self) -> WarmPopen:
        return self

    def __exit__(self, *exc: object) -> None:
        for stream in (self.stdout, self.stderr):
            if stream is not None:
                stream.close()
        self.wait()


_POPEN_KEYS = {"env", "cwd", "stdout", "stderr", "text", "start_new_session", "universal_newlines"}
_RUN_KEYS = _POPEN_KEYS | {"capture_output", "timeout", "check"}


def _eligible(cmd: Any, kwargs: dict[str, Any], keys: set[str]) -> bool:
    return (
        isinstance(cmd, list)
        and _warm_module(cmd) is not None
        and _usable()
        and not set(kwargs) - keys
        and kwargs.get("env") is not None
        # torch starts an OpenMP thread at import unless its pool has one thread; a forked child
        # would inherit a pool whose threads it does not have
        and kwargs["env"].get("OMP_NUM_THREADS") == "1"
    )


def _note(cmd: Any, how: str) -> None:
    """``XTRAIN_TEST_WARM_LOG=FILE``: one line a command (how it ran), to see what the server serves."""
    log = os.environ.get("XTRAIN_TEST_WARM_LOG")
    if log:
        with open(log, "a", encoding="utf-8") as f:
            f.write(json.dumps({"how": how, "cmd": [str(c) for c in cmd[:4]]}) + "\n")


def popen(cmd: list[str], **kwargs: Any) -> Any:
    """``subprocess.Popen(cmd, **kwargs)``, from a warm server where the command allows it."""
    if _eligible(cmd, kwargs, _POPEN_KEYS):
        fresh = _key(kwargs["env"]) not in _servers
        server = _server_for(kwargs["env"])
        if server is not None:
            try:
                proc = WarmPopen(
                    server,
                    cmd,
                    kwargs["env"],
                    kwargs.get("cwd"),
                    kwargs.get("stdout"),
                    kwargs.get("stderr"),
                    bool(kwargs.get("text") or kwargs.get("universal_newlines")),
                    bool(kwargs.get("start_new_session")),
                )
                _note(cmd, "warm, new server" if fresh else "warm")
                return proc
            except _Cold:
                pass
    _note(cmd, "cold")
    return subprocess.Popen(cmd, **kwargs)


def run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, **kwargs)``, from a warm server where the command allows it."""
    if not _eligible(cmd, kwargs, _RUN_KEYS):
        _note(cmd, "cold")
        return subprocess.run(cmd, **kwargs)
    timeout, check = kwargs.pop("timeout", None), kwargs.pop("check", False)
    if kwargs.pop("capture_output", False):
        kwargs.update(stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc = popen(cmd, **kwargs)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    done = subprocess.CompletedProcess(cmd, proc.wait(), out, err)
    if check:
        done.check_returncode()
    return done


# -- the server side -----------------------------------------------------------------------------


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def serve() -> None:
    """Import ``PRELOAD``, then fork a child for each request on the socket ``sys.argv[1]``."""
    import ctypes
    import importlib

    path = sys.argv[1]
    with contextlib.suppress(Exception):  # die with the test session
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    for name in PRELOAD:
        importlib.import_module(name)
    for name in WARM_MODULES:  # each child runs its module afresh as __main__, as python -m does
        module = sys.modules.get(name)
        sys.modules.pop(f"{name}.__main__" if hasattr(module, "__path__") else name, None)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    waiting: dict[int, socket.socket] = {}
    print("ready" if _threads() == 1 else "threads", flush=True)
    while True:
        ready = select.select([listener, wake_r], [], [])[0]
        if wake_r in ready:
            with contextlib.suppress(BlockingIOError):
                os.read(wake_r, 4096)
            while True:
                try:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if pid == 0:
                    break
                conn = waiting.pop(pid, None)
                if conn is not None:
                    with contextlib.suppress(OSError):
                        conn.sendall(f"X {os.waitstatus_to_exitcode(status)}\n".encode())
                    conn.close()
        if listener in ready:
            conn, _ = listener.accept()
            request, fds = _receive(conn)
            if _threads() != 1:
                conn.sendall(b"C threads\n")
                conn.close()
                for fd in fds:
                    os.close(fd)
                continue
            pid = os.fork()
            if pid == 0:
                listener.close()
                conn.close()
                os.close(wake_r)
                os.close(wake_w)
                _child(request, fds)  # never returns
            for fd in fds:
                os.close(fd)
            conn.sendall(f"P {pid}\n".encode())
            waiting[pid] = conn


def _receive(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    fds = array.array("i")
    data, ancillary, _, _ = conn.recvmsg(8, socket.CMSG_SPACE(3 * fds.itemsize))
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    size = int.from_bytes(data, "big")
    body = b""
    while len(body) < size:
        body += conn.recv(size - len(body))
    return json.loads(body), list(fds)


def _child(request: dict[str, Any], fds: list[int]) -> None:
    """Become ``python -m MODULE ARGS`` as a cold interpreter would, and exit as it would."""
    import atexit as _atexit
    import runpy
    import traceback

    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        if request["new_session"]:
            os.setsid()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in set(fds):
            if fd > 2:
                os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.path[0] = os.getcwd()  # python -m puts the working folder first
        sys.argv = [request["module"], *request["args"]]
        _reseed()
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as e:
        code = _exit_code(e.code)
    except KeyboardInterrupt:
        traceback.print_exc()
        _finish()
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # as CPython reports an uncaught Ctrl+C
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:
        traceback.print_exc()
        code = 1
    _finish()
    del _atexit
    os._exit(code)


def _finish() -> None:
    """What a normal interpreter exit does before it ends: join threads, run atexit, flush."""
    with contextlib.suppress(BaseException):
        threading._shutdown()  # type: ignore[attr-defined]
    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()  # type: ignore[attr-defined]
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):
            stream.flush()


def _exit_code(value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    print(value, file=sys.stderr)
    return 1


def _reseed() -> None:
    """A cold interpreter seeds its generators from the OS; forked children would share them."""
    with contextlib.suppress(Exception):
        import numpy

        numpy.random.seed()
    with contextlib.suppress(Exception):
        import torch

        torch.seed()
