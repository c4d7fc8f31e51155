"""The JAX tap's gradient counts kept out of the every-step program (``JaxTap`` with
``counts_way == "apart"``, the default on a GPU).

The gradient counts (:func:`mpwatch.record.tap.stats.jax_counts_table`, the update counts of
:mod:`mpwatch.record.tap.lost_updates`) are a few reductions per trainable variable: in one program
with the train step they cost every step, whether they run every step and are selected (a GPU
launches their kernels each time: on a step bound by the host, keras.io's Transformer on an H200,
x1.18 of a plain step) or run under a ``lax.cond`` (whose predicate XLA's GPU runtime copies to
the host). Here the train step is jitted twice, from the same Keras ``train_step`` as Keras jits
it (its state donated, its output shardings under a distribution):

- **every step** (``jit(train_step)``): the tap's loss scale, skipped-step and input records, no
  counts (its counts buffers pass through, aliased to the donated ones: no copy);
- **the count steps** (``jit(counts_step)``): the same step with the counts, run only at the steps
  the tap counts (every ``grad_every`` steps: the program keeps the counts at those steps only,
  so a step mis-scheduled by the host writes nothing).

Both programs take and give the same state, so a host-side dispatcher (Keras' train function is
rebuilt around it by ``model._make_function``, ``steps_per_execution`` included) picks one per
step from its own count of the steps it dispatched: no device value is read. The counting program
is traced, lowered and compiled **on a thread beside training**, from the shapes of the first
step's state and batch (that step's call compiles the every-step program, as Keras' own would),
once the fit still to come is long enough beside the compile (:func:`compile_now`, by the fit's
cost budget: a process that exits while it compiles waits for it, and a short fit would not use
it); until it is ready the count steps run the every-step program and are kept as missed
(:attr:`TwoPrograms.missed`: the fit's gradient counts start later, or not at all in a short
fit, said in the ``budget`` record). A batch of another shape (a last, partial batch) at a count
step runs the every-step program too. Keras' global state (the dtype policy, the distribution,
flash attention, a remat scope) is thread-local: the thread starts with the training thread's.
The trace takes :data:`mpwatch.record.probe.twin.SWITCHING`, the lock mpwatch's layer switches hold
(the probe's float32 view...), so it never sees a switched layer.

Weights: both programs compute the same update from the same values (the counts only read them);
the fit's result is the plain fit's (``tests/record/test_jax_backend.py``).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import threading
import time
import weakref
from typing import Any

from mpwatch.contract.budget import COUNTS_TOO_SHORT

logger = logging.getLogger("mpwatch")

_THREADS: weakref.WeakSet[threading.Thread] = weakref.WeakSet()

#: the counts' program is compiled when the fit still to come is at least this many times its
#: estimated compile (the fit's first call: Keras' trace and compile of the step, the longer of
#: this fit's and the model's first monitored fit's): a shorter fit would end before it is ready
#: (on a CPU the compile shares the cores with training), and a process that exits while it
#: compiles has to wait for it (a compile cut short by the interpreter's exit aborts the process)
COMPILE_MARGIN = 2.0
#: steps between two looks at the budget while the compile waits for the fit to be long enough
CHECK_EVERY = 8

#: Keras' thread-local global state the compile thread starts with (the training thread's
#: values): what decides how the step traces. Scopes, name stacks and the list of variables
#: waiting to be initialized stay the thread's own: shared, two threads tracing at once would
#: write into each other's.
_INHERITED = (
    "dtype_policy", "distribution", "nnx_enabled", "flash_attention", "remat_scope_stack",
    "tracking_on", "safe_mode_saving",
)  # fmt: skip


@atexit.register
def _join_compiles() -> None:
    """A compile still running when the interpreter exits is waited for (JAX's own clean-up,
    registered before, runs after this one): an XLA compile torn down mid-way can crash."""
    for thread in list(_THREADS):
        thread.join(timeout=120.0)


def why_not(model: Any, rebuild: bool = True) -> str | None:
    """Why the train step cannot be jitted twice here (None: it can): a custom training loop
    jits its own step (``rebuild`` False), Keras runs it eagerly or jits it with Flax NNX's
    ``jit``, or several JAX processes run it (each must run the same program at a step)."""
    if not rebuild:
        return "a custom training loop jits its own train step"
    if getattr(model, "run_eagerly", False) or not getattr(model, "jit_compile", True):
        return "Keras runs the train step eagerly"
    try:
        from keras.src.backend.config import is_nnx_enabled

        if is_nnx_enabled():
            return "Keras jits the train step with Flax NNX"
    except ImportError:  # pragma: no cover  (an older Keras has no NNX)
        pass
    import jax

    if jax.process_count() > 1:  # each process would start the second program when its own
        # compile ends: processes running different programs at a step wait on each other
        return "several JAX processes run the train step together"
    if not hasattr(model, "_make_function"):
        return "this Keras version has no _make_function to build a train function with"
    return None


def compile_now(budget: Any) -> tuple[bool, str]:
    """Whether the counts' program should start compiling now, by the fit's
    :class:`~mpwatch.record.runtime.budget.CostBudget` (see :data:`COMPILE_MARGIN`), and if not,
    why. No budget (``budget=None``, or no
    :class:`~mpwatch.record.callbacks.monitor.MixedPrecisionMonitor`): at once. A fit of unknown
    length counts the time so far as the time to come."""
    if budget is None or getattr(budget, "fraction", None) is None:
        return True, ""
    if budget.step_seconds() is None:
        return False, "the fit ended before its step time was known"
    estimate = _estimate(budget)
    elapsed = budget.elapsed()
    known = budget.total_steps is not None
    left = budget.projected_fit_seconds() - elapsed if known else elapsed
    if left >= COMPILE_MARGIN * estimate:
        return True, ""
    return False, too_short(budget)


def _estimate(budget: Any) -> float:
    """The counts' program's compile, estimated: the fit's first step (Keras' trace and compile
    of the train step), or the model's first monitored fit's where longer (a later fit reuses
    the every-step program and starts fast)."""
    return max(budget.first_step_seconds() or 0.0, budget.trace_seconds or 0.0)


def too_short(budget: Any) -> str:
    """Why a fit did not compile the counts' program, in words."""
    first = budget.first_step_seconds() or 0.0
    return (
        f"{COUNTS_TOO_SHORT}: {budget.elapsed() - first:.2f} s after its first step, against "
        f"{COMPILE_MARGIN:g}x their estimated compile "
        f"({_estimate(budget):.1f} s: the first step, Keras' trace and compile of the train step);"
        " a fit compiles it once what is still to come is that long"
    )


