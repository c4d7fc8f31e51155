"""The in-graph tap on Keras' JAX backend: the same per-batch facts as the TensorFlow tap
(:class:`mpwatch.record.tap.tf_tap.Tap`), from inside the jitted train step.

Under JAX, Keras' train step is a pure function of its state ``(trainable, non_trainable,
optimizer, metrics)`` variables, jitted with the state donated; it reaches the optimizer through
``optimizer.stateless_apply(optimizer_variables, grads, trainable_variables)``. The tap:

- **carries its ring buffers in the state**, appended to the *optimizer_variables* list of the
  state Keras builds (``model._get_jax_state`` is wrapped on the model instance). They are not
  optimizer variables: ``optimizer.variables`` (what checkpoints save) is unchanged, and Keras'
  ``jax_state_sync`` zips ``optimizer.variables`` with the state, so it never sees them. The
  buffers leave every train-function call as outputs (device arrays; no host transfer) and come
  back as the next call's inputs, like the optimizer's own ``iterations``;
- **wraps** ``optimizer.stateless_apply`` on the instance: it takes its buffers off the end of the
  list, calls the real one, and from the values before and after it writes into the ring slot of
  this batch: the loss scale after the step, the scale the gradients were scaled with, whether the
  update was skipped (``iterations`` did not advance), and every ``grad_every`` steps the
  per-variable gradient counts (:func:`mpwatch.record.tap.stats.jax_counts_table`);
- is **read on the host** from ``model._jax_state``, which Keras sets after every train-function
  call, once per read interval (:meth:`mpwatch.record.runtime.state.ModelState.collect`): ``count``
  (the step of the last batch written) only grows (the host cannot reset device state it does not
  feed back), so the batches since the last read are ``count - last count``; the gradient-counts
  tables have their own small ring, each with its step, and only new ones are fetched. The step is
  data in the buffers, never a constant in the trace, so a later fit reuses the trace.

With ``steps_per_execution > 1`` Keras runs several train steps in one call, each through
``stateless_apply``, so each batch has its slot (the ring holds a read interval plus one call).
Keras rebuilds its state from the variables at each epoch's start (and after a callback's
``jax_state_sync``): the wrapper of ``_get_jax_state`` first picks up the buffers as the last step
left them.
Under a ``keras.distribution`` (``DataParallel``, ``ModelParallel``), Keras jits the train step
with the state's shardings as its output shardings (``model._get_state_sharding_spec``): the tap
adds its buffers' there too, each **replicated** over the distribution's device mesh (scalars and
small rings; every device holds the same values, so the host reads one copy, which also works
where the mesh spans several processes). The gradient counts are reductions over the gradients
as the step has them (replicated under data parallelism, sharded like their variables under a
layout map: XLA reduces the shards where they are; no variable is gathered). They run only every
``grad_every`` steps (:data:`COUNTS_WAYS`: on a GPU in a second program run at those steps only,
:mod:`mpwatch.record.tap.jax_programs`; elsewhere under a ``lax.cond``); the rings' other writes are
local to each device.
With several JAX processes (``jax.distributed``) every process runs the same tap in the same
program and reads its own copy of the replicated buffers at the same steps (no collective: the
read interval is the same everywhere); only process 0 writes. The buffers are made on the mesh by
a jitted function (a ``device_put`` from the host compares the processes' values, and the NaN a
ring starts with never equals itself).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import numpy as np

from mpwatch.record.runtime.backend import host
from mpwatch.record.tap import lost_updates, stats, step_decision
from mpwatch.record.tap.tap_common import (
    TAP_COUNTS,
    Collected,
    TapBase,
    counts_entries,
    from_ring,
    input_health,
)

logger = logging.getLogger("mpwatch")

_BUFFERS = (
    "count", "scale", "scale_used", "skipped", "in_max", "in_bad", "ccount", "cstep", "counts",
)  # fmt: skip


#: the ways the tap computes the gradient counts (:attr:`JaxTap.counts_way`):
#:
#: - ``"apart"`` (on a GPU): in a second program, run only at the count steps
#:   (:mod:`mpwatch.record.tap.jax_programs`); the every-step program has no counts at all;
#: - ``"cond"`` (on a CPU or TPU, and where the train step is not jitted by Keras' ``jax.jit``):
#:   under a ``lax.cond`` in the one program, computed at the count steps only;
#: - ``"select"``: computed at every step and kept at the count steps (``jnp.where``).
#:
#: On a GPU both one-program ways cost every step: XLA's GPU runtime runs a conditional by copying
#: its predicate to the host (``ConditionalThunk``), and a select launches the counts' kernels
#: (a few reductions per variable) each time. Measured on an H200 with jax 0.11.2 (2026-11-27,
#: keras.io's Transformer, bfloat16, batch 64, a step bound by the host, best of 2 rounds that
#: differed by up to 25%): plain 1.45 ms a step, conditional 1.67, select 1.72, no counts 1.49.
#: ``benchmarks/gpu_cost.py`` measures each way (``mpwatch-cond``, ``mpwatch-select``, ``mpwatch``).
COUNTS_WAYS = ("apart", "cond", "select")

#: on a GPU where the train step cannot be jitted twice, models of at most this many trainable
#: elements select their counts (a few tens of microseconds of a recent GPU's time), larger ones
#: take the conditional
SELECT_MAX_ELEMENTS = 20_000_000


def counts_way(model: Any, rebuild: bool = True) -> str:
    """How the tap computes the gradient counts for ``model`` (see :data:`COUNTS_WAYS`;
    ``rebuild`` False: a custom training loop, which jits its own step);
    :attr:`JaxTap.counts_way` decides instead when set."""
    from mpwatch.record.tap.jax_programs import why_not

    if JaxTap.counts_way is not None:
        if JaxTap.counts_way == "apart" and why_not(model, rebuild) is not None:
            return "cond"
        return JaxTap.counts_way
    import jax

    try:
        if jax.default_backend() != "gpu":
            return "cond"
    except Exception:  # noqa: BLE001
        return "cond"
    if why_not(model, rebuild) is None:
        return "apart"
    size = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
    return "select" if size <= SELECT_MAX_ELEMENTS else "cond"


def _replicated(dist: Any) -> Any:
    """A sharding that puts the same whole array on every device of ``dist``'s mesh."""
    from jax.sharding import NamedSharding, PartitionSpec

    return NamedSharding(dist.device_mesh.backend_mesh, PartitionSpec())


