"""Writing commands in the user's shell: PowerShell on Windows, bash elsewhere."""

from __future__ import annotations

import re

_SAFE = re.compile(r"^[A-Za-z0-9_./:\\=,+@%-]+$")


def shell_for(os_kind: str) -> str:
    return "powershell" if os_kind == "windows" else "bash"


def set_env(shell: str, name: str, value: str) -> str:
    """The line that sets an environment variable for the current session."""
    if shell == "powershell":
        return f'$env:{name} = "{value}"'
    return f"export {name}={value}"


def unset_env(shell: str, name: str) -> str:
    if shell == "powershell":
        return f"Remove-Item Env:{name}"
    return f"unset {name}"


def join_lines(shell: str, parts: list[str]) -> str:
    """A long command split over lines with the shell's continuation character."""
    cont = " `" if shell == "powershell" else " \\"
    return (cont + "\n    ").join(parts)


def python_exe(shell: str) -> str:
    return "python" if shell == "powershell" else "python3"


def quote(shell: str, text: str) -> str:
    """``text`` as one argument in the user's shell (single quotes in both when needed)."""
    if _SAFE.match(text):
        return text
    if shell == "powershell":
        return "'" + text.replace("'", "''") + "'"
    return "'" + text.replace("'", "'\\''") + "'"
