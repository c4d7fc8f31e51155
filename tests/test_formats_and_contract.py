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


# --- payload schemas ------------------------------------------------------------------------------
def _validator(kind):
    jsonschema = pytest.importorskip("jsonschema")
    schema = contract.PAYLOAD_SCHEMAS[kind]
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_every_kind_has_a_valid_schema_and_every_table_its_column_types():
    assert set(contract.PAYLOAD_SCHEMAS) == set(contract.RECORD_KINDS)
    for kind in contract.RECORD_KINDS:
        _validator(kind)
    pairs = [
        (contract.LAYERS_COLUMNS, contract.LAYERS_COLUMN_TYPES),
        (contract.GRAD_VARIABLE_COLUMNS, contract.GRAD_VARIABLE_COLUMN_TYPES),
        (contract.PROBE_VARIABLE_COLUMNS, contract.PROBE_VARIABLE_COLUMN_TYPES),
        (contract.PROBE_LAYER_COLUMNS, contract.PROBE_LAYER_COLUMN_TYPES),
        (contract.PROBE_SWEEP_COLUMNS, contract.PROBE_SWEEP_COLUMN_TYPES),
        (contract.PROFILE_LAYER_COLUMNS, contract.PROFILE_LAYER_COLUMN_TYPES),
        (contract.PROFILE_OP_TYPE_COLUMNS, contract.PROFILE_OP_TYPE_COLUMN_TYPES),
        (contract.PROFILE_KERNEL_LAYER_COLUMNS, contract.PROFILE_KERNEL_LAYER_COLUMN_TYPES),
        (contract.PROFILE_KERNEL_COLUMNS, contract.PROFILE_KERNEL_COLUMN_TYPES),
    ]
    for columns, types in pairs:
        assert list(types) == columns


def test_the_profile_contract_names_the_classifiers_precisions():
    from mpwatch.profile import kernel_patterns

    assert contract.PROFILE_PRECISIONS == kernel_patterns.PRECISIONS
    v = _validator(contract.KIND_PROFILE)
    old = {  # a record written before the kernel keys: still valid, its source derived
        "steps": [3, 5], "device": "CPU", "total_us": 1.0, "unattributed_us": 0.0,
        "unattributed_by_category": {}, "cast_us": 0.0, "cast_share": 0.0, "share_16bit": 0.5,
        "layers": contract.table(contract.PROFILE_LAYER_COLUMNS, []),
        "op_types": contract.table(contract.PROFILE_OP_TYPE_COLUMNS, []),
        "trace_dir": "x", "side": "host", "tool": "framework_op_stats", "bits_rule": "",
        "layers_dropped": 0,
    }  # fmt: skip
    assert v.is_valid(old) and contract.profile_source(old) == "host_ops"
    assert contract.profile_source({**old, "side": "device"}) == "device_ops"
    assert not v.is_valid({**old, "source": "device_kernels"})  # the kernel keys must come too
    assert not v.is_valid({**old, "source": "gpu"})


def _grad_record(rows=None):
    rows = rows if rows is not None else [["d/kernel", "d", 4, 0.5, 0.0, 0.0, 1.0, 15.9]]
    return {"loss_scale": 1024.0, "variables": contract.table(contract.GRAD_VARIABLE_COLUMNS, rows)}


def test_a_schema_is_not_vacuous():
    v = _validator(contract.KIND_GRAD_VARIABLES)
    assert v.is_valid(_grad_record())
    # non-finite numbers are numbers (NaN for an empty variable, Infinity headroom at max_abs 0)
    assert v.is_valid(_grad_record([["d/bias", "d", 0, math.nan, math.nan, 0.0, 0.0, math.inf]]))
    wrong = [
        {"variables": _grad_record()["variables"]},  # loss_scale missing
        {**_grad_record(), "loss_scale": "1024"},  # a string, not a number
        _grad_record([["d/kernel", "d", "4", 0.5, 0.0, 0.0, 1.0, 15.9]]),  # size a string
        _grad_record([["d/kernel", "d", 4, 0.5, 0.0, 0.0, 1.0]]),  # a cell missing
        _grad_record([["d/kernel", None, 4, 0.5, 0.0, 0.0, 1.0, 15.9]]),  # layer None
        {**_grad_record(), "variables": contract.table(["variable"], [["x"]])},  # other columns
    ]
    for payload in wrong:
        assert not v.is_valid(payload), payload
    notice = _validator(contract.KIND_NOTICE)
    assert notice.is_valid({"part": "probe", "level": "info", "message": "m", "later": 1})
    assert not notice.is_valid({"part": "probe", "level": "loud", "message": "m"})
    assert not notice.is_valid({"part": 1, "level": "info", "message": "m"})


