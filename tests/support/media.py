"""Media files for bad-input tests, written by hand so they are what their headers say."""

from __future__ import annotations

import struct
import zlib


def png_declaring(width: int, height: int) -> bytes:
    """A PNG whose header says ``width`` x ``height`` (8-bit gray) over a few bytes of data: a
    decompression bomb of any size in about 60 bytes."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    data = chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0")) + chunk(b"IEND", b"")
    return b"\x89PNG\r\n\x1a\n" + data
