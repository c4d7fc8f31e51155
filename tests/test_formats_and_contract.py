"""Facts of the formats against numpy, and the record encoding of the contract."""

from __future__ import annotations

import json
import math
import zlib

import numpy as np
import pytest

from mpwatch import contract, formats


def test_float16_facts_match_numpy():
    info = np.finfo(np.float16)
    assert formats.FLOAT16.max == float(info.max)
    assert formats.FLOAT16.smallest_normal == float(info.tiny)
    assert formats.FLOAT16.smallest_subnormal == float(info.smallest_subnormal)
    # the smallest subnormal survives, half of it rounds to zero
    assert np.float16(formats.FLOAT16.smallest_subnormal) != 0
    assert np.float16(formats.FLOAT16.smallest_subnormal / 2) == 0


def test_float32_facts_match_numpy():
    info = np.finfo(np.float32)
    assert formats.FLOAT32.max == float(info.max)
    assert formats.FLOAT32.smallest_normal == float(info.tiny)


def test_headroom_bits():
    assert formats.headroom_bits(65504.0) == 0.0
    assert formats.headroom_bits(65504.0 / 8) == pytest.approx(3.0)
    assert formats.headroom_bits(0.0) == math.inf
    assert formats.headroom_bits(math.inf) == -math.inf


def test_format_of_rejects_unknown():
    assert formats.format_of("mixed_bfloat16") is formats.BFLOAT16
    with pytest.raises(ValueError, match="float16, bfloat16 and float32"):
        formats.format_of("int8")


def test_payload_roundtrip_is_plain_zlib_json():
    payload = {"a": np.float32(1.5), "t": contract.table(["x"], [[np.int64(3)]]), "inf": math.inf}
    blob = contract.encode_payload(payload)
    # independent decoding: zlib + json, no mpwatch
    raw = json.loads(zlib.decompress(blob))
    assert raw == {"a": 1.5, "t": {"columns": ["x"], "data": [[3]]}, "inf": math.inf}
    assert contract.decode_payload(blob) == raw


def test_corrupt_payload_and_metadata_are_clear_errors():
    with pytest.raises(ValueError, match="corrupt mpwatch record"):
        contract.decode_payload(b"not zlib")
    with pytest.raises(ValueError, match="upgrade mpwatch"):
        contract.parse_metadata_content(b'{"schema": 999, "kind": "layers"}')
    with pytest.raises(ValueError, match="unknown mpwatch record kind"):
        contract.record_tag("nope")


def test_tags_are_namespaced():
    for tag in contract.SCALAR_TAGS:
        assert tag.startswith(contract.PREFIX)
    for kind in contract.RECORD_KINDS:
        assert contract.kind_of_tag(contract.record_tag(kind)) == kind
