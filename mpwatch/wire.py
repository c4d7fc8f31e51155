"""Protocol-buffer wire format and TFRecord framing: the varint decoder of mpwatch's hand-written
event decoder (``read/tfrecord.py``: it reads only the few fields of an event it needs, without
TensorFlow's generated classes), and the masked crc32c that frames every record of an event file
(``read/tfrecord.py`` checks it, ``record/runtime/writer.py`` writes it).

Example:
    >>> varint(bytes([0xAC, 0x02, 0x07]), 0)
    (300, 2)
    >>> hex(masked_crc32c(b"123456789"))  # crc32c's check value 0xE3069283, masked
    '0xc78ab0e5'
"""

from __future__ import annotations

import struct
from typing import Any


def varint(buf: bytes, i: int, error: type[Exception] = ValueError) -> tuple[int, int]:
    """The unsigned varint at ``buf[i]`` and the position after it; ``error`` (a ValueError by
    default) when it is cut off or longer than protobuf's 10 bytes."""
    result = shift = 0
    while True:
        if i >= len(buf):
            raise error("truncated varint")
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, i
        shift += 7
        if shift > 63:
            raise error("varint too long")


# --- TFRecord's masked crc32c ---------------------------------------------------------------------
def _crc32c_table() -> tuple[int, ...]:
    poly = 0x82F63B78  # Castagnoli, reflected
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ poly if c & 1 else c >> 1
        table.append(c)
    return tuple(table)


#: crc32c's byte table (the reader's vectorized check uses it over many records at once)
CRC32C_TABLE = _crc32c_table()

try:  # C implementation when installed (it comes with google-cloud libraries, often with TF)
    import google_crc32c as _gcrc

    _C_CRC = True

    def crc32c(data: bytes) -> int:
        """CRC-32C (Castagnoli) of ``data``."""
        return int(_gcrc.value(bytes(data)))

except ImportError:  # pragma: no cover - depends on the environment
    _C_CRC = False

    def crc32c(data: bytes) -> int:
        """CRC-32C (Castagnoli) of ``data``."""
        table, crc = CRC32C_TABLE, 0xFFFFFFFF
        for b in data:
            crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
        return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    """TFRecord's masked crc32c: the crc rotated right by 15 bits plus ``0xA282EAD8``."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def put_varint(value: int) -> bytes:
    """``value`` (>= 0) as a protobuf varint.

    >>> put_varint(300).hex()
    'ac02'
    """
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def masked_crc32c_many(datas: list[bytes]) -> list[int]:
    """:func:`masked_crc32c` of each of ``datas``: in C one by one when ``google_crc32c`` is
    installed; else the records of one length together, a table-driven crc vectorized over them
    with numpy (the per-byte Python loop costs ~10 us for a scalar event's 80 bytes)."""
    if _C_CRC or len(datas) < 8:
        return [masked_crc32c(d) for d in datas]
    import numpy as np

    out = [0] * len(datas)
    by_length: dict[int, list[int]] = {}
    for i, d in enumerate(datas):
        by_length.setdefault(len(d), []).append(i)
    for length, idx in by_length.items():
        if len(idx) < 4:
            for i in idx:
                out[i] = masked_crc32c(datas[i])
            continue
        rows = np.frombuffer(b"".join(datas[i] for i in idx), np.uint8).reshape(len(idx), length)
        for i, v in zip(idx, masked_crc32c_rows(rows).tolist()):
            out[i] = v
    return out


_np_table: Any = None


def masked_crc32c_rows(rows: Any) -> Any:
    """Masked crc32c of each row of a uint8 matrix (numpy; vectorized over rows, a table lookup
    per column)."""
    import numpy as np

    global _np_table
    if _np_table is None:
        _np_table = np.array(CRC32C_TABLE, dtype=np.uint32)
    crc = np.full(rows.shape[0], 0xFFFFFFFF, dtype=np.uint32)
    for k in range(rows.shape[1]):
        crc = _np_table[(crc ^ rows[:, k]) & 0xFF] ^ (crc >> np.uint32(8))
    crc = crc ^ np.uint32(0xFFFFFFFF)
    return (((crc >> np.uint32(15)) | (crc << np.uint32(17))) + np.uint32(0xA282EAD8)).astype(
        np.uint32
    )


def frame_records(datas: list[bytes]) -> bytes:
    """:func:`frame_record` of each of ``datas``, joined (the crcs computed together)."""
    heads = [struct.pack("<Q", len(d)) for d in datas]
    crcs = masked_crc32c_many(heads + list(datas))
    n = len(datas)
    pack = struct.Struct("<I").pack
    return b"".join(
        h + pack(crcs[i]) + d + pack(crcs[n + i]) for i, (h, d) in enumerate(zip(heads, datas))
    )


def frame_record(data: bytes) -> bytes:
    """One TFRecord: ``u64 length, u32 masked crc32c(length), data, u32 masked crc32c(data)``."""
    return frame_records([data])