def _abstract(tree: Any) -> Any:
    """Shapes, dtypes and shardings of ``tree``'s leaves as a jitted call keys its cache on them
    (a committed array's sharding; none for an uncommitted one or a host array): what the
    counting program is compiled for, taken before the step that donates them. The dispatcher
    then calls the jitted function itself, which finds that compile in its cache (a
    ``Compiled`` object's outputs would be committed, and the every-step program would compile
    again for them)."""
    import jax
    import numpy as np

    def leaf(x: Any) -> Any:
        if isinstance(x, jax.Array):
            committed = getattr(x, "committed", getattr(x, "_committed", True))
            return jax.ShapeDtypeStruct(
                x.shape, x.dtype, sharding=x.sharding if committed else None,
                weak_type=bool(getattr(getattr(x, "aval", None), "weak_type", False)),
            )  # fmt: skip
        a = np.asarray(x)
        return jax.ShapeDtypeStruct(a.shape, a.dtype)

    return jax.tree.map(leaf, tree)


def _signature(tree: Any) -> tuple[Any, ...]:
    """The shapes and dtypes of ``tree``'s leaves, and its structure (a batch that matches the
    counting program's)."""
    import jax
    import numpy as np

    leaves, treedef = jax.tree.flatten(tree)
    return (treedef, *((tuple(np.shape(x)), str(getattr(x, "dtype", type(x)))) for x in leaves))


