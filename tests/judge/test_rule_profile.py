"""Rule ``profile`` (mpwatch/judge/rules/profile.py) on constructed Runs."""

from __future__ import annotations

import pandas as pd
import pytest
from builders import (
    assert_findings,
    findings_of,
    graph_row,
    layer_rows,
    make_run,
    model_row,
    profile_payload,
    run_info,
)

from mpwatch import contract
from mpwatch.judge import diagnose

RULE = "profile"


def _casts_low_16bit_and_a_float32_layer(tc=True):
    prof = profile_payload()  # cast share 20%, 16-bit share 30%
    layers = layer_rows("mixed_float16")
    layers[1][4:6] = ["float32", "float32"]  # dense under a float32 policy
    prof["layers"]["data"][1][3] = 3000.0  # 30% of the time in float32
    return make_run(layers=layers, profile=prof, info=run_info("mixed_float16", tc=tc))


def _clean():
    prof = profile_payload()
    ok = dict(prof, cast_share=0.05, share_16bit=0.9)
    ok["layers"] = {"columns": prof["layers"]["columns"], "data": []}
    return make_run(profile=ok)


CASES = [
    pytest.param(
        _casts_low_16bit_and_a_float32_layer(),
        [
            {"severity": "warning", "title_has": "Cast", "layer": None},
            {"severity": "warning", "title_has": "16 bits", "layer": None},
            # conv2d's float32 time is not flagged: it is mixed already
            {"severity": "info", "layer": "dense"},
        ],
        id="casts-16bit-share-and-a-float32-layer",
    ),
    pytest.param(
        _casts_low_16bit_and_a_float32_layer(tc=False),
        [{"severity": "warning", "title_has": "Cast", "layer": None}],
        id="on-a-cpu-no-advice-to-move-layers-to-16-bits",
    ),
    pytest.param(_clean(), [], id="clean-profile"),
    pytest.param(make_run(), [], id="no-profile"),
]


# --- the Cast advice never says float16 for integer ids (issue 24) -------------------------------
def _text_model(graph=True, probe_ids=False):
    """Token ids 'ids' -> Embedding -> pooling -> Dense, a profile with 20% of the time in Casts;
    ``graph``: the layers record has its graph columns; ``probe_ids``: the probe found a float
    input 'tokens' integer-valued (and no graph says where the ids go)."""
    rows = [
        graph_row("emb", "Embedding", dims={"output_dim": 32}, width=32, inputs=["ids"]),
        graph_row("pool", "GlobalAveragePooling1D", width=32, inputs=["emb"]),
        graph_row("out", dims={"units": 1}, act="sigmoid", width=1, inputs=["pool"], out=True,
                  dtype="float32"),
    ]  # fmt: skip
    # on a CPU: the Cast finding alone (no advice to move layers to 16 bits)
    run = make_run(layers=rows, profile=profile_payload(), info=run_info(tc=False))
    if not graph:
        run.layers = run.layers.drop(columns=contract.LAYERS_GRAPH_COLUMNS)
    if probe_ids:
        run.layers = run.layers[run.layers["class"] != "Embedding"]
        run.probe_model = pd.DataFrame([{"step": 10, **model_row()}])
        run.records[contract.KIND_PROBE] = [(10, {})]
        row = ["tokens", "float32", 640, True, 4000.0, ["tok_emb"], "float16", 900]
        run.probe_inputs = pd.DataFrame(
            [[10, *row]], columns=["step", *contract.PROBE_INPUT_COLUMNS]
        )
    return run


ID_FIX = 'inputs = keras.Input(shape=..., dtype="int32")'
CASES += [
    pytest.param(
        _text_model(),
        [{"title_has": "Cast", "fix_has": ("the integer ids ('ids') stay int32", ID_FIX)}],
        id="ids-fed-to-an-embedding-stay-int32",
    ),
    pytest.param(
        _text_model(graph=False),
        [{"title_has": "Cast", "fix_has": ("the integer ids ('ids') stay int32", ID_FIX)}],
        id="older-record-an-embedding-means-ids",
    ),
    pytest.param(
        _text_model(probe_ids=True),
        [{"title_has": "Cast", "fix_has": ("the integer ids ('tokens') stay int32", ID_FIX)}],
        id="ids-the-probe-found-integer-valued",
    ),
    pytest.param(
        _casts_low_16bit_and_a_float32_layer(tc=False),
        [
            {
                "title_has": "Cast",
                "fix_has": (
                    "float features may be fed as float16",
                    "integer ids stay int32: keras.Input(",
                ),
            }
        ],
        id="no-ids-float-features-only",
    ),  # fmt: skip
]


@pytest.mark.parametrize(("run", "expected"), CASES)
def test_profile(run, expected):
    assert_findings(findings_of(diagnose(run), RULE), expected)


@pytest.mark.parametrize(
    "run", [_text_model(), _text_model(graph=False), _text_model(probe_ids=True)]
)
def test_no_fix_feeds_ids_as_float16(run):
    fixes = [f.fix or "" for f in diagnose(run)]
    assert fixes and not any("fed as float16" in x or "feed float16" in x for x in fixes), fixes
