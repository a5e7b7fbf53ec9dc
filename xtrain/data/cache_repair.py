"""Damaged cache entries: Arrow files in ``datasets``' cache that no longer read whole.

A run's rows live in ``datasets``' cache as Arrow stream files: the data file's converted copy
(``csv-train.arrow``, next to its ``dataset_info.json``) and what was made from it (the encoded
rows, an eval split's indices: ``cache-<fingerprint>.arrow``). ``datasets`` writes each under a
temporary name and renames it once whole, but a file cut short afterwards (a full disk, a copy of
the cache cut off, a crash of the machine before the page cache reached the disk) stays in its
place, and every later run that reads it fails: the copy with "Expected to read 344 metadata
bytes", blamed on the user's data file; the encoded rows with a traceback.

``unreadable`` reads a file's stream headers as ``datasets`` does (memory-mapped, each message's
length checked against the file; the bodies are not copied), so a file it passes, ``datasets``
reads. ``drop_damaged`` removes the damaged ones and says so through the run's note channel
(``noting``: the run's reporter), and the caller makes them again: the data file converted,
the rows encoded. The user's own files are never touched.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

Noter = Callable[[str], None]
_noter: Noter | None = None


@contextlib.contextmanager
def noting(noter: Noter | None) -> Iterator[None]:
    """Repairs in the block are told to ``noter`` (the run's ``note``); library code prints nothing."""
    global _noter
    before, _noter = _noter, noter
    try:
        yield
    finally:
        _noter = before


def unreadable(path: Path) -> str | None:
    """Why the Arrow stream file at ``path`` does not read whole (cut short, not Arrow); None when
    it reads as ``datasets`` reads it."""
    import pyarrow as pa

    try:
        with pa.memory_map(str(path)) as source:
            pa.ipc.open_stream(source).read_all()
    except (OSError, pa.ArrowException, ValueError) as e:
        text = str(e).strip().splitlines()
        return text[0][:200] if text else type(e).__name__
    return None


def damaged(files: Iterable[Path]) -> list[tuple[Path, str]]:
    """The files among ``files`` that do not read whole, each with why."""
    return [(p, why) for p in files if p.is_file() and (why := unreadable(p)) is not None]


def drop_damaged(files: Iterable[Path], what: str, again: str, folder: Path | None = None) -> bool:
    """Remove the damaged files among ``files`` (``folder``: the whole folder instead, a data
    file's converted copy with its ``dataset_info.json``) and note it: "the datasets cache held a
    damaged file (...), ``what``: ``again``". True when something was removed."""
    found = damaged(files)
    if not found:
        return False
    path, why = found[0]
    more = f" and {len(found) - 1} more file{'s' * (len(found) > 2)}" if len(found) > 1 else ""
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)
    else:
        for p, _ in found:
            p.unlink(missing_ok=True)
    if _noter is not None:
        _noter(f"the datasets cache held a damaged file ({path}{more}: {why}), {what}: {again}")
    return True