class TwoPrograms:
    """The every-step and count-step programs of one tapped model, and the dispatcher Keras'
    train function calls (see the module docstring).

    Example:
        >>> progs = TwoPrograms(tap, model, start_step=0)  # doctest: +SKIP
        >>> progs.install()  # model.train_function now dispatches between the two  # doctest: +SKIP
    """

    #: a count step waits for the counting program instead of running without counts (tests and
    #: benchmarks that compare records step by step)
    wait_at_count_steps: bool = False

    def __init__(self, tap: Any, model: Any, start_step: int) -> None:
        self.tap = tap
        self.model = model
        self.dispatched = int(start_step)  # the step of the last batch dispatched
        self.every: Any = None  # jit(train_step): no counts
        self.counting: Any = None  # jit(counts_step), lowered and compiled on a thread
        self.ready = False  # the counting program compiled (into ``counting``'s cache)
        self.failed: str | None = None  # why the counting program could not be had
        self.compile_seconds: float | None = None  # its trace, lowering and compile, on the thread
        self.missed: list[int] = []  # count steps run without counts (the program not ready yet)
        self.count_steps = 0  # count steps dispatched since the last restart
        self._signature: tuple[Any, ...] | None = None
        self._thread: threading.Thread | None = None
        self._started_at: int | None = None
        self._wanted: Any = None  # the first step's shapes, the program to compile for them
        self._looked = 0  # the step of the last look at the budget
        self._fresh = True  # a fit's first step to come: its batch may have other shapes
        #: where the fit's cost budget is (None: compile at once): set by the model's state
        self.budget_of: Any = None
        self.waiting = ""  # why the compile has not started (the budget's last word)

    def install(self) -> None:
        """Jit the two programs and give Keras a train function that dispatches between them."""
        import jax
        import keras

        model, tap = self.model, self.tap
        kwargs: dict[str, Any] = {"donate_argnums": 0}
        if keras.distribution.distribution() is not None:
            kwargs["out_shardings"] = (None, model._get_state_sharding_spec())

        def train_step(state: Any, data: Any) -> Any:
            with tap.tracing_counts("none"):
                return model.train_step(state, data)

        def counts_step(state: Any, data: Any) -> Any:
            with tap.tracing_counts("select"):
                return model.train_step(state, data)

        self.every = jax.jit(train_step, **kwargs)
        self.counting = jax.jit(counts_step, **kwargs)
        model.train_function = model._make_function(self.dispatch)

    def restart(self, step: int) -> None:
        """Steps are counted from ``step`` (a new fit, or one resumed)."""
        self.dispatched = int(step)
        self.missed = []
        self.count_steps = 0
        self._looked = 0
        self.waiting = ""
        self._fresh = True

    @property
    def started(self) -> int | None:
        """The step after which the counts' program started compiling (None: not yet)."""
        return self._started_at

    # --- the dispatcher (the training thread, once per step) ----------------------------------
    def dispatch(self, state: Any, data: Any) -> Any:
        step = self.dispatched + 1
        fn, pending = self.every, False
        try:
            fn, pending = self._choose(step, state, data)
        except Exception as e:  # noqa: BLE001  (never lose training to mpwatch: no counts)
            self._off(f"the gradient counts' dispatcher failed: {e!r}")
        out = fn(state, data)
        self.dispatched = step
        if pending:
            try:
                if self._go(step):
                    self._start(self._wanted)
            except Exception as e:  # noqa: BLE001
                self._off(f"the gradient counts' program could not be started: {e!r}")
        return out

    def _choose(self, step: int, state: Any, data: Any) -> tuple[Any, bool]:
        """The program for ``step``, and whether the counting one still waits to be started."""
        every = self.tap.grad_every
        fn = self.every
        if self._fresh:
            self._fresh = False
            self._reshaped(data)
        if every and step % every == 0:
            self.count_steps += 1
            if self.wait_at_count_steps and self._thread is not None:
                self._thread.join()
            if self.ready and _signature(data) == self._signature:
                fn = self.counting
            else:
                self.missed.append(step)
        pending = self._thread is None and self.failed is None and bool(every)
        if pending and self._wanted is None:
            self._wanted = _abstract((state, data))  # before the step donates the state
        return fn, pending

    def _reshaped(self, data: Any) -> None:
        """A later fit whose batches have other shapes (another batch size): the counting program
        is compiled again for them, as the every-step one is (the earlier one stays in the jitted
        function's cache); one still compiling is left to finish first."""
        if self._wanted is None or self._signature is None:
            self._wanted = None  # never started: taken from this fit's first step
            return
        if _signature(data) == self._signature:
            return
        if self._thread is not None and self._thread.is_alive():
            return
        self._thread, self.ready, self._wanted, self._started_at = None, False, None, None

    def _off(self, message: str) -> None:
        if self.failed is None:
            self.failed = message
            logger.error("mpwatch: %s; the gradient counts are off", message)

    def _go(self, step: int) -> bool:
        """Whether to start compiling now (looked up every :data:`CHECK_EVERY` steps)."""
        if self._looked and step - self._looked < CHECK_EVERY:
            return False
        self._looked = step
        budget = self.budget_of() if self.budget_of is not None else None
        go, self.waiting = compile_now(budget)
        return go

    # --- the counting program, on a thread ----------------------------------------------------
    def _start(self, abstract: tuple[Any, Any]) -> None:
        from keras.src.backend.common import global_state

        self._signature = _signature(abstract[1])
        self._started_at = self.dispatched
        keras_state = {  # a stack copied: the thread's own from here
            k: list(v) if isinstance(v, list) else v
            for k, v in vars(global_state.GLOBAL_STATE_TRACKER).items()
            if k in _INHERITED
        }
        thread = threading.Thread(
            target=self._compile, args=(abstract, keras_state), name="mpwatch-counts-compile",
            daemon=True,
        )  # fmt: skip
        self._thread = thread
        _THREADS.add(thread)
        thread.start()

    def _compile(self, abstract: tuple[Any, Any], keras_state: dict[str, Any]) -> None:
        from keras.src.backend.common import global_state

        for name, value in keras_state.items():
            setattr(global_state.GLOBAL_STATE_TRACKER, name, value)
        from mpwatch.record.probe.twin import SWITCHING

        t0 = time.perf_counter()
        try:
            # traced while no layer of the model is switched (the probe's float32 view, its
            # random layers off, float8's wrapped calls: on the training thread, under the lock)
            with SWITCHING:
                lowered = self.counting.lower(*abstract)
            lowered.compile()  # into the jitted function's cache
        except Exception as e:  # noqa: BLE001  (never lose training to mpwatch: no counts)
            self._off(f"the gradient counts' program did not compile: {e!r}")
            return
        self.compile_seconds = time.perf_counter() - t0
        self.ready = True
        logger.debug("mpwatch: the counts' program compiled in %.2f s", self.compile_seconds)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the counting program (tests and benchmarks); whether it is ready."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        return self.ready


