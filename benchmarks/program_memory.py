"""XLA's memory analysis of Keras' train step and of the programs mpwatch's JAX tap compiles.

On an H200 the activation-heavy MLP of ``benchmarks/device_fill.py`` (12 Dense of 1024 units,
mixed_float16) trained plain at a batch of 4,142,080 (122.3 GiB peak, 87% of the device); the
same fit with ``MixedPrecisionMonitor(log_dir)`` at its defaults failed: out of memory while
allocating 189.95 GiB in ``jit_train_step``. This script compiles, without running them, for a
batch of ``--batch`` examples (abstract shapes: nothing of that size is allocated):

- ``plain``: ``jax.jit(model.train_step, donate_argnums=0)`` of a model without a monitor, as
  Keras jits it;
- per ``--variants`` (the monitor's keyword arguments; ``defaults``: none), a model whose tap was
  installed by a one-step fit on a small batch: the train function's programs (on a GPU, the tap's
  every-step program and its counting program, :mod:`mpwatch.record.tap.jax_programs`; elsewhere
  Keras' jitted train step with the tap in it);

and prints each program's temporary, argument and output bytes. ``--hlo DIR`` writes each
program's optimized HLO (gzipped) there.

    KERAS_BACKEND=jax python benchmarks/program_memory.py --batch 1048576
    KERAS_BACKEND=jax python benchmarks/program_memory.py --variants "defaults;input_health=False"
"""

from __future__ import annotations

import argparse
import gc
import gzip
import os
import sys
import tempfile
from typing import Any

os.environ.setdefault("KERAS_BACKEND", "jax")
os.environ.setdefault("MPWATCH_BUDGET", "off")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def _state(model: Any) -> Any:
    return model._get_jax_state(
        trainable_variables=True, non_trainable_variables=True, optimizer_variables=True,
        metrics_variables=True,
    )  # fmt: skip


def analyse(label: str, fn: Any, state: Any, data: Any, hlo: str | None) -> dict[str, Any]:
    import jax

    abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), (state, data))
    try:
        compiled = fn.lower(*abstract).compile()
    except Exception as err:  # noqa: BLE001 - said, the next goes on
        print(f"  {label:40s} did not compile: {type(err).__name__}: {str(err)[:300]}")
        return {"label": label, "error": repr(err)[:500]}
    m = compiled.memory_analysis()
    row = {
        "label": label,
        "temp": m.temp_size_in_bytes, "args": m.argument_size_in_bytes,
        "out": m.output_size_in_bytes, "alias": m.alias_size_in_bytes,
    }  # fmt: skip
    print(f"  {label:40s} temp {row['temp'] / 2**30:9.3f} GiB  args {row['args'] / 2**30:7.3f}"
          f"  out {row['out'] / 2**30:7.3f}  alias {row['alias'] / 2**30:7.3f}", flush=True)
    if hlo:
        os.makedirs(hlo, exist_ok=True)
        name = "".join(c if c.isalnum() else "_" for c in label)
        with gzip.open(os.path.join(hlo, f"{name}.hlo.txt.gz"), "wt") as f:
            f.write(compiled.as_text())
    return row


def programs_of(model: Any) -> list[tuple[str, Any]]:
    """The jitted programs mpwatch's train function runs (TwoPrograms' two on a GPU), else
    Keras' train step with the tap in it."""
    for obj in gc.get_objects():
        if type(obj).__name__ == "TwoPrograms" and getattr(obj, "model", None) is model:
            return [("every", obj.every), ("counting", obj.counting)]
    import jax

    return [("train_step", jax.jit(model.train_step, donate_argnums=0))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=1048576)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--depth", type=int, default=12)
    ap.add_argument("--in-dim", type=int, default=64)
    ap.add_argument("--policy", default="mixed_float16")
    ap.add_argument("--variants", default="defaults;input_health=False;gradient_health=False")
    ap.add_argument("--hlo", help="write each program's optimized HLO here (gzipped)")
    args = ap.parse_args(argv)

    import jax
    import keras
    import numpy as np
    from device_fill import build
    from whole_fit import parse_kwargs

    import mpwatch

    print("device", jax.devices()[0], "batch", args.batch, flush=True)
    big = (jax.ShapeDtypeStruct((args.batch, args.in_dim), np.float32),
           jax.ShapeDtypeStruct((args.batch,), np.int32))  # fmt: skip
    small_x = np.random.default_rng(0).standard_normal((256, args.in_dim), dtype=np.float32)
    small_y = np.zeros(256, "int32")
    rows = []
    plain = build(args)
    rows.append(analyse("plain", jax.jit(plain.train_step, donate_argnums=0), _state(plain), big,
                        args.hlo))  # fmt: skip
    del plain
    for variant in filter(None, (v.strip() for v in args.variants.split(";"))):
        kw = {} if variant == "defaults" else parse_kwargs(variant)
        model = build(args)
        cb = mpwatch.MixedPrecisionMonitor(tempfile.mkdtemp(), probe=False, profile=False, **kw)
        model.fit(small_x, small_y, batch_size=256, epochs=1, verbose=0, callbacks=[cb])
        for name, fn in programs_of(model):
            rows.append(analyse(f"{variant}: {name}", fn, _state(model), big, args.hlo))
        del model
        keras.backend.clear_session()
    base = rows[0].get("temp")
    if base:
        for row in rows[1:]:
            if row.get("temp"):
                print(f"  {row['label']:40s} temp x{row['temp'] / base:.3f} of plain's")
    return 0


if __name__ == "__main__":
    sys.exit(main())
