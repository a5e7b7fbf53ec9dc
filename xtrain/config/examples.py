"""The ready configs of ``examples/`` for a user who runs xtrain outside its checkout: the README
installs xtrain editable from the checkout, so its ``examples/`` lies next to the package. A
command or a missing config path naming ``examples/...`` is pointed there when the folder the
user runs in has none."""

from __future__ import annotations

from pathlib import Path

PREFIX = "examples/"


def checkout_examples() -> Path | None:
    """The checkout's ``examples/`` folder (None when xtrain is installed without it)."""
    folder = Path(__file__).resolve().parents[2] / "examples"
    return folder if folder.is_dir() else None


def locate(path: str) -> str:
    """``path`` as the user can run it from here: unchanged when it exists or names no example;
    else the checkout's copy of it."""
    if not path.startswith(PREFIX) or Path(path).exists():
        return path
    folder = checkout_examples()
    found = folder / path[len(PREFIX) :] if folder else None
    return found.as_posix() if found is not None and found.exists() else path


def in_command(command: str) -> str:
    """Each ``examples/...`` word of ``command`` located (``locate``)."""
    return " ".join(locate(word) for word in command.split(" "))


def missing_hint(path: Path) -> str:
    """What to do about a config that is not there: the checkout's copy when it names one."""
    located = locate(path.as_posix())
    if located != path.as_posix():
        return f"examples/ is in xtrain's checkout: {located}"
    folder = checkout_examples()
    return f"check the path (ready configs: {folder.as_posix()})" if folder else "check the path"
