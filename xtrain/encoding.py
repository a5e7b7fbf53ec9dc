"""Reading text files the way Windows tools write them.

Windows PowerShell 5.1's ``>`` and ``Out-File`` write UTF-16 LE with a byte-order mark,
``Set-Content`` writes the ANSI code page (cp1252 on Western systems) without one, and editors
often write UTF-8 with a BOM. Files with a BOM are decoded by it; files without one must be UTF-8
(ASCII included). Anything else is refused with one line that names the file and how to re-save
it, rather than guessing a code page and training on mojibake.

Data files are handed to ``datasets`` by path, so those are transcoded once to a cached UTF-8 copy
(no BOM) when they are not plain UTF-8 already.
"""

from __future__ import annotations

import codecs
import hashlib
import os
from pathlib import Path

from xtrain import atomic
from xtrain.errors import XtrainError

# UTF-32 first: its LE mark starts with UTF-16 LE's.
BOMS: tuple[tuple[bytes, str], ...] = (
    (codecs.BOM_UTF32_LE, "utf-32-le"),
    (codecs.BOM_UTF32_BE, "utf-32-be"),
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)
CHUNK_BYTES = 16 << 20  # a data file is checked for UTF-8 in pieces of this size
CHUNK_CHARS = 1 << 20
SAVE_AS_UTF8 = (
    "save it as UTF-8: in PowerShell `Get-Content OLD | Set-Content -Encoding utf8 NEW` "
    "(or `Out-File -Encoding utf8`), in an editor Save as > Encoding UTF-8"
)


def detect_bom(head: bytes) -> tuple[str | None, int]:
    """(codec, BOM length) from a file's first bytes; (None, 0) without a BOM."""
    for bom, codec in BOMS:
        if head.startswith(bom):
            return codec, len(bom)
    return None, 0


def _utf16_without_bom(head: bytes) -> str | None:
    """ASCII text saved as UTF-16 without a BOM is valid UTF-8 full of NULs: recognise it."""
    sample = head[:512]
    if len(sample) < 4 or sample.count(0) < len(sample) // 4:
        return None
    if not any(sample[1::2]):
        return "utf-16-le"
    if not any(sample[0::2]):
        return "utf-16-be"
    return None


def not_utf8(
    path: Path | str, what: str, err: UnicodeDecodeError | None = None, base: int = 0
) -> XtrainError:
    """The one-line refusal for a file that is neither UTF-8 nor marked by a BOM (``base``: where
    the decoded piece starts in the file)."""
    at = ""
    if err is not None and isinstance(err.object, (bytes, bytearray)):
        at = f": byte 0x{err.object[err.start]:02x} at offset {base + err.start}"
    return XtrainError(
        f"{what} {path} is not UTF-8{at} (written in the ANSI code page, e.g. by Set-Content?)",
        SAVE_AS_UTF8,
    )


def decode(data: bytes, path: Path | str, what: str) -> str:
    """Text of a whole file: by its BOM, else strict UTF-8; one-line XtrainError otherwise."""
    codec, skip = detect_bom(data[:4])
    if codec is None:
        codec = _utf16_without_bom(data[:512])
    try:
        return data[skip:].decode(codec or "utf-8")
    except UnicodeDecodeError as e:
        raise not_utf8(path, what, e if codec is None else None) from None


def read_text(path: Path | str, what: str) -> str:
    """A text file (config, facts snapshot) as str, whichever of the usual encodings it has.

    OSError is left to the caller (each says what is missing in its own words)."""
    return decode(Path(path).read_bytes(), path, what)


def utf8_copy(path: Path, what: str, cache_dir: Path | None = None, whole: bool = True) -> Path:
    """``path`` itself when it is plain UTF-8, else a cached UTF-8 copy (BOM dropped).

    A BOM-less file is checked whole (in pieces; decoding runs at memory speed): datasets' JSON
    reader was seen here to load cp1252 bytes without an error, so its own check cannot be relied
    on. ``whole=False``: its first piece only (the data check reads the first rows; the run
    checks the rest)."""
    with open(path, "rb") as f:
        head = f.read(CHUNK_BYTES)
        codec, _ = detect_bom(head[:4])
        if codec is None:
            codec = _utf16_without_bom(head)
        if codec is None:
            decoder, done, chunk = codecs.getincrementaldecoder("utf-8")(), 0, head
            try:
                while chunk:
                    decoder.decode(chunk)
                    done += len(chunk)
                    chunk = f.read(CHUNK_BYTES) if whole else b""
                if whole:
                    decoder.decode(b"", final=True)
            except UnicodeDecodeError as e:
                raise not_utf8(path, what, e, base=done) from None
            return path
    return _transcode(path, codec, what, cache_dir)


def _cache_dir() -> Path:
    base = os.environ.get("XTRAIN_CACHE")
    return (Path(base) if base else Path.home() / ".cache" / "xtrain") / "utf8"


def _transcode(path: Path, codec: str, what: str, cache_dir: Path | None) -> Path:
    st = path.stat()
    key = hashlib.sha256(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{codec}".encode()).hexdigest()
    folder = cache_dir or _cache_dir()
    target = folder / f"{path.stem}.{key[:16]}{path.suffix}"
    if target.exists():
        return target
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")  # ranks may transcode at once
    try:
        folder.mkdir(parents=True, exist_ok=True)
        # "utf-8-sig" for UTF-8 with a BOM drops it; the UTF-16/32 codecs keep U+FEFF: strip it.
        src_codec = "utf-8-sig" if codec == "utf-8" else codec
        with (
            open(path, encoding=src_codec, newline="") as src,
            open(tmp, "w", encoding="utf-8", newline="") as dst,
        ):
            first = True
            while chunk := src.read(CHUNK_CHARS):
                if first:
                    chunk, first = chunk.removeprefix("\ufeff"), False
                dst.write(chunk)
        os.replace(tmp, target)
    except UnicodeDecodeError:
        tmp.unlink(missing_ok=True)
        raise XtrainError(
            f"{what} {path} is damaged: its {codec} text does not decode", SAVE_AS_UTF8
        ) from None
    except OSError as e:
        tmp.unlink(missing_ok=True)
        if refused := atomic.cannot_write(atomic.UTF8_COPIES, folder, e):  # read-only, full
            raise refused from None
        raise XtrainError(
            f"cannot write a UTF-8 copy of {path} to {folder}: {e.strerror or e}",
            "set XTRAIN_CACHE to a writable folder, or save the file as UTF-8",
        ) from None
    return target
