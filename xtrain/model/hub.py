"""Where the model ``model.name_or_path`` names is, before anything loads it: a built-in, a local
folder, or a Hugging Face hub id in the hub cache or only on the hub. Decided as huggingface_hub
decides (``validate_repo_id``: ``name`` or ``org/name`` of its characters is a repo id; ``./x``,
``/x``, ``~/x``, ``C:\\x`` and a path with more than one ``/`` are paths), so that:

- a local path that is not there fails at once (the dry run too), in one line;
- a hub id that is not in the cache while the hub cannot be reached (``HF_HUB_OFFLINE``, or a
  quick probe: one HEAD of its ``config.json``, no retries, a short timeout) fails at once, in one
  line saying how to point at a local copy, instead of huggingface_hub's retries (10 "Retrying in
  Ns" lines, about a minute);
- a hub id in the cache while the hub cannot be reached is loaded from the cache with no network
  call (``offline``: huggingface_hub's offline mode for this process and the ones it starts).
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path

from xtrain import builtin
from xtrain.errors import XtrainError, shown

PROBE_TIMEOUT_S = 3.0  # one HEAD to the hub: an answer comes in well under a second where it is reachable
# the files a downloaded model has besides config.json (one of them): its weights
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
_DRIVE = re.compile(r"^[A-Za-z]:")
_TRUE = ("1", "ON", "YES", "TRUE")  # huggingface_hub's spellings of a true variable


def is_repo_id(name: str) -> bool:
    """``name`` or ``org/name`` as huggingface_hub's ``validate_repo_id`` accepts them; anything
    written as a path (``./x``, ``/x``, ``~/x``, ``C:\\x``, ``a\\b``, ``a/b/c``) is not."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if name.startswith((".", "/", "~", "\\")) or "\\" in name or _DRIVE.match(name):
        return False
    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


@dataclass(frozen=True)
class Source:
    """Where the model is: ``kind`` is builtin | folder | cached (the hub cache holds it) | hub
    (to download); ``note``: a line to say (the hub unreachable, the cache used), or None."""

    kind: str
    note: str | None = None


def cached(repo_id: str, cache_dir: str | Path | None = None) -> bool:
    """The hub cache holds ``repo_id``'s config.json and weights (huggingface_hub's
    ``try_to_load_from_cache``: read on disk only)."""
    from huggingface_hub import try_to_load_from_cache

    def there(filename: str) -> bool:
        try:
            return isinstance(try_to_load_from_cache(repo_id, filename, cache_dir=cache_dir), str)
        except Exception:  # noqa: BLE001 - an unreadable cache is a cache without it
            return False

    return there("config.json") and any(there(f) for f in WEIGHT_FILES)


def offline_mode() -> bool:
    """huggingface_hub's offline mode (``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE``; the variable
    read again: it may be set after huggingface_hub was imported)."""
    from huggingface_hub import constants

    return constants.is_offline_mode() or os.environ.get("HF_HUB_OFFLINE", "").upper() in _TRUE


def unreachable(repo_id: str, timeout: float = PROBE_TIMEOUT_S, endpoint: str | None = None) -> str | None:
    """Why the hub cannot be reached for ``repo_id`` (one HEAD of its config.json, no retries), or
    None when it answered (whatever it answered: a missing or gated repository is the load's to
    say). Bounded by ``timeout`` (and a second more) as a whole: the request's own timeout does not
    cover a name lookup that hangs, so the request runs in a thread that is given up on."""
    said: list[str | None] = []
    probe = threading.Thread(target=lambda: said.append(_head(repo_id, timeout, endpoint)), daemon=True)
    probe.start()
    probe.join(timeout + 1.0)
    return said[0] if said else f"no answer within {timeout:g} s"


def _head(repo_id: str, timeout: float, endpoint: str | None) -> str | None:
    import httpx2
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    try:
        get_hf_file_metadata(hf_hub_url(repo_id, "config.json", endpoint=endpoint), timeout=timeout)
    except OfflineModeIsEnabled:
        return "HF_HUB_OFFLINE is set"
    except HfHubHTTPError:
        return None
    except (httpx2.TransportError, OSError) as e:
        return str(e).strip().splitlines()[0][:120] if str(e).strip() else type(e).__name__
    except Exception:  # noqa: BLE001 - any other answer: the hub is there
        return None
    return None


def go_offline() -> None:
    """huggingface_hub's offline mode from here on, in this process and the processes it starts:
    every load reads the cache and makes no network call (the hub could not be reached)."""
    from huggingface_hub import constants

    os.environ["HF_HUB_OFFLINE"] = "1"  # the workers this process starts inherit it
    constants.HF_HUB_OFFLINE = True  # read at import: this process, already importing it


def missing_line(name: str, why: str) -> XtrainError:
    """The one line for a hub model this machine cannot have: what is missing, how to get a copy."""
    return XtrainError(
        f"model {shown(name)} is not in the Hugging Face cache and the hub cannot be reached ({why})",
        f"download it where there is a network (`hf download {name}`, then copy the cache or the "
        "folder here) or set model.name_or_path to a local folder",
    )


def kind_of(name: str) -> str:
    """builtin | folder | repo (a hub id): what ``model.name_or_path`` names, from its spelling and
    this machine's disk alone. Raises the one line for a path that is not there or is a file."""
    if builtin.is_builtin(name):
        return "builtin"
    path = Path(name).expanduser()
    if path.is_dir():
        return "folder"
    if path.exists():
        raise XtrainError(
            f"model path {name} is a file, not a model folder",
            "point model.name_or_path at the folder holding config.json",
        )
    if not is_repo_id(name):
        raise XtrainError(
            f"model path {name} not found",
            "check model.name_or_path (relative paths are looked up next to the config file, "
            "then in the current folder)",
        )
    return "repo"


def locate(name: str, here: bool = True, timeout: float = PROBE_TIMEOUT_S) -> Source:
    """Where ``model.name_or_path`` is (``Source``), before anything loads it. Raises the one
    line for a local path that is not there (or is a file: ``kind_of``), and for a hub id neither
    in the cache nor reachable. ``here`` False (a plan for another machine): what this machine
    lacks is a note, not a refusal. Where the hub cannot be reached, this process goes offline
    (``go_offline``)."""
    try:
        kind = kind_of(name)
    except XtrainError as e:
        if here:
            raise
        return Source("folder", e.message.replace(" not found", " is not on this machine"))
    if kind != "repo":
        return Source(kind)
    have = cached(name)
    if offline_mode():  # the user's choice: the cache, or one line
        why = "HF_HUB_OFFLINE is set"
    else:
        why = unreachable(name, timeout)
        if why is None:
            return Source("cached" if have else "hub")
        go_offline()  # no load waits for the network: the cache or one line
        if have:
            said = f"the Hugging Face hub cannot be reached ({why}): {name} loads from its cache"
            return Source("cached", said)
    if have:
        return Source("cached")
    if not here:
        return Source("hub", missing_line(name, why).one_line())
    raise missing_line(name, why)
