"""Records over contract.MAX_RECORD_BYTES: the writer splits any kind with tables into parts at one
step (record/runtime/writer.py: split_payload), the reader joins them back. Parts are checked with
the independent event parser (conftest ``read_events``), the join against the rows that were
written.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from builders import LAYER_COLUMNS, layer_rows, probe_payload

from mpwatch import contract
from mpwatch import read as reader
from mpwatch.read import assemble
from mpwatch.record.runtime.writer import RunWriter, split_payload

LIMIT = 4096  # small enough that a few hundred rows split


def _layers_payload(n: int, seed: int = 0) -> dict:
    base = layer_rows()
    params = np.random.default_rng(seed).integers(1, 10**7, n).tolist()
    rows = []
    for i in range(n):
        r = list(base[i % len(base)])
        r[0], r[1], r[9], r[10] = f"layer_{i}", f"model/block_{i // 10}/layer_{i}", params[i], i
        rows.append(r)
    return {"layers": contract.table(LAYER_COLUMNS, rows)}


def _grad_payload(n: int, rng: np.random.Generator) -> dict:
    rows = [
        [f"block_{i // 2}/{'kernel' if i % 2 else 'bias'}", f"model/block_{i // 2}", 64, 0.0,
         float(rng.random() * 1e-3), 0.0, float(rng.random()), float(rng.random() * 20)]
        for i in range(n)
    ]  # fmt: skip
    table = contract.table(contract.GRAD_VARIABLE_COLUMNS, rows)
    return {"loss_scale": 32768.0, "variables": table}


def _big_probe(n: int, rng: np.random.Generator) -> dict:
    p = probe_payload(10, 1024.0)
    p["variables"]["data"] = [
        [f"dense_{i}/kernel", f"dense_{i}", 100, 90, 1, 1 / 90, float(rng.random()), 0.5]
        for i in range(n)
    ]
    return p


def _frame(table: dict) -> pd.DataFrame:
    """What the reader should make of a table: built here by pandas from the rows written."""
    return pd.DataFrame(table["data"], columns=table["columns"])


def _check_parts(parts: list[dict], original: dict, limit: int) -> None:
    """Head first with every key, continuation parts numbered 1.., each under the limit, rows of
    each table in order."""
    n = len(parts)
    assert n >= 2
    assert [p.get("part") for p in parts] == list(range(n))
    assert all(p["parts"] == n for p in parts)
    assert set(original) <= set(parts[0])
    for p in parts:
        assert len(contract.encode_payload(p)) <= limit
    for p in parts[1:]:
        tables = [k for k in p if k not in ("part", "parts")]
        assert len(tables) == 1, tables  # a continuation part holds rows of one table
    for key, value in original.items():
        if isinstance(value, dict) and "columns" in value:
            rows = [r for p in parts if key in p for r in p[key]["data"]]
            assert rows == value["data"], key
            assert all(p[key]["columns"] == value["columns"] for p in parts if key in p)
        else:
            assert parts[0][key] == value, key


# --- split_payload --------------------------------------------------------------------------------
def test_a_payload_that_fits_is_one_record():
    payload = {"a": np.float32(1.5), "t": contract.table(["x"], [[np.int64(1)]])}
    ((p, blob),) = split_payload(payload)
    assert p == {"a": 1.5, "t": {"columns": ["x"], "data": [[1]]}} and "part" not in p
    assert blob == contract.encode_payload(payload)


@pytest.mark.parametrize("limit", [1500, LIMIT, 8000])
def test_split_parts_are_under_the_limit_and_join_back(limit):
    rng = np.random.default_rng(0)
    payload = _big_probe(600, rng)
    parts = split_payload(payload, limit=limit)
    _check_parts([p for p, _ in parts], payload, limit)
    assert all(blob == contract.encode_payload(p) for p, blob in parts)
    # the small tables stay in the head: only the big one moves
    assert {k for p, _ in parts[1:] for k in p} == {"part", "parts", "variables"}
    assert parts[0][0]["layers"] == payload["layers"] and parts[0][0]["variables"]["data"] == []
    joined, problem = assemble._merge_parts([p for p, _ in parts])
    assert problem is None and joined == contract.json_safe(payload, nonfinite="keep")


@pytest.mark.parametrize("seed, limit", [(505, 430), (2078, 340)])
def test_parts_stay_under_the_limit_when_part_numbers_grow_the_compressed_size(seed, limit):
    """Parts are sized with placeholder part numbers; for these payloads the real numbers make
    one part a byte longer compressed (zlib is not monotonic in its input), which once failed a
    real fit's gradient record. The split must still hold every part under the limit."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(20, 200))
    rows = [[f"v{i}", float(rng.normal()), int(rng.integers(0, 1000))] for i in range(n)]
    payload = {"loss_scale": float(rng.normal()), "t": contract.table(["name", "x", "n"], rows)}
    assert int(rng.integers(300, 700)) == limit  # the same draws that found the case
    parts = split_payload(payload, limit=limit)
    assert len(parts) > 2 and max(len(blob) for _, blob in parts) <= limit
    joined, problem = assemble._merge_parts([p for p, _ in parts])
    assert problem is None and joined == contract.json_safe(payload, nonfinite="keep")


def test_several_large_tables_are_split_each_in_order():
    rng = np.random.default_rng(1)
    payload = _big_probe(300, rng)
    payload["layers"]["data"] = [
        [f"l{i}", 10, 0, 0.0, float(rng.random()), 0.1, 3.0, 14.0, 0.0, 0] for i in range(300)
    ]
    parts = [p for p, _ in split_payload(payload, limit=LIMIT)]
    _check_parts(parts, payload, LIMIT)
    tables = [next(k for k in p if k not in ("part", "parts")) for p in parts[1:]]
    # one table's parts, then the other's, in the payload's order of keys
    assert tables == sorted(tables, key=["variables", "layers"].index)
    assert {"variables", "layers"} == set(tables)


