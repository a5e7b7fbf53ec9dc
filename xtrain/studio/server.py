"""Serving the studio: the socket bound here first (a port of 0 gets a free one, known before the
server starts), uvicorn on it, the URL printed as the last line once the server answers, and the
default browser opened on it unless told not to. Ctrl+C ends the server, never a run: each run
is a process of its own (``launching.py``)."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import webbrowser
from collections.abc import Callable
from pathlib import Path

from xtrain.errors import XtrainError
from xtrain.studio.security import check_bind, is_local, new_token


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (one line when it cannot be had)."""
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    if os.name == "nt":  # no other process may take the port while it is ours
        sock.setsockopt(socket.SOL_SOCKET, getattr(socket, "SO_EXCLUSIVEADDRUSE", socket.SO_REUSEADDR), 1)
    else:  # a studio started again takes its port back at once (TIME_WAIT)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
        sock.listen(128)
    except OSError as e:
        sock.close()
        raise XtrainError(
            f"cannot serve on {host}:{port}: {e.strerror or e}",
            "choose another --port (0: any free one), or stop what holds it",
        ) from None
    sock.set_inheritable(False)
    return sock


DEFAULT_PORTS = range(7870, 7880)  # tried in turn when no --port is given, then any free one


def bind_default(host: str) -> socket.socket:
    """The first of ``DEFAULT_PORTS`` that is free (a second studio, another app on one), else any."""
    for port in DEFAULT_PORTS:
        try:
            return bind(host, port)
        except XtrainError:
            continue
    return bind(host, 0)


def url_of(host: str, port: int, token: str | None) -> str:
    shown = "127.0.0.1" if is_local(host) else (socket.gethostname() if host in ("0.0.0.0", "::") else host)
    shown = f"[{shown}]" if ":" in shown else shown
    return f"http://{shown}:{port}/" + (f"?token={token}" if token else "")


def serve(
    root: Path,
    host: str,
    port: int | None,
    token: str | None,
    browser: bool,
    say: Callable[[str], None],
) -> None:
    """Serve the runs folder ``root`` until Ctrl+C (``port`` None: the first free of
    ``DEFAULT_PORTS``); ``say`` prints a line (the URL the last)."""
    import uvicorn

    from xtrain.studio.app import build

    check_bind(host, token)
    root.mkdir(parents=True, exist_ok=True)
    sock = bind(host, port) if port is not None else bind_default(host)
    port = sock.getsockname()[1]
    logging.basicConfig(level=logging.WARNING, format="studio: %(message)s")
    app = build(root.resolve(), Path.cwd(), token, port, is_local(host))
    config = uvicorn.Config(
        app, log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=2
    )
    server = uvicorn.Server(config)
    url = url_of(host, port, token)

    def ready() -> None:
        while not server.started and not server.should_exit:
            time.sleep(0.05)
        if server.should_exit:
            return
        say(f"xtrain studio: the runs in {root.resolve()}; Ctrl+C ends the studio, never a run")
        if not is_local(host):
            say(f"on this machine: {url_of('127.0.0.1', port, token)}")
        say(url)  # the last line: the address, with its token
        if browser:
            webbrowser.open(url)

    threading.Thread(target=ready, daemon=True, name="studio-ready").start()
    server.run(sockets=[sock])


def default_token(no_token: bool) -> str | None:
    return None if no_token else new_token()
