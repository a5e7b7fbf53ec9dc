"""`xtrain studio --shortcut`: the launcher a user starts instead of a terminal. On Linux the
desktop entry is checked by freedesktop's own validator and started by GLib itself (``gio
launch``, through a stand-in terminal that runs what it is given); the Windows batch file is
checked line by line (no cmd.exe here)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from xtrain.cli import main
from xtrain.errors import XtrainError
from xtrain.studio import shortcut

TOOLS = ("desktop-file-validate", "gio")  # Debian's desktop-file-utils and libglib2.0-bin (.ci/run)


def _tools() -> None:
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing and os.environ.get("CI"):
        pytest.fail(f"CI installs {', '.join(missing)} (.ci/run)")
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (apt install desktop-file-utils libglib2.0-bin)")


def test_the_desktop_entry_is_valid_and_starts_the_studio_on_its_runs_folder(tmp_path, monkeypatch, capsys):
    _tools()
    runs = tmp_path / "my runs" / "é $HOME %u `x` \\ end"  # every character the Exec key escapes
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.chdir(tmp_path)
    assert main(["studio", "--shortcut", "--runs", str(runs)]) == 0
    entry = tmp_path / "data" / "applications" / shortcut.DESKTOP_ENTRY_NAME
    assert "in the applications menu" in capsys.readouterr().out
    checked = subprocess.run(["desktop-file-validate", str(entry)], capture_output=True, text=True)
    assert checked.returncode == 0 and not checked.stdout.strip(), checked.stdout

    terminal = tmp_path / "bin" / "xterm"  # GLib runs a Terminal=true entry as `xterm -e ARGV...`
    terminal.parent.mkdir()
    log, pid = tmp_path / "studio.log", tmp_path / "studio.pid"
    terminal.write_text(
        f'#!/bin/sh\necho $$ > "{pid}"\n[ "$1" = "-e" ] && shift\n'
        f'exec "$@" --no-browser --port 0 > "{log}" 2>&1\n',
        encoding="utf-8",
    )
    terminal.chmod(0o755)
    env = {**os.environ, "PATH": f"{terminal.parent}{os.pathsep}{os.environ['PATH']}"}
    subprocess.run(["gio", "launch", str(entry)], env=env, check=True, timeout=30)
    try:
        deadline = time.monotonic() + 60
        while "http://127.0.0.1:" not in (log.read_text(encoding="utf-8") if log.exists() else ""):
            assert time.monotonic() < deadline, log.read_text(encoding="utf-8") if log.exists() else "no log"
            time.sleep(0.2)
        said = log.read_text(encoding="utf-8")
        assert f"the runs in {runs}" in said and runs.is_dir()  # the folder exactly, made by the studio
    finally:
        if pid.exists():
            os.kill(int(pid.read_text()), signal.SIGTERM)


def test_a_file_that_is_not_ours_is_never_replaced_and_ours_is(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    entry = tmp_path / "applications" / shortcut.DESKTOP_ENTRY_NAME
    entry.parent.mkdir()
    entry.write_text("[Desktop Entry]\nName=mine\n", encoding="utf-8")
    assert main(["studio", "--shortcut", "--runs", str(tmp_path / "a")]) == 2
    assert "is not xtrain's launcher" in capsys.readouterr().err
    assert entry.read_text(encoding="utf-8") == "[Desktop Entry]\nName=mine\n"
    entry.unlink()
    for runs in ("a", "b"):  # a second call for another folder refreshes the launcher
        assert main(["studio", "--shortcut", "--runs", str(tmp_path / runs)]) == 0
    assert str(tmp_path / "b") in entry.read_text(encoding="utf-8")


def test_the_windows_launcher_runs_this_python_on_the_runs_folder(tmp_path):
    python = Path(r"C:\Users\Zoë\xtrain & co\.venv\Scripts\python.exe")
    runs, work = Path(r"D:\runs 100%"), Path(r"C:\Users\Zoë\xtrain & co")
    found = shortcut.launcher("windows", python, runs, work, Path(r"C:\Users\Zoë\OneDrive\Desktop"), None)
    assert found.path == Path(r"C:\Users\Zoë\OneDrive\Desktop") / "xtrain studio.cmd"
    lines = found.text.split("\r\n")
    assert lines[0] == "@echo off" and lines[2] == "chcp 65001 >nul" and found.text.endswith("\r\n")
    assert lines[3] == r'cd /d "C:\Users\Zoë\xtrain & co"'
    assert (
        lines[4]
        == r'"C:\Users\Zoë\xtrain & co\.venv\Scripts\python.exe" -m xtrain studio --runs "D:\runs 100%%"'
    )
    with pytest.raises(XtrainError, match="no Desktop folder"):
        shortcut.launcher("windows", python, runs, work, None, None)
    with pytest.raises(XtrainError, match="no studio shortcut for macos"):
        shortcut.launcher("macos", python, runs, work, None, None)
