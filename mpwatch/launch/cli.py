"""``mpwatch preflight MODEL BATCH``: the pre-flight of a saved model on a batch file.

    mpwatch preflight model.keras batch.npz [--policies mixed_float16,mixed_bfloat16]
                      [--log-dir DIR] [--format text|markdown|json|html] [-o FILE]

``MODEL`` is a Keras model file (``model.save("model.keras")``), loaded compiled as saved (its
custom objects must be importable, as for ``keras.saving.load_model``). ``BATCH`` is an ``.npz``
file: arrays ``x`` and ``y`` (and ``sample_weight``), or its first two arrays as ``x`` and ``y``
(``np.savez("batch.npz", x=x[:64], y=y[:64])``).

Exit codes: 0 a candidate policy is ready (with its change); 1 none is (stay in float32); 2 a
usage error, a file that cannot be read, a model that cannot be probed.

Example:
    >>> main(["preflight", "model.keras", "batch.npz", "--format", "markdown"])  # doctest: +SKIP
    0
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from mpwatch.launch import CANDIDATES, FORMATS

__all__ = ["COMMAND", "add_parser", "preflight_command", "read_batch"]

EXIT_READY, EXIT_NOT_READY, EXIT_USAGE = 0, 1, 2


def add_parser(sub: Any) -> None:
    """The ``preflight`` subcommand of the ``mpwatch`` parser."""
    p = sub.add_parser(
        "preflight",
        help="before a long fit: try mixed precision policies on one batch",
        description="Try each policy on MODEL with one batch from BATCH (no training): overflow "
        "and underflow against float32, the layers to keep in float32 (checked), the loss "
        "scale, and the policy to train under.",
        epilog="exit codes: 0 a policy is ready (with its change); 1 none is; 2 usage error or "
        "unreadable input",
    )
    p.add_argument("model", metavar="MODEL", help="a Keras model file (.keras), compiled")
    p.add_argument("batch", metavar="BATCH", help=".npz with arrays x and y (or two arrays)")
    p.add_argument(
        "--policies",
        default=",".join(CANDIDATES),
        help=f"comma-separated candidates, in order of preference (default {','.join(CANDIDATES)})",
    )
    p.add_argument("--log-dir", metavar="DIR", help="where the candidates' runs go (default: temp)")
    p.add_argument("--format", choices=FORMATS, default="text", help="output format")
    p.add_argument("-o", "--output", metavar="FILE", help="write the report here (default stdout)")


def read_batch(path: str) -> tuple[Any, ...]:
    """``(x, y[, sample_weight])`` from an ``.npz`` file (see the module doc)."""
    import numpy as np

    with np.load(path, allow_pickle=False) as data:
        names = list(data.files)
        if "x" in names:
            out = [data["x"], data["y"] if "y" in names else None]
            if "sample_weight" in names:
                out.append(data["sample_weight"])
            return tuple(out)
        if len(names) < 2:
            raise ValueError(f"{path}: needs arrays x and y (found {names})")
        return data[names[0]], data[names[1]]


def preflight_command(args: argparse.Namespace) -> int:
    """Run ``mpwatch preflight``; the exit code."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    err = sys.stderr
    policies = tuple(p.strip() for p in str(args.policies).split(",") if p.strip())
    bad = [p for p in policies if p not in CANDIDATES]
    if bad or not policies:
        print(f"mpwatch preflight: --policies must be some of {CANDIDATES}: {bad}", file=err)
        return EXIT_USAGE
    for path in (args.model, args.batch):
        if not os.path.isfile(path):
            print(f"mpwatch preflight: no such file: {path!r}", file=err)
            return EXIT_USAGE
    try:
        batch = read_batch(args.batch)
    except (OSError, ValueError, KeyError) as e:
        print(f"mpwatch preflight: cannot read the batch {args.batch!r}: {e}", file=err)
        return EXIT_USAGE
    import keras

    try:
        model = keras.saving.load_model(args.model)
    except Exception as e:  # noqa: BLE001  (any loader error: said, exit 2)
        print(f"mpwatch preflight: cannot load the model {args.model!r}: {e}", file=err)
        return EXIT_USAGE
    from mpwatch.launch.check import preflight

    try:
        report = preflight(model, batch, policies=policies, log_dir=args.log_dir)
    except (TypeError, ValueError) as e:
        print(f"mpwatch preflight: {e}", file=err)
        return EXIT_USAGE
    text = report.render(args.format)
    if args.output:
        from mpwatch.show.cli import write_report

        if not write_report(args.output, text, "preflight"):
            return EXIT_USAGE
        print(f"mpwatch preflight: recommended {report.recommended}; wrote {args.output}", file=err)
    else:
        sys.stdout.write(text)
    return EXIT_READY if report.recommended != "float32" else EXIT_NOT_READY


#: the command as :func:`mpwatch.show.cli.main` takes it
COMMAND = (add_parser, preflight_command)


def main(argv: list[str] | None = None) -> int:
    """``mpwatch`` with ``preflight`` (as :func:`mpwatch.__main__.main`)."""
    from mpwatch.show.cli import main as cli_main

    return cli_main(argv, commands={"preflight": COMMAND})
