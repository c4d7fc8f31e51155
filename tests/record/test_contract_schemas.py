"""Every record real fits write validates against ``contract.PAYLOAD_SCHEMAS`` (JSON Schema).

The event files are parsed independently of mpwatch (conftest ``read_events``: TensorBoard's loader,
zlib + JSON by hand) and each record is validated with ``jsonschema``. Fits:

- ``quickstart_logdir`` (session): the quick start CNN under ``mixed_float16`` with the monitor's
  defaults: run_info, layers, grad_variables, a float16 probe against a float32 twin, a profile;
- a small ``mixed_bfloat16`` fit (no loss scale: a ``notice``; a bfloat16 probe, which has no sweep
  and no recommended scale);
- a ``float32`` fit (a pre-flight probe: what mixed_float16 would do);
- a pure ``bfloat16`` fit (16-bit variables: the ``updates`` record of updates lost to rounding);
- a ``mixed_float16`` model with a user layer that cannot compute in float32 (no float32 reference:
  a probe with ``reference: "none"``, ``model.zero_fraction``, a histogram of the mixed gradients,
  a notice).

Together they must cover every record kind and every probe mode.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest

from mpwatch import contract

jsonschema = pytest.importorskip("jsonschema")


class Float16Only(keras.layers.Layer):
    """A user's layer that refuses to compute in float32: the probe's float32 pass cannot run."""

    def call(self, x):
        if x.dtype != "float16":
            raise TypeError(f"Float16Only wants float16, got {x.dtype}")
        return x


class Opaque(keras.Model):
    """A subclassed model whose float32 pass fails (a float16-only user layer)."""

    def __init__(self, thing, **kwargs):
        super().__init__(**kwargs)
        self.thing = thing
        self.hidden = keras.layers.Dense(8, activation="relu")
        self.only16 = Float16Only()
        self.out = keras.layers.Dense(2)

    def call(self, x):
        return self.out(self.only16(self.hidden(x)))


def _fit(logdir, policy_name, build):
    import mpwatch

    keras.mixed_precision.set_global_policy(policy_name)
    try:
        keras.utils.set_random_seed(0)
        rng = np.random.default_rng(0)
        x = rng.normal(size=(32, 6)).astype("float32")
        y = rng.normal(size=(32, 2)).astype("float32")
        model = build()
        model.compile(keras.optimizers.SGD(0.01), "mse")
        monitor = mpwatch.MixedPrecisionMonitor(log_dir=logdir, log_every=2, profile=False)
        model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[monitor])
    finally:
        keras.mixed_precision.set_global_policy("float32")
    return logdir


def _sequential():
    return keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(8, activation="relu"),
            keras.layers.LayerNormalization(),
            keras.layers.Dense(2, dtype="float32"),
        ]
    )


@pytest.fixture(scope="module")
def extra_logdirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("schemas")
    return {
        "bfloat16": _fit(str(root / "bf16"), "mixed_bfloat16", _sequential),
        "preflight": _fit(str(root / "f32"), "float32", _sequential),
        "pure_bfloat16": _fit(str(root / "pure_bf16"), "bfloat16", _sequential),
        "no_twin": _fit(str(root / "opaque"), "mixed_float16", lambda: Opaque(object())),
    }


@pytest.fixture(scope="module")
def all_records(quickstart_logdir, extra_logdirs, read_events):
    """(fit, kind, step, payload) of every record of every fit."""
    out = []
    for fit, logdir in {"quickstart": quickstart_logdir, **extra_logdirs}.items():
        _, records = read_events(logdir)
        for kind, items in records.items():
            out += [(fit, kind, step, payload) for step, payload in items]
    return out


def test_every_record_of_real_fits_validates(all_records):
    validators = {
        kind: jsonschema.Draft202012Validator(schema)
        for kind, schema in contract.PAYLOAD_SCHEMAS.items()
    }
    bad = []
    for fit, kind, step, payload in all_records:
        assert kind in contract.RECORD_KINDS, (fit, kind)
        for err in validators[kind].iter_errors(payload):
            bad.append(f"{fit} {kind}@{step} {list(err.absolute_path)}: {err.message[:200]}")
    assert not bad, "\n".join(bad[:20])


def test_the_fits_cover_every_kind_and_every_probe_mode(all_records):
    kinds = {kind for _, kind, _, _ in all_records}
    assert kinds == set(contract.RECORD_KINDS)
    probes = [(fit, p) for fit, kind, _, p in all_records if kind == contract.KIND_PROBE]
    assert {p["mode"] for _, p in probes} == {"float16", "bfloat16", "preflight"}
    assert {p["reference"] for _, p in probes} == {"float32_twin", "none"}
    assert {p["histogram"]["source"] for _, p in probes} == {"reference", "mixed_unscaled"}
    assert {p["model_kind"] for _, p in probes} >= {"sequential", "subclassed"}
    by_fit = {fit: p for fit, p in probes}
    assert by_fit["bfloat16"]["sweep"]["data"] == [] and by_fit["bfloat16"]["loss_scale"] is None
    assert "max_abs_ref_grad" in by_fit["quickstart"]["model"]
    assert "zero_fraction" in by_fit["no_twin"]["model"]
    profiles = [p for _, kind, _, p in all_records if kind == contract.KIND_PROFILE]
    assert profiles and all(p["layers"]["data"] for p in profiles)  # a real table, typed per cell
    notices = [p for _, kind, _, p in all_records if kind == contract.KIND_NOTICE]
    assert {n["level"] for n in notices} == {"info"}  # nothing failed in these fits


def test_every_key_written_is_in_the_schema(all_records):
    """additionalProperties is true (forward compatibility), so a writer adding a key would pass
    validation unnoticed: check that every key the fits wrote is named by the schema."""

    def unknown(schema, value, path):
        if not isinstance(value, dict) or "properties" not in schema:
            return []
        out = [f"{path}.{k}" for k in value if k not in schema["properties"]]
        for k, sub in schema["properties"].items():
            if k in value and isinstance(sub, dict):
                out += unknown(sub, value[k], f"{path}.{k}")
        return out

    missing = set()
    for fit, kind, _, payload in all_records:
        missing |= {f"{fit}: {p}" for p in unknown(contract.PAYLOAD_SCHEMAS[kind], payload, kind)}
    assert not missing, sorted(missing)


def test_a_wrongly_typed_record_from_a_real_fit_fails(all_records):
    """The schema is not vacuous: real payloads with one value of the wrong type are rejected."""
    import copy

    (layers, *_) = [p for _, kind, _, p in all_records if kind == contract.KIND_LAYERS]
    v = jsonschema.Draft202012Validator(contract.PAYLOAD_SCHEMAS[contract.KIND_LAYERS])
    assert v.is_valid(layers)
    broken = copy.deepcopy(layers)
    broken["layers"]["data"][0][contract.LAYERS_COLUMNS.index("params")] = "many"
    assert not v.is_valid(broken)
    (info, *_) = [p for _, kind, _, p in all_records if kind == contract.KIND_RUN_INFO]
    v = jsonschema.Draft202012Validator(contract.PAYLOAD_SCHEMAS[contract.KIND_RUN_INFO])
    assert v.is_valid(info)
    assert not v.is_valid({**info, "num_replicas": 1.5})
    assert not v.is_valid({**info, "device": {**info["device"], "tensor_cores": "yes"}})
    assert not v.is_valid({k: val for k, val in info.items() if k != "policy"})
