"""Writing commands in the user's shell: PowerShell on Windows, bash elsewhere.

Every line xtrain prints for the user to run is built here, so quoting is decided in one place.
A fix may span several lines: each line is a command or a ``#`` comment (valid in both shells).
"""

from __future__ import annotations

import re

# Words that need no quotes. PowerShell is stricter than bash: an unquoted "," makes an array
# (`--gpus 0,1` reaches a program as "0 1") and a leading "@" splats, so both are quoted there.
_SAFE_BASH = re.compile(r"^[A-Za-z0-9_./:\\=,+@%-]+$")
_SAFE_POWERSHELL = re.compile(r"^[A-Za-z0-9_./:\\=+%-]+$")
# PowerShell treats the typographic single quotes like "'" inside '...' (about_Quoting_Rules):
# each must be doubled, or a path such as C:\Users\O’Brien would end the string early.
_PS_SINGLE_QUOTES = "'\u2018\u2019\u201a\u201b"
# In "..." PowerShell expands $ and ` (and typographic double quotes end the string).
_PS_DOUBLE_SPECIAL = re.compile('[$`"\u201c\u201d\u201e]')


def shell_for(os_kind: str) -> str:
    return "powershell" if os_kind == "windows" else "bash"


def _ps_single(text: str) -> str:
    return "'" + "".join(ch * 2 if ch in _PS_SINGLE_QUOTES else ch for ch in text) + "'"


def quote(shell: str, text: str) -> str:
    """``text`` as one literal argument in the user's shell (single quotes when needed)."""
    if shell == "powershell":
        return text if _SAFE_POWERSHELL.match(text) else _ps_single(text)
    if _SAFE_BASH.match(text):
        return text
    return "'" + text.replace("'", "'\\''") + "'"


def set_env(shell: str, name: str, value: str) -> str:
    """The line that sets an environment variable for the current session."""
    if shell == "powershell":
        # "..." as people write it, unless the value holds something "..." would expand
        shown = _ps_single(value) if _PS_DOUBLE_SPECIAL.search(value) else f'"{value}"'
        return f"$env:{name} = {shown}"
    return f"export {name}={quote(shell, value)}"


def unset_env(shell: str, name: str) -> str:
    if shell == "powershell":
        return f"Remove-Item Env:{name}"
    return f"unset {name}"


def comment(text: str) -> str:
    """A comment line (the same in both shells); never more than one line."""
    return "# " + " ".join(text.split())


def join_commands(commands: list[str]) -> str:
    """Several commands on one line: ``;`` separates them in bash and in PowerShell 5.1 (which
    has no ``&&``)."""
    return "; ".join(commands)


def join_lines(shell: str, parts: list[str]) -> str:
    """A long command split over lines with the shell's continuation character."""
    cont = " `" if shell == "powershell" else " \\"
    return (cont + "\n    ").join(parts)


def python_exe(shell: str) -> str:
    return "python" if shell == "powershell" else "python3"


def python_command(shell: str, executable: str | None = None) -> str:
    """How to run the interpreter that runs xtrain (``sys.executable``), as the shell needs it:
    PowerShell runs a quoted path only through the call operator ``&``. Without a recorded
    interpreter (an older snapshot): the usual name on PATH."""
    if not executable:
        return python_exe(shell)
    quoted = quote(shell, executable)
    if shell == "powershell" and quoted != executable:
        return f"& {quoted}"
    return quoted


def pip_command(shell: str, executable: str | None, args: list[str]) -> str:
    """``<python> -m pip ARGS`` for the interpreter that runs xtrain (so the package lands in
    the environment xtrain imports from, not in whatever ``pip`` is first on PATH)."""
    return " ".join([python_command(shell, executable), "-m", "pip", *(quote(shell, a) for a in args)])