def _elements(t: Any) -> int:
    return int(np.prod(np.shape(t))) if t is not None else 0


def _index_of(items: list[Any], target: Any) -> int | None:
    """Position of ``target`` in ``items`` by identity (Keras variables compare elementwise)."""
    for i, item in enumerate(items):
        if item is target:
            return i
    return None


class JaxTap(TapBase):
    """The JAX backend's tap; the interface :class:`~mpwatch.record.runtime.state.ModelState` uses
    is that of the TensorFlow :class:`~mpwatch.record.tap.tf_tap.Tap` (``install``, ``uninstall``,
    ``read``, ``set_step``, ``current_step``). See the module docstring."""

    #: one of :data:`COUNTS_WAYS`, whatever the device (:func:`counts_way`); None: decided by the
    #: device and the model
    counts_way: str | None = None

    def __init__(self, model: Any, capacity: int, grad_every: int | None, start_step: int) -> None:
        super().__init__(model, capacity, grad_every, start_step)
        self._step = int(start_step)  # the batch step of the last batch read
        self._read_count = int(start_step)  # the count (step) of the last batch read
        self._read_ccount = 0  # counts tables written before the last read
        self._values: list[Any] | None = None  # the buffers' latest values (device arrays)
        self._installed = False
        self._way = "cond"  # how the gradient counts are computed (counts_way)
        self._programs: Any = None  # the two programs of the "apart" way (jax_programs)
        # per thread: the way of the trace running there, and the batch's input health between
        # the train step's wrapper and the optimizer's (the counting program traces on a thread)
        self._local = threading.local()

    # --- the buffers --------------------------------------------------------------------------
    def _initial_values(self, step: int) -> list[Any]:
        """The buffers at ``step``, on the device. Made on the host and copied once: a
        ``jnp.zeros`` or ``jnp.full`` of a new shape is a program XLA compiles (on a GPU tens of
        milliseconds each, in the fit's first step)."""
        import jax

        values = self._zeros(step)
        sharding = getattr(self, "_sharding", None)
        if sharding is None:
            return list(jax.device_put(values))
        # made on every device of the mesh (a device_put from the host would compare the
        # processes' values, and NaN never equals itself)
        made = jax.jit(lambda: [jax.numpy.asarray(v) for v in values], out_shardings=sharding)
        return list(made())

    def _zeros(self, step: int) -> list[np.ndarray]:
        cap, nv, k = self.capacity, self._num_vars or 0, self.count_slots
        return [
            np.asarray(step, np.int32),  # count: the step of the last batch written
            np.zeros((cap,), np.float32),  # scale after the step
            np.zeros((cap,), np.float32),  # scale used
            np.zeros((cap,), np.float32),  # skipped
            np.full((cap,), np.nan, np.float32),  # input max |x|
            np.full((cap,), np.nan, np.float32),  # input non-finite count
            np.zeros((), np.int32),  # ccount: gradient-counts tables ever written
            np.zeros((k,), np.int32),  # cstep: the step of each counts slot
            np.zeros((k, nv, TAP_COUNTS), np.float32),  # gradient and update counts
        ]

    # --- installation -------------------------------------------------------------------------
    @property
    def installed(self) -> bool:
        return self._installed

    def install(self) -> None:
        import keras

        dist = keras.distribution.distribution()
        self._sharding = _replicated(dist) if dist is not None else None
        model, opt = self.model, self.optimizer
        if not hasattr(model, "_get_jax_state") or not hasattr(opt, "stateless_apply"):
            self.failed = "this Keras version has no _get_jax_state/stateless_apply to tap"
            self._installed = True
            return
        if not opt.built and model.built and model.trainable_variables:
            opt.build(model.trainable_variables)
        tvs = list(model.trainable_variables)
        self._num_vars = len(tvs) if self.grad_every else 0
        self._way = counts_way(model, self.rebuild) if self.grad_every else "cond"
        self.variable_names = [getattr(v, "path", None) or v.name for v in tvs]
        if self._way == "apart":
            from mpwatch.record.tap.jax_programs import TwoPrograms

            self._programs = TwoPrograms(self, model, self._step)
        self._restart(self._step)
        self._clean_fn = model.train_function
        self._wrap()
        if self.rebuild:
            if self._programs is not None:
                self._programs.install()
            else:
                model.make_train_function(force=True)
            self._sync()

    @property
    def way(self) -> str:
        """How this tap computes the gradient counts (one of :data:`COUNTS_WAYS`)."""
        return self._way

    @property
    def programs(self) -> Any:
        """The two programs of the ``"apart"`` way (:class:`mpwatch.record.tap.jax_programs.
        TwoPrograms`), or None."""
        return self._programs

    def tracing_counts(self, way: str) -> Any:
        """A context: traces on this thread compute the counts ``way`` ("none": not at all)."""
        from mpwatch.record.tap.jax_programs import tracing

        return tracing(self._local, way)

    def _sync(self) -> None:
        """The state Keras feeds the next call was built without the buffers: write it back to
        the variables, then have Keras build it again (with them)."""
        self.model.jax_state_sync()
        self.model._jax_state_synced = True

    def _restart(self, step: int) -> None:
        self._step = self._read_count = int(step)
        self._read_ccount = 0
        self._values = self._initial_values(step)
        if self._programs is not None:
            self._programs.restart(step)

    def resume(self, step: int) -> None:
        super().resume(step)
        self._sync()

    def _wrap(self) -> None:
        model, opt = self.model, self.optimizer
        orig_state, orig_apply = model._get_jax_state, opt.stateless_apply
        tap = self

        def get_jax_state(*args: Any, **kwargs: Any) -> Any:
            tap._latest()  # the buffers as the last step left them (reads are once per interval)
            state = orig_state(*args, **kwargs)
            return tap._extend_state(state, args, kwargs)

        def stateless_apply(optimizer_variables: Any, grads: Any, trainable_variables: Any) -> Any:
            return tap._apply(orig_apply, optimizer_variables, grads, trainable_variables)

        orig_sync = model.jax_state_sync

        def jax_state_sync(*args: Any, **kwargs: Any) -> Any:
            # Keras writes its state back to the variables, the buffers aside (and a fit that
            # raises then drops that state): take the buffers first, or the tap would keep
            # arrays that later steps were given (donated), and the next fit would fail on them
            tap._latest()
            return orig_sync(*args, **kwargs)

        get_jax_state._mpwatch_tap = True  # type: ignore[attr-defined]
        stateless_apply._mpwatch_tap = True  # type: ignore[attr-defined]
        jax_state_sync._mpwatch_tap = True  # type: ignore[attr-defined]
        object.__setattr__(model, "_get_jax_state", get_jax_state)
        object.__setattr__(opt, "stateless_apply", stateless_apply)
        object.__setattr__(model, "jax_state_sync", jax_state_sync)
        if self._sharding is not None and hasattr(model, "_get_state_sharding_spec"):
            orig_spec = model._get_state_sharding_spec

            def get_state_sharding_spec() -> Any:
                # Keras' train step's output shardings: the buffers' too (replicated)
                t, n, o, m = orig_spec()
                return t, n, list(o) + [tap._sharding] * len(_BUFFERS), m

            get_state_sharding_spec._mpwatch_tap = True  # type: ignore[attr-defined]
            object.__setattr__(model, "_get_state_sharding_spec", get_state_sharding_spec)
        if self.rebuild:  # a custom training loop has no train_step of Keras' to see
            orig_step = model.train_step

            def train_step(state: Any, data: Any) -> Any:
                tap._local.pending_input = None
                try:
                    tap._local.pending_input = input_health(data)
                except Exception as e:  # noqa: BLE001  (an input mpwatch cannot read)
                    logger.debug("mpwatch: no input health for this batch: %r", e)
                return tap.watch_scale_loss(lambda: orig_step(state, data))

            train_step._mpwatch_tap = True  # type: ignore[attr-defined]
            object.__setattr__(model, "train_step", train_step)
        self._installed = True

    def uninstall(self) -> None:
        if not self._installed:
            return
        model, opt = self.model, self.optimizer
        for obj, attr in (
            (model, "_get_jax_state"), (opt, "stateless_apply"), (model, "train_step"),
            (model, "_get_state_sharding_spec"), (model, "jax_state_sync"),
        ):  # fmt: skip
            if getattr(obj.__dict__.get(attr), "_mpwatch_tap", False):
                object.__delattr__(obj, attr)
        self._installed = False
        if self.rebuild:
            model.train_function = None  # a later fit traces a clean one

    def set_step(self, step: int) -> None:
        self._step = int(step)

    def current_step(self) -> int:
        """The step of the last batch the tap wrote: the last read's, plus the batches the
        buffers counted since (a fit that raised leaves some: Keras skips the fit's end, where
        the last read comes). One scalar from the device, asked once a fit."""
        values = self._latest()
        if values is None or self._step is None:
            return self._step
        try:
            count = int(host(values[0]))
        except Exception:  # noqa: BLE001  (buffers not made yet: nothing written since)
            return self._step
        return self._step + max(0, count - self._read_count)

    # --- in the jitted step ---------------------------------------------------------------------
    def _extend_state(self, state: tuple, args: tuple, kwargs: dict) -> tuple:
        names = ("trainable_variables", "non_trainable_variables", "optimizer_variables")
        flags = [kwargs.get(n, args[i] if i < len(args) else False) for i, n in enumerate(names)]
        if not flags[2] or self._values is None:
            return state
        i = int(bool(flags[0])) + int(bool(flags[1]))
        state = list(state)
        state[i] = list(state[i]) + list(self._values)
        return tuple(state)

    def _apply(
        self, orig: Any, optimizer_variables: Any, grads: Any, trainable_variables: Any
    ) -> Any:
        k = len(_BUFFERS)
        n_opt = len(self.optimizer.variables)
        optimizer_variables = list(optimizer_variables)
        if self.failed is not None or len(optimizer_variables) != n_opt + k:
            return orig(optimizer_variables[:n_opt], grads, trainable_variables)
        theirs, ours = optimizer_variables[:n_opt], optimizer_variables[n_opt:]
        try:
            before = self._before(theirs, grads)
        except Exception as e:  # noqa: BLE001  (never lose training to mpwatch)
            self._fail(f"could not trace the gradient tap: {e!r}")
            new_tvs, new_theirs = orig(theirs, grads, trainable_variables)
            return new_tvs, list(new_theirs) + list(ours)
        try:
            grads = self._count_first(before, ours, grads, trainable_variables)
        except Exception as e:  # noqa: BLE001
            self._fail(f"could not trace the gradient tap: {e!r}")
        new_tvs, new_theirs = orig(theirs, grads, trainable_variables)
        before["moved"] = (list(trainable_variables), list(new_tvs))
        try:
            ours = self._after(before, list(new_theirs), ours)
        except Exception as e:  # noqa: BLE001
            self._fail(f"could not trace the gradient tap: {e!r}")
        return new_tvs, list(new_theirs) + list(ours)

    def _count_first(self, pre: dict[str, Any], ours: list[Any], grads: Any, tvs: Any) -> Any:
        """Under the conditional way with no 16-bit variable, the gradients' counts are taken
        before the optimizer's update (``pre["grad_counts"]``) and the update gets the gradients
        through an optimization barrier with them: the update then waits for the counts, and no
        gradient outlives the update. (A conditional after the update, which read the step's
        skip flag, kept every gradient alive past it and XLA copied them: the wide MLP's fit
        peak at the defaults 1.064x a plain fit's, 1.02x without the copy.) Returns the
        gradients the update takes."""
        import jax
        import jax.numpy as jnp

        way = getattr(self._local, "way", None) or self._way
        if "grads" not in pre or way != "cond" or any(lost_updates.is_16bit(v) for v in tvs):
            return grads
        count = ours[0]
        do = jnp.equal(jnp.mod(count + 1, self.grad_every), 0)
        counts_of = (
            stats.jax_counts_table_each
            if self._sharding is not None
            else lambda g: stats.jax_counts_table(g, jnp.minimum(count, 0))
        )
        def counted(part: list[Any]) -> Any:
            return jax.lax.cond(
                do,
                counts_of,
                lambda g: jnp.zeros((len(g), stats.NUM_COUNTS), jnp.float32),
                part,
            )

        grads = list(pre["grads"])
        big = [i for i, g in enumerate(grads) if _elements(g) >= stats.DIRECT_MIN]
        small = [i for i in range(len(grads)) if i not in set(big)]
        rows: dict[int, Any] = {}
        if small:
            got = counted([grads[i] for i in small])
            rows.update({i: got[j] for j, i in enumerate(small)})
        for i in big:  # one conditional each, which the gradient's update waits for (a
            # barrier): each gradient is counted and freed in turn, none waits for the others
            grads[i], rows[i] = jax.lax.optimization_barrier((grads[i], counted([grads[i]])[0]))
        pre["grad_counts"] = jnp.stack([rows[i] for i in range(len(grads))])
        return grads

    def _before(self, theirs: list[Any], grads: Any) -> dict[str, Any]:
        import jax.numpy as jnp

        variables = list(self.optimizer.variables)
        self._it = _index_of(variables, step_decision.raw_counter(self.optimizer))
        self._acc = step_decision.accumulation_steps(self.optimizer)
        self._scale = _index_of(variables, self.lso.dynamic_scale) if self.lso is not None else None
        pre: dict[str, Any] = {
            "it": theirs[self._it], "finite": step_decision.finite(self.lso, grads)
        }
        seen = getattr(self._local, "pending_input", None)
        self._local.pending_input = None
        nan = jnp.full((), jnp.nan, jnp.float32)
        pre["in_max"], pre["in_bad"] = seen if seen is not None else (nan, nan)
        one = jnp.ones((), jnp.float32)
        pre["scale_used"] = (
            theirs[self._scale].astype(jnp.float32) if self._scale is not None else one
        )
        grads = list(grads)
        if self.grad_every and len(grads) == self._num_vars:
            pre["grads"] = grads
        elif self.grad_every:
            raise ValueError(
                f"the optimizer got {len(grads)} gradients for {self._num_vars} trainable variables"
            )
        return pre

    def _after(self, pre: dict[str, Any], new_theirs: list[Any], ours: list[Any]) -> list[Any]:
        import jax
        import jax.numpy as jnp

        count, scale, scale_used, skipped, in_max, in_bad, ccount, cstep, counts = ours
        slot = jnp.mod(count, self.capacity)
        skip, applied = step_decision.outcome(
            pre["finite"], pre["it"], new_theirs[self._it], self._acc
        )
        after = (
            new_theirs[self._scale].astype(jnp.float32)
            if self._scale is not None
            else jnp.ones((), jnp.float32)
        )
        scale = scale.at[slot].set(after)
        scale_used = scale_used.at[slot].set(pre["scale_used"])
        skipped = skipped.at[slot].set(skip)
        in_max = in_max.at[slot].set(pre["in_max"])
        in_bad = in_bad.at[slot].set(pre["in_bad"])
        way = getattr(self._local, "way", None) or self._way
        if "grads" in pre and way not in ("apart", "none"):
            step_next = count + 1  # this batch's step
            do = jnp.equal(jnp.mod(step_next, self.grad_every), 0)
            grads = pre["grads"]
            # only the 16-bit variables' values before and after go into the cond: an operand
            # of it stays alive past the update, and XLA then copies a donated variable instead
            # of updating it in place (every float32 weight, every step, under a mixed policy)
            before, after = pre["moved"]
            which = [i for i, v in enumerate(before) if lost_updates.is_16bit(v)]
            old, new = [before[i] for i in which], [after[i] for i in which]
            counts_of = (
                stats.jax_counts_table_each
                if self._sharding is not None
                else lambda g: stats.jax_counts_table(g, jnp.minimum(count, 0))
            )

            def table_of(g: Any, old: Any, new: Any) -> Any:
                moved = lost_updates.jax_update_counts(g, old, new, which, applied)
                return jnp.concatenate([counts_of(g), moved], axis=1)

            if "grad_counts" in pre:  # taken before the update (:meth:`_count_first`)
                moved = lost_updates.jax_update_counts(grads, [], [], [], 1.0)  # NaN rows
                table = jnp.concatenate([pre["grad_counts"], moved], axis=1)
            elif way == "select":  # no conditional (a host sync on a GPU)
                table = jnp.where(do, table_of(grads, old, new), jnp.float32(0.0))
            else:
                table = jax.lax.cond(
                    do,
                    table_of,
                    lambda g, old, new: jnp.zeros((len(g), TAP_COUNTS), jnp.float32),
                    grads, old, new,
                )  # fmt: skip
            # always into the slot after the newest table (zeros on steps without counts: that
            # slot is free), counted as written only on a counts step
            j = jnp.mod(ccount, self.count_slots)
            counts = counts.at[j].set(table)
            cstep = cstep.at[j].set(step_next)
            ccount = ccount + do.astype(jnp.int32)
        return [count + 1, scale, scale_used, skipped, in_max, in_bad, ccount, cstep, counts]

    # --- on the host --------------------------------------------------------------------------
    def _latest(self) -> list[Any] | None:
        state = getattr(self.model, "_jax_state", None)
        if state and state.get("optimizer_variables") is not None:
            ov = state["optimizer_variables"]
            if len(ov) == len(self.optimizer.variables) + len(_BUFFERS):
                self._values = list(ov[-len(_BUFFERS) :])
        return self._values

    def read(self) -> Collected:
        values = self._latest()
        if values is None:
            return Collected(steps=[])
        # the wait for the device to finish the steps queued so far is training's time, not
        # mpwatch's: timed apart (``device_wait``) and left out of mpwatch's own time
        import jax

        t0 = time.perf_counter()
        jax.block_until_ready(values)
        self.device_wait += time.perf_counter() - t0
        # one copy to the host, the counts included (a few tables of a row per variable):
        # indexing a device array would be a program XLA compiles, and a transfer per slot
        if all(getattr(v, "is_fully_addressable", True) for v in values):  # copied together
            *small, whole = [np.asarray(v) for v in jax.device_get(values)]
        else:  # spans processes: slicing it would be a computation of every process
            *small, whole = [host(v) for v in values]
        count, scale, scale_used, skipped, in_max, in_bad, ccount, cstep = small
        n = int(count) - self._read_count
        first_slot = self._read_count  # the batch written at count c went into slot c % cap
        self._read_count = int(count)
        entries = counts_entries(int(ccount), self.count_slots, self._read_ccount)
        self._read_ccount = int(ccount)
        tables = {int(cstep[slot]): whole[slot] for _, slot in entries}
        last, self._step = self._step, self._step + n
        return from_ring(
            self, last, n, scale, scale_used, skipped, tables, first_slot=first_slot,
            inputs=(in_max, in_bad),
        )  # fmt: skip