def test_split_parts_validate_and_a_continuation_needs_only_part_and_parts():
    from mpwatch.record.runtime.writer import split_payload

    v = _validator(contract.KIND_GRAD_VARIABLES)
    rows = [[f"v{i}/kernel", f"v{i}", i, 0.1, 0.0, 0.0, float(i), 3.0] for i in range(300)]
    parts = [p for p, _ in split_payload(_grad_record(rows), limit=1500)]
    assert len(parts) > 2
    for p in parts:
        assert v.is_valid(p), list(v.iter_errors(p))[:1]
    assert "loss_scale" not in parts[1]
    assert not v.is_valid({"part": 1, "variables": parts[1]["variables"]})  # parts missing
    assert not v.is_valid({**parts[0], "part": -1})
    head = dict(parts[0])
    del head["loss_scale"]  # the head is a whole record
    assert not v.is_valid(head)


def test_probe_schema_knows_what_each_mode_writes():
    v = _validator(contract.KIND_PROBE)
    model = {
        "ref_nonzero": 10, "underflow_count": 1, "underflow_fraction": 0.1,
        "grad_rel_error": 1e-3, "max_abs_activation": 3.0, "first_nonfinite_layer": None,
        "size": 12, "nonfinite": 0, "loss": 1.0, "ref_loss": 1.0,
        "activation_headroom_bits": 14.0,
    }  # fmt: skip
    payload = {
        "mode": "bfloat16", "loss_scale": None, "reference": "float32_twin",
        "reference_note": None, "model_kind": "sequential",
        "variables": contract.table(contract.PROBE_VARIABLE_COLUMNS, []),
        "layers": contract.table(contract.PROBE_LAYER_COLUMNS, []),
        "model": model,
        "histogram": {"edges_log2": [-3, -2], "counts": [4], "zeros": 0,
                      "window_log2": [-133.0, 127.9], "source": "reference"},
        "sweep": contract.table(contract.PROBE_SWEEP_COLUMNS, []),
        "recommended_scale": None,
    }  # fmt: skip
    assert v.is_valid(payload)
    float16 = {**payload, "mode": "float16", "loss_scale": 1024.0}
    assert not v.is_valid(float16)  # float16: the recommended scale's inputs are required
    assert v.is_valid({**float16, "model": {**model, "max_abs_ref_grad": 2.0, "margin_bits": 4}})
    assert not v.is_valid({**payload, "reference": "none"})  # then model.zero_fraction
    assert v.is_valid({**payload, "reference": "none", "model": {**model, "zero_fraction": 0.5}})


def test_the_contract_imports_no_heavy_module():
    import subprocess
    import sys

    code = (
        "import sys, mpwatch.contract; "
        "heavy = [m for m in ('numpy', 'pandas', 'jsonschema', 'tensorflow') if m in sys.modules]; "
        "print(heavy); sys.exit(1 if heavy else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_key_and_column_is_described_and_required_keys_are_known():
    def undescribed(schema, path):
        out = []
        for key, sub in schema.get("properties", {}).items():
            if key == "columns":
                continue
            if key != "data" and not sub.get("description"):
                out.append(f"{path}.{key}")
            out += undescribed(sub, f"{path}.{key}")
        for i, cell in enumerate(schema.get("prefixItems", [])):
            if not cell.get("description"):
                out.append(f"{path}[{i}]")
        if isinstance(schema.get("items"), dict):
            out += undescribed(schema["items"], f"{path}[]")
        return out

    missing = []
    for kind, schema in contract.PAYLOAD_SCHEMAS.items():
        assert schema["description"]
        missing += undescribed(schema, kind)
    # sub-keys of small objects (device.name, versions.keras, ...) speak for themselves
    assert all(m.count(".") >= 2 for m in missing), [m for m in missing if m.count(".") < 2]
    assert contract.required_keys(contract.KIND_GRAD_VARIABLES) == ["loss_scale", "variables"]
    assert "model_kind" in contract.required_keys(contract.KIND_PROBE)
    assert contract.required_keys(contract.KIND_NOTICE) == ["part", "level", "message"]
