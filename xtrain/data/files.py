"""Which ``datasets`` builder reads a data file, and its text opened as that builder reads it.

A file's format comes from its extension (``EXTENSIONS``), read through a compression suffix
(``.jsonl.gz``, ``.csv.bz2``, ``.json.xz``: ``datasets`` decompresses these itself). ``open_text``
opens a file, compressed or not, for the few reads xtrain makes of its own (a CSV's header, the
line of a JSON-lines file that does not parse).
"""

from __future__ import annotations

from pathlib import Path
from typing import IO

EXTENSIONS = {
    ".json": "json",
    ".jsonl": "json",
    ".csv": "csv",
    ".tsv": "csv",
    ".parquet": "parquet",
    ".pq": "parquet",
    ".txt": "text",
    ".text": "text",
    ".arrow": "arrow",
}
COMPRESSIONS = (".gz", ".bz2", ".xz")  # the ones ``datasets`` reads through and Python's stdlib opens


def compression(path: Path) -> str | None:
    """The compression suffix of ``path`` (``.gz``), None for a plain file."""
    suffix = path.suffix.lower()
    return suffix if suffix in COMPRESSIONS else None


def format_suffix(path: Path) -> str:
    """The extension that names the format, behind a compression suffix: ``.jsonl`` for
    ``rows.jsonl.gz``."""
    return (path.with_suffix("") if compression(path) else path).suffix.lower()


def builder_of(path: Path) -> str | None:
    """The ``datasets`` builder for ``path``'s extension (None: the extension names none)."""
    return EXTENSIONS.get(format_suffix(path))


def open_text(
    path: Path, encoding: str = "utf-8", errors: str | None = None, newline: str | None = None
) -> IO[str]:
    """``path`` opened as text, through its compression."""
    import bz2
    import gzip
    import lzma

    opener = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}.get(compression(path) or "")
    if opener is None:
        return open(path, encoding=encoding, errors=errors, newline=newline)
    return opener(path, "rt", encoding=encoding, errors=errors, newline=newline)  # type: ignore[return-value]
