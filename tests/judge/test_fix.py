"""mpwatch/judge/fixes/fix.py: one reading of a finding's advice, and the check that what a finding
prints is what applying it does."""

from __future__ import annotations

from mpwatch.judge import Finding
from mpwatch.judge.fixes.fix import Fix, disagreement, printed_layers


def test_an_action_round_trips_through_the_fix():
    action = {"dtype": "float32", "float32_layers": ["d1", "d2"], "output": True}
    f = Finding("gradient-underflow", "warning", "t", "e", layer="d1", action=action)
    fix = Fix.of(f)
    assert fix.float32_layers == ("d1", "d2") and dict(fix.extra) == {"output": True}
    assert Fix.of(Finding("x", "info", "t", "e", layer="d1", action=fix.action())) == fix
    # the key the fix checks once wrote is still read (old findings' data)
    old = Finding(
        "x", "info", "t", "e", layer="d1", action={"dtype": "float32", "layers": ["d1", "d2"]}
    )
    assert Fix.of(old).float32_layers == ("d1", "d2")


def test_printed_layers_reads_constructor_and_get_layer_code_not_comments():
    code = (
        'keras.layers.Dense(..., dtype="float32", name="d1")  # keep \'d1\' in float32\n'
        'for sub in model.get_layer("block")._flatten_layers():  # it and all under it\n'
        '    sub.dtype_policy = "float32"\n'
        '# keras.layers.Dense(..., dtype="float32", name="commented")\n'
        'model.get_layer("d3").dtype_policy = "float32"'
    )
    assert printed_layers(code) == ["d1", "block", "d3"]


def test_a_finding_that_prints_more_layers_than_it_applies_disagrees():
    code = ('keras.layers.Dense(..., dtype="float32", name="d1")\n'
            'keras.layers.Dense(..., dtype="float32", name="d2")')  # fmt: skip
    f = Finding("activation-overflow", "error", "t", "e", fix=code, layer="d1",
                action={"dtype": "float32"})  # fmt: skip
    assert disagreement(f) == "prints ['d1', 'd2'] in float32, applies ['d1']"
    f.action = Fix.of(f).with_layers(["d1", "d2"]).action()
    assert disagreement(f) is None
