"""Protocol-buffer wire format: the one varint decoder that mpwatch's hand-written decoders share
(``read/tfrecord.py``'s fast event decoder and ``profile/xplane.py``'s trace reader; neither
imports TensorFlow's generated classes).

Example:
    >>> varint(bytes([0xAC, 0x02, 0x07]), 0)
    (300, 2)
"""

from __future__ import annotations


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
