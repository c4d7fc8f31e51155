"""Rule ``loss-scale`` (mpwatch/judge/rules/loss_scale.py,
mpwatch/judge/evidence/scale_evidence.py).

Runs are built from gradient samples chosen here (tests/builders.py: grad_probe, scale_run); every
expected figure is numpy arithmetic on those samples (float16 rounding is numpy's, the sweep's
definition is |g|*S < 2^-24 / >= 2^16), and the dynamic scale is Keras' documented rule
(keras_scale_history, checked against Keras' own LossScaleOptimizer in test_apply.py). Each
proposal is verified the way the issue asks: it loses less when applied to the same gradients
(or, for the growth, to the same gradients over the run's steps under Keras' rule).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from builders import (
    assert_findings,
    f16_lost,
    findings_of,
    grad_probe,
    keras_scale_history,
    log_uniform,
    make_run,
    margin_scale,
    predicted,
    run_info,
    scale_run,
)

from mpwatch import contract
from mpwatch.judge import diagnose
from mpwatch.judge.evidence import scale_evidence as se

RULE = "loss-scale"
STEPS = range(1, 401)


def _no_overflow(step, scale):
    return False


def _loss_scale(run):
    """The rule's own findings (diagnose drops one whose action gradient-underflow already gives:
    tests/judge/test_diagnose.py)."""
    from mpwatch.judge.rules import loss_scale

    return loss_scale.check(run)


def _every_scale_proposed(findings):
    """Every initial scale any finding proposes (in its action, data or fix)."""
    out = set()
    for f in findings:
        if f.data.get("initial_scale") is not None:
            out.add(f.data["initial_scale"])
        if "initial_scale=" in f.fix:
            out.add(float(f.fix.split("initial_scale=")[1].split(")")[0].split(",")[0]))
    return out


def test_stuck_low_is_an_error():
    run = make_run(scalars={contract.LOSS_SCALE: {s: (1.0 if s > 50 else 1024.0) for s in STEPS}})
    assert_findings(_loss_scale(run), [{"severity": "error", "data": {"median_scale": 1.0}}])
    # no probe ran: its fix gets one (it names the layer), never findings the run does not have
    (f,) = _loss_scale(run)
    assert "probe_every=N" in f.fix and "activation-overflow" not in f.fix


# --- a larger scale that loses less: proposed, with its predicted figures, and verified ---------
def test_underflow_at_the_default_scale_proposes_a_larger_initial_scale_that_loses_less():
    # |g| log-uniform on [2^-45, 2^-13): at 2^15 everything below 2^-40 is lost (~15%)
    g = log_uniform(-45, -13)
    scales, skipped = keras_scale_history(400, _no_overflow)
    layers = {"dense": g[:10000], "dense_1": g[10000:]}
    run = scale_run([grad_probe(400, layers, scales[400])], scales, skipped)
    (f,) = _loss_scale(run)
    used = 2.0**15
    s = f.data["initial_scale"]
    k = math.log2(s)
    # never lower, never Keras' default (what the run used), a power of two
    assert s > used and k.is_integer()
    # the smallest scale whose predicted underflow is at most 0.1%, within what the probe allows
    # (its largest gradient 2 doublings below 65504)
    assert predicted(g, k)[0] <= se.UNDERFLOW_NEGLIGIBLE < predicted(g, k - 1)[0]
    assert s <= margin_scale(g, se.HEADROOM_BITS)
    assert float(np.max(np.abs(g))) * s <= 65504 / 4
    # the predicted figures the finding states are the sweep's definition on these gradients
    (row,) = [r for r in f.data["predicted"] if r["what"] == "initial_scale"]
    assert (row["underflow"], row["overflow"]) == predicted(g, k)
    assert row["overflow"] == 0.0
    # verified: in numpy's float16 the proposal loses less than a tenth of what 2^15 loses
    assert f16_lost(g, used) > 0.1
    assert f16_lost(g, s) < f16_lost(g, used) / 10
    assert f.severity == "warning"
    assert f"initial_scale={int(s)}" in f.fix and "dynamic_growth_steps" not in f.fix
    assert f.action == {"loss_scale": s, "dynamic_growth_steps": 2000}
    # gradient-underflow gives the same fix: one advice, not two
    (gu,) = findings_of(diagnose(run), "gradient-underflow")
    assert gu.fix == f.fix and gu.action == f.action


def test_immaterial_underflow_is_silence_whatever_the_recommended_scale():
    # the quick start: the probes recommend ~2^27, underflow at the scale used is 0.01%
    rng = np.random.default_rng(1)
    g = np.concatenate([log_uniform(-30, -20, 19998), log_uniform(-50, -45, 2)])
    rng.shuffle(g)
    scales, skipped = keras_scale_history(400, _no_overflow)
    run = scale_run([grad_probe(400, {"dense": g}, scales[400])], scales, skipped)
    assert f16_lost(g, 2.0**15) == pytest.approx(1e-4)
    assert margin_scale(g) >= 2.0**27
    assert _loss_scale(run) == []
    assert findings_of(diagnose(run), "gradient-underflow") == []
    assert se.advise(run).kind == "silent"


# --- the run's own overflows ---------------------------------------------------------------------
def _resnet_like(lo_log2):
    """9 skips at the start bring 2^15 to 64 (as on ResNet50); a probe at step 30 at scale 64."""
    scales, skipped = keras_scale_history(30, lambda s, S: s <= 9)
    assert scales[30] == 64.0 and sum(skipped.values()) == 9
    g = log_uniform(lo_log2, -8)
    return scale_run([grad_probe(30, {"dense": g}, scales[30])], scales, skipped), g


def test_after_the_descent_to_64_immaterial_underflow_proposes_nothing():
    run, g = _resnet_like(-30)
    assert f16_lost(g, 64.0) < 0.01
    found = diagnose(run)
    assert _loss_scale(run) == []
    assert all("loss_scale" not in f.action for f in found)
    assert not any("32768" in f.fix for f in found)


def test_after_the_descent_to_64_no_initial_scale_at_or_above_an_overflowed_one():
    run, g = _resnet_like(-38)  # material underflow at 64
    assert f16_lost(g, 64.0) > 0.1
    found = diagnose(run)
    (f,) = findings_of(found, RULE)
    # 2^15 .. 128 overflowed at the start: no initial scale at or above 128 (nor the default)
    assert _every_scale_proposed(found) == set()
    assert "initial_scale" not in f.fix
    # the scale must climb back instead: faster growth, toward a level the probe allows
    g_steps = f.data["dynamic_growth_steps"]
    assert g_steps is not None and se.MIN_GROWTH_STEPS <= g_steps < 2000
    assert f"dynamic_growth_steps={g_steps}" in f.fix
    t = f.data["target_scale"]
    assert t > 64 and t <= margin_scale(g, se.HEADROOM_BITS)
    assert predicted(g, math.log2(t))[0] <= se.UNDERFLOW_NEGLIGIBLE
    assert f16_lost(g, t) < f16_lost(g, 64.0) / 10


def test_a_later_overflow_bars_every_scale_at_or_above_it():
    # the scale doubled to 2^16 at step 2000 and overflowed at once: 2^16 is out, and the
    # gradients would need more to stop losing: no single scale fits
    def over(step, scale):
        return scale >= 2.0**16

    scales, skipped = keras_scale_history(2400, over)
    assert skipped[2001] == 1.0 and scales[2400] == 2.0**15
    g = log_uniform(-45, -13)  # the probe allows 2^26, the need is 2^21
    run = scale_run([grad_probe(2400, {"dense": g}, scales[2400])], scales, skipped)
    found = diagnose(run)
    (f,) = findings_of(found, RULE)
    assert _every_scale_proposed(found) == set()
    assert f.data["dynamic_growth_steps"] is None and f.data["kind"] == "range"
    assert "2^16 (65536) at step 2001" in f.evidence  # the largest that overflowed, and when
    assert f.data["max_overflow_scale"] == 2.0**16


# --- gradients that shrink faster than the scale grows ------------------------------------------
def _shrinking(t):
    """The gradients at step t: |g| log-uniform on [2^-28, 2^-2) times 2^(-t/125) (8 doublings
    smaller every 1000 steps)."""
    return log_uniform(-28, -2, seed=t) * np.float32(2.0 ** (-t / 125))


def test_gradients_shrinking_faster_than_the_scale_grows_propose_dynamic_growth_steps():
    n = 3000
    # Keras' default rule on this run: 2^15, doubled once at step 2000
    scales, skipped = keras_scale_history(n, lambda s, S: S * 2.0 ** (-2 - s / 125) >= 2.0**16)
    assert scales[n] == 2.0**16 and sum(skipped.values()) == 0
    probes = [grad_probe(t, {"dense": _shrinking(t)}, scales[t]) for t in (1000, 2000, 3000)]
    run = scale_run(probes, scales, skipped)
    (f,) = _loss_scale(run)
    growth = f.data["dynamic_growth_steps"]
    assert growth is not None and se.MIN_GROWTH_STEPS <= growth < 2000
    initial = f.data["initial_scale"] or 2.0**15
    # an initial scale, when proposed, is within what every probe allows
    assert all(initial <= margin_scale(_shrinking(t), 2) for t in (1000, 2000, 3000))
    # the need rises 8 doublings per 1000 steps: one doubling per 125 steps at least
    assert growth <= 125

    # verified under Keras' rule on the same gradients: the proposal loses far less by step 3000,
    # at the cost of few skipped steps
    def over(s, S):
        return S * 2.0 ** (-2 - s / 125) >= 2.0**16

    new_scales, new_skipped = keras_scale_history(n, over, initial=initial, growth=growth)
    before = f16_lost(_shrinking(n), scales[n])
    after = f16_lost(_shrinking(n), new_scales[n])
    assert before > 0.3 and after < 0.01
    assert sum(new_skipped.values()) <= 10 + n / growth
    # every stated prediction is the sweep's definition on the latest probe's gradients
    for r in f.data["predicted"]:
        assert (r["underflow"], r["overflow"]) == predicted(_shrinking(n), math.log2(r["scale"]))


def test_an_initial_scale_is_capped_by_every_probe_not_only_the_last():
    # the first probe's gradients are 8 doublings larger than the last's
    scales, skipped = keras_scale_history(1000, _no_overflow)
    early = log_uniform(-37, -5, seed=1)
    late = log_uniform(-45, -13, seed=2)
    probes = [grad_probe(100, {"dense": early}, scales[100]),
              grad_probe(1000, {"dense": late}, scales[1000])]  # fmt: skip
    (f,) = _loss_scale(scale_run(probes, scales, skipped))
    assert f.data["initial_scale"] == margin_scale(early, 2) < margin_scale(late, 2)
    # the rest of the way by growth: the need rose 8 doublings in 900 steps
    assert f.data["dynamic_growth_steps"] <= 900 / 8


# --- no single scale fits -----------------------------------------------------------------------
def _wide(info=None):
    """Gradients over 50 doublings: layer 'tiny' at [2^-60, 2^-40), 'big' at [2^-30, 2^-10)."""
    scales, skipped = keras_scale_history(400, _no_overflow)
    layers = {"tiny": log_uniform(-60, -40, 10000), "big": log_uniform(-30, -10, 10000, seed=3)}
    probe = grad_probe(400, layers, scales[400])
    return scale_run([probe], scales, skipped, info=info), layers


def test_no_single_scale_fits_names_the_layers_to_keep_float32():
    run, layers = _wide(run_info("mixed_float16", tc=False))
    g = np.concatenate(list(layers.values()))
    found = diagnose(run)
    (f,) = findings_of(found, RULE)
    assert f.data["kind"] == "range"
    # the best allowed scale still loses a material share (numpy: 2^23 loses ~32%) ...
    best = margin_scale(g, se.HEADROOM_BITS)
    assert predicted(g, math.log2(best))[0] > 0.3
    # ... but less than 2^15 (50%): proposed, with its figures, and verified in float16
    assert _every_scale_proposed(found) == {best}
    assert f.data["predicted_underflow"] == predicted(g, math.log2(best))[0]
    assert f16_lost(g, best) < f16_lost(g, 2.0**15) - 0.1
    # the layer whose gradients no scale reaches: keep it float32; that leaves ~0 model-wide
    assert f16_lost(layers["tiny"], 2.0**15) == 1.0 and f16_lost(layers["big"], 2.0**15) == 0.0
    assert f.data["layers"] == ["tiny"] and f.action["float32_layers"] == ["tiny"]
    assert f.data["underflow_with_layers_float32"] == 0.0
    assert "'tiny'" in f.fix and "mixed_bfloat16" not in f.fix  # a CPU: no bfloat16 advice
    assert "50 doublings" in f.evidence and "float16 holds 40" in f.evidence


def test_no_single_scale_fits_names_bfloat16_where_the_gpu_has_it():
    run, _ = _wide(run_info("mixed_float16", tc=True))  # an A100, compute capability 8.0
    (f,) = findings_of(diagnose(run), RULE)
    assert 'set_global_policy("mixed_bfloat16")' in f.fix
    assert "policy" not in f.action  # an alternative in the fix, not applied with the layers


def test_a_lower_scale_is_never_proposed_even_when_the_probe_recommends_one():
    # the sigmoid MLP: 33% lost at 2^15 while the probe's margin allows only 2^14
    g = np.concatenate([log_uniform(-60, -40, 6600), log_uniform(-20, -1, 13400, seed=4)])
    scales, skipped = keras_scale_history(400, _no_overflow)
    run = scale_run([grad_probe(400, {"dense": g}, scales[400])], scales, skipped)
    assert margin_scale(g, 2) < 2.0**15 and f16_lost(g, 2.0**15) == pytest.approx(0.33)
    found = diagnose(run)
    assert all(s > 2.0**15 for s in _every_scale_proposed(found))
    assert all(f.action.get("loss_scale", 2.0**15) >= 2.0**15 for f in found)


def test_an_unreliable_probe_carries_no_finding():
    g = log_uniform(-45, -13)
    scales, skipped = keras_scale_history(400, _no_overflow)
    probe = grad_probe(400, {"dense": g}, scales[400], reliable=False)
    run = scale_run([probe], scales, skipped)
    assert _loss_scale(run) == []
    assert findings_of(diagnose(run), "gradient-underflow") == []


def test_growth_steps_floor_is_the_skipped_steps_warning_rate():
    from mpwatch.judge.rules import skipped_steps

    assert se.MIN_GROWTH_STEPS * skipped_steps.SKIP_RATE_WARN == 1
    assert skipped_steps.WARMUP_STEPS == se.START_STEPS


# --- a GAN's own LossScaleOptimizers: the compiled one never stepped ----------------------------
def _gan_run(d_scale, g_scale):
    run = make_run(scalars={contract.LOSS_SCALE: {s: 32768.0 for s in STEPS}})  # the idle one's

    def opt(name, compiled, iterations, scale):
        return {"name": name, "class": "LossScaleOptimizer(Adam)", "compiled": compiled,
                "loss_scaled": True, "iterations_start": 0, "iterations": iterations,
                "loss_scale": scale}  # fmt: skip

    run.train_step = {"has_call": False, "optimizers": [
        opt("optimizer", True, 0, 32768.0), opt("d_optimizer", False, 60, d_scale),
        opt("g_optimizer", False, 20, g_scale),
    ]}  # fmt: skip
    return run


def test_a_gans_own_optimizer_whose_scale_collapsed_is_an_error_and_the_idle_series_is_not():
    (f,) = _loss_scale(_gan_run(2.0**-3, 2.0**14))
    assert f.severity == "error" and f.data["optimizers"] == {"d_optimizer": 0.125}
    assert "'d_optimizer'" in f.title and "g_optimizer" not in f.title
    assert "compiled optimizer never stepped" in f.evidence


def test_a_gans_own_optimizers_at_healthy_scales_give_nothing():
    assert _loss_scale(_gan_run(2.0**11, 2.0**14)) == []
