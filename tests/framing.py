"""TFRecord framing read by the tests themselves, not by mpwatch: where each record of an event
file starts and how long it is (8-byte length, 4-byte masked CRC of the length, the data, 4-byte
masked CRC of the data), to damage a chosen record at a computed offset."""

from __future__ import annotations

import struct


def frame(data: bytes) -> list[tuple[int, int]]:
    """(start, total size) of each whole record, by the framing alone (not mpwatch's)."""
    out, pos = [], 0
    while pos + 12 <= len(data):
        (n,) = struct.unpack_from("<Q", data, pos)
        if pos + 16 + n > len(data):
            break
        out.append((pos, 16 + n))
        pos += 16 + n
    return out
