"""`xtrain studio --shortcut`: a launcher a user double-clicks instead of opening a terminal again,
for the one who set xtrain up once by pasting the README's commands.

- Windows: ``xtrain studio.cmd`` on the Desktop (the known folder, OneDrive's where it is
  redirected). Double-clicked it opens a console running the studio, which opens the browser;
  closing that window ends the studio, never a run.
- Linux and WSL2: ``xtrain-studio.desktop`` in the applications menu
  (``$XDG_DATA_HOME/applications``), started in a terminal.

Each starts this environment's Python (``python -m xtrain studio``: no PATH or activation needed)
with the runs folder made absolute, in the folder the shortcut was made from. ``launcher`` is a pure
function of those facts; ``desktop_folder`` and ``applications_folder`` read the machine; ``write``
never replaces a file that is not one of these launchers.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from xtrain import atomic
from xtrain.errors import XtrainError

MARK = "written by xtrain studio --shortcut"  # what says a file is ours to replace
WINDOWS_NAME = "xtrain studio.cmd"
DESKTOP_ENTRY_NAME = "xtrain-studio.desktop"


@dataclass(frozen=True)
class Launcher:
    path: Path
    text: str
    newline: str  # CRLF for cmd.exe
    shown: str  # where it is, as the user finds it, and how it starts


def _cmd_quoted(value: str) -> str:
    """One argument of a batch file: in double quotes (spaces, &, ^), % doubled (a batch file
    expands %...% even inside quotes). Windows paths hold no double quote."""
    return '"' + value.replace("%", "%%") + '"'


def _exec_quoted(value: str) -> str:
    """One argument of a desktop entry's Exec key: quoted per the Desktop Entry spec (", `, $ and
    backslash escaped inside the quotes), then the key's own string escape (backslash doubled),
    % doubled (field codes)."""
    inner = "".join("\\" + c if c in '"`$\\' else c for c in value)
    return ('"' + inner + '"').replace("\\", "\\\\").replace("%", "%%")


def launcher(
    os_kind: str, python: Path, runs: Path, workdir: Path, desktop: Path | None, applications: Path | None
) -> Launcher:
    """The launcher file for ``os_kind``: it runs ``python -m xtrain studio --runs RUNS`` in
    ``workdir`` (all three absolute)."""
    for value in (python, runs, workdir):
        if "\n" in str(value) or "\r" in str(value):
            raise XtrainError(f"{value!s:.80} holds a line break", "use a folder without one")
    if os_kind == "windows":
        if desktop is None:
            raise XtrainError("no Desktop folder found for the shortcut", "run xtrain studio from PowerShell")
        lines = [
            "@echo off",
            f"rem {MARK}: double-click to start the studio; closing this window ends the studio, never a run",
            "chcp 65001 >nul",  # the lines below as UTF-8 (accented folder names)
            f"cd /d {_cmd_quoted(str(workdir))}",
            f"{_cmd_quoted(str(python))} -m xtrain studio --runs {_cmd_quoted(str(runs))}",
            "if errorlevel 1 pause",  # a failed start stays on screen to be read
        ]
        path = desktop / WINDOWS_NAME
        return Launcher(
            path, "\r\n".join(lines) + "\r\n", "\r\n", f"on the Desktop ({path}): double-click it"
        )
    if os_kind in ("linux", "wsl2"):
        if applications is None:
            raise XtrainError("no applications folder found for the shortcut", "set XDG_DATA_HOME or HOME")
        command = " ".join(
            _exec_quoted(a) for a in (str(python), "-m", "xtrain", "studio", "--runs", str(runs))
        )
        lines = [
            "[Desktop Entry]",
            f"# {MARK}",
            "Type=Application",
            "Name=xtrain studio",
            "Comment=Fine-tune models on every GPU, in the browser",
            f"Exec={command}",
            f"Path={workdir}",
            "Terminal=true",
            "Categories=Development;",
        ]
        path = applications / DESKTOP_ENTRY_NAME
        return Launcher(
            path, "\n".join(lines) + "\n", "\n", f"in the applications menu ({path}): start it from there"
        )
    raise XtrainError(f"no studio shortcut for {os_kind}", "start it with: xtrain studio")


def desktop_folder() -> Path | None:
    """Windows' Desktop (the known folder: OneDrive's when redirected there)."""
    try:
        import ctypes
        from ctypes import wintypes

        class Guid(ctypes.Structure):
            _fields_ = [
                ("a", wintypes.DWORD),
                ("b", wintypes.WORD),
                ("c", wintypes.WORD),
                ("d", ctypes.c_ubyte * 8),
            ]

        desktop = Guid(
            0xB4BFCC3A, 0xDB2C, 0x424C, (ctypes.c_ubyte * 8)(0xB0, 0x29, 0x7F, 0xE9, 0x9A, 0x87, 0xC6, 0x41)
        )
        found = ctypes.c_wchar_p()
        shell = ctypes.windll.shell32  # type: ignore[attr-defined]
        if shell.SHGetKnownFolderPath(ctypes.byref(desktop), 0, None, ctypes.byref(found)) == 0:
            path = Path(found.value or "")
            ctypes.windll.ole32.CoTaskMemFree(found)  # type: ignore[attr-defined]
            if path.is_dir():
                return path
    except (AttributeError, OSError):
        pass
    profile = os.environ.get("USERPROFILE")
    return Path(profile) / "Desktop" if profile and (Path(profile) / "Desktop").is_dir() else None


def applications_folder() -> Path | None:
    """Where desktop entries of the user's own go (the XDG base directory rule)."""
    data = os.environ.get("XDG_DATA_HOME") or (
        str(Path(os.environ["HOME"]) / ".local" / "share") if os.environ.get("HOME") else ""
    )
    return Path(data) / "applications" if data else None


def write(found: Launcher) -> Path:
    """``found`` written, replacing only an earlier launcher of ours."""
    if found.path.exists():
        try:
            ours = MARK in found.path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            ours = False
        if not ours:
            raise XtrainError(
                f"{found.path} exists and is not xtrain's launcher", "move it away, then run this again"
            )
    found.path.parent.mkdir(parents=True, exist_ok=True)
    path = atomic.write_text(found.path, found.text)
    if found.newline == "\n":
        path.chmod(0o755)  # some desktops start only an executable entry
    return path