def note_missed(budget: Any, tap: Any) -> None:
    """At a fit's end: the count steps it ran without gradient counts (their program was still
    compiling, or the batch was of another shape), kept in the ``budget`` record as one
    ``gradient_counts`` decision (its ``detail``: the steps, how many of the fit's count steps)
    for the diagnosis (rule ``budget``) to say when the counts started."""
    programs = getattr(tap, "programs", None)
    if programs is None or not programs.missed:
        return
    missed = list(programs.missed)
    compiled = programs.compile_seconds
    if programs.failed is not None:
        why = programs.failed
    elif programs.started is None:  # the budget's reason, as of the fit's end
        why = too_short(budget) if budget.step_seconds() is not None else programs.waiting
    elif compiled is None:
        why = "their program was still compiling beside training when the fit ended"
    else:
        why = f"their program compiled beside training in {compiled:.2f} s"
    budget.record(
        "gradient_counts", missed[0], "skipped", float(compiled or 0.0), None, reason=why,
        detail={"steps": missed[:50], "missed": len(missed), "count_steps": programs.count_steps,
                "compile_s": compiled},
    )  # fmt: skip


@contextlib.contextmanager
def tracing(local: threading.local, way: str) -> Any:
    """``way`` ("none", "select", "cond") for the traces on this thread (``JaxTap``'s)."""
    before = getattr(local, "way", None)
    local.way = way
    try:
        yield
    finally:
        local.way = before
