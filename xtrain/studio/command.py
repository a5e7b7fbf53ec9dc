"""`xtrain studio`: the whole loop in the browser, on the same engine: the machine, a new run
(checked as a dry run checks it, launched as `xtrain train` launches it), the runs with their live
curves, compare, try and export. It prints its URL as its last line when ready and opens the
default browser on it. (The typer command of the room above ``commands/``: it lives here, where
it may import the studio, and ``cli.py`` registers it as it registers ``commands/``'.)"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import typer

from xtrain.commands.options import whole
from xtrain.errors import XtrainError

INSTALL = 'pip install "starlette>=0.40" "uvicorn>=0.30"'  # base dependencies: a broken install lacks them


def studio(
    runs: Path = typer.Option(
        Path("runs"), "--runs", help="The folder whose runs it shows and where new runs go."
    ),
    port: int = typer.Option(
        None,
        "--port",
        parser=whole("--port"),
        help="The port (default: the first free of 7870-7879; 0: any free one).",
    ),
    host: str = typer.Option(
        "127.0.0.1",
        "--host",
        help="The address to serve on; another than 127.0.0.1 is reachable from the network.",
    ),
    no_browser: bool = typer.Option(False, "--no-browser", help="Do not open the default browser."),
    no_token: bool = typer.Option(
        False, "--no-token", help="Serve 127.0.0.1 without a token (refused for any other --host)."
    ),
    shortcut: bool = typer.Option(
        False,
        "--shortcut",
        help="Write a launcher to double-click instead (Windows: on the Desktop; Linux: the applications "
        "menu), for this --runs folder, and exit.",
    ),
) -> None:
    """A local web app for the whole loop: machine, new run, runs with live curves, compare,
    try, export. Runs outlive the page and the studio."""
    missing = [name for name in ("starlette", "uvicorn") if importlib.util.find_spec(name) is None]
    if missing:
        raise XtrainError(f"xtrain studio needs {' and '.join(missing)}", f"install them: {INSTALL}")
    if port is not None and not 0 <= port <= 65535:
        raise XtrainError(f"--port {port} is not a port", "a number in 0..65535 (0: any free one)")
    from xtrain.studio.server import default_token, serve

    if runs.exists() and not runs.is_dir():
        raise XtrainError(f"--runs {runs} is a file", "name a folder (it is made when missing)")
    if shortcut:
        _write_shortcut(runs)
        return
    serve(
        runs.expanduser(), host, port, default_token(no_token), not no_browser, lambda line: typer.echo(line)
    )


def _write_shortcut(runs: Path) -> None:
    import platform
    import sys

    from xtrain.machine.probes.system import classify_os
    from xtrain.studio import shortcut as launchers

    os_kind = classify_os(platform.system(), platform.uname().release)
    desktop = launchers.desktop_folder() if os_kind == "windows" else None
    applications = launchers.applications_folder() if os_kind != "windows" else None
    absolute = runs.expanduser().resolve()
    found = launchers.launcher(os_kind, Path(sys.executable), absolute, Path.cwd(), desktop, applications)
    launchers.write(found)
    typer.echo(f"The studio's launcher for the runs in {absolute} is {found.shown}.")