def test_what_cannot_be_split_raises():
    rng = np.random.default_rng(6)

    def noise(n: int) -> str:  # incompressible text
        return rng.bytes(n).hex()

    with pytest.raises(ValueError, match="no table"):
        split_payload({"message": noise(5000)}, limit=1000)
    with pytest.raises(ValueError, match="one row"):
        split_payload({"t": contract.table(["s"], [[noise(900)] for _ in range(9)])}, limit=1000)
    with pytest.raises(ValueError, match="without its tables"):
        split_payload({"blob": noise(5000), "t": contract.table(["x"], [[1]] * 9)}, limit=1000)


# --- through event files: every kind with tables -------------------------------------------------
@pytest.fixture
def small_limit(monkeypatch):
    monkeypatch.setattr(contract, "MAX_RECORD_BYTES", LIMIT)
    return LIMIT


def test_every_table_kind_is_split_on_disk_and_joined_on_read(tmp_path, small_limit, read_events):
    rng = np.random.default_rng(2)
    layers = _layers_payload(400)
    grads = _grad_payload(800, rng)
    probe = _big_probe(500, rng)
    w = RunWriter(str(tmp_path))
    sizes = {
        contract.KIND_LAYERS: w.record(contract.KIND_LAYERS, 1, layers),
        contract.KIND_GRAD_VARIABLES: w.record(contract.KIND_GRAD_VARIABLES, 10, grads),
        contract.KIND_PROBE: w.record(contract.KIND_PROBE, 10, probe),
    }
    w.close()
    _, records = read_events(str(tmp_path))
    for kind, payload in (
        (contract.KIND_LAYERS, layers),
        (contract.KIND_GRAD_VARIABLES, grads),
        (contract.KIND_PROBE, probe),
    ):
        parts = [p for _, p in records[kind]]
        assert len({s for s, _ in records[kind]}) == 1  # all at one step
        _check_parts(parts, payload, small_limit)
        assert sizes[kind] == sum(len(contract.encode_payload(p)) for p in parts)
    run = reader.load_run(str(tmp_path))
    assert run.warnings == []
    pd.testing.assert_frame_equal(run.layers, _frame(layers["layers"]))
    assert len(run.layer_history) == 1
    gv = run.grad_variables
    pd.testing.assert_frame_equal(
        gv.drop(columns=["step", "loss_scale"]), _frame(grads["variables"])
    )
    assert set(gv["step"]) == {10} and set(gv["loss_scale"]) == {32768.0}
    pd.testing.assert_frame_equal(
        run.probe_variables.drop(columns=["step"]), _frame(probe["variables"])
    )
    assert len(run.probe_model) == 1 and run.probe_model["mode"].tolist() == ["float16"]
    assert run.latest_probe().histogram == probe["histogram"]
    assert "part" not in run.records[contract.KIND_PROBE][0][1]
    assert "parts" not in run.records[contract.KIND_PROBE][0][1]


def test_a_split_record_cut_short_is_a_warning(tmp_path, small_limit):
    rng = np.random.default_rng(3)
    grads = _grad_payload(800, rng)
    parts = [p for p, _ in split_payload(grads)]
    assert len(parts) >= 3
    w = RunWriter(str(tmp_path))
    for p in parts[:-1]:  # the writer was killed before the last part
        w.record(contract.KIND_GRAD_VARIABLES, 5, p)
    w.close()
    run = reader.load_run(str(tmp_path), warn=False)
    want = sum(len(p["variables"]["data"]) for p in parts[:-1])
    assert len(run.grad_variables) == want
    (msg,) = run.warnings
    assert "grad_variables record at step 5" in msg and f"of {len(parts)}" in msg


def test_a_resume_rewriting_a_split_record_replaces_it(small_limit):
    first = [p for p, _ in split_payload(_layers_payload(500))]
    again = _layers_payload(300, seed=1)
    second = [p for p, _ in split_payload(again)]
    records = {contract.KIND_LAYERS: [(7, p) for p in first + second]}
    run = reader.run_from_records(".", scalars={}, records=records)
    assert len(second) >= 2 and run.warnings == []
    pd.testing.assert_frame_equal(run.layers, _frame(again["layers"]))


def test_run_from_records_sees_what_the_data_provider_kept(small_limit):
    """The plugin builds its Run from TensorBoard's data provider: with every part (the Python
    multiplexer keeps them) the record is whole; with only the last part of a step (RustBoard
    keeps one value per tag and step) the table has only that part's rows, and the Run says so."""
    rng = np.random.default_rng(5)
    probe = _big_probe(500, rng)
    parts = [p for p, _ in split_payload(probe)]
    whole = reader.run_from_records(".", scalars={}, records={"probe": [(3, p) for p in parts]})
    assert whole.warnings == [] and len(whole.probe_variables) == 500
    last = reader.run_from_records(".", scalars={}, records={"probe": [(3, parts[-1])]})
    assert len(last.probe_variables) == len(parts[-1]["variables"]["data"]) < 500
    assert pd.isna(last.probe_model["loss_scale"].iloc[0])  # the head's keys are lost
    assert last.latest_probe().histogram is None
    (msg,) = last.warnings
    assert f"parts [{len(parts) - 1}] of {len(parts)}" in msg
