"""The ``mpwatch`` command line.

    mpwatch diagnose LOGDIR [--run NAME] [--format text|markdown|json|html] [-o FILE]
                            [--fail-on warning|error]

Exit codes: 0 done (no finding at or above ``--fail-on``); 1 a finding reached ``--fail-on``;
2 usage error, or a logdir that cannot be read. A logdir without mpwatch data is no error: the
report says so plainly, and exits 0 (there is no finding to fail on).

Reading shows a progress bar on stderr when it takes more than a second and stderr is a terminal
(``MPWATCH_PROGRESS=1`` forces it).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import TextIO

from mpwatch._version import __version__

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE = 0, 1, 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mpwatch",
        description="Watch Keras mixed-precision training: loss scale, skipped steps, gradient "
        "underflow, per-layer dtypes, speed.",
    )
    parser.add_argument("--version", action="version", version=f"mpwatch {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    d = sub.add_parser(
        "diagnose",
        help="diagnose a finished (or running) run from its logdir",
        description="Read LOGDIR's event files and print what is wrong with mixed precision and "
        "what to change. Exit 0, or 1 when a finding reaches --fail-on; 2 for usage errors or an "
        "unreadable logdir.",
    )
    d.add_argument("logdir", metavar="LOGDIR", help="the log directory (one run or several)")
    d.add_argument("--run", metavar="NAME", help="only this run (its path relative to LOGDIR)")
    d.add_argument(
        "--format",
        choices=("text", "markdown", "json", "html"),
        default="text",
        help="output format (default: text, coloured on a terminal)",
    )
    d.add_argument("-o", "--output", metavar="FILE", help="write the report here (default stdout)")
    d.add_argument(
        "--fail-on",
        choices=("warning", "error"),
        help="exit 1 when a finding of this severity or worse is found",
    )
    d.add_argument("--no-color", action="store_true", help="no ANSI colours in text output")
    return parser


class _Progress:
    """A progress bar on stderr, shown only once reading has taken more than ``delay`` seconds
    and only when stderr is a terminal (or ``force``)."""

    def __init__(self, stream: TextIO, delay: float = 1.0, force: bool = False) -> None:
        self.stream = stream
        self.delay = delay
        self.start = time.monotonic()
        self.enabled = force or (hasattr(stream, "isatty") and stream.isatty())
        self.shown = False

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled or time.monotonic() - self.start < self.delay:
            return
        frac = done / total if total else 1.0
        width = 30
        bar = "#" * int(frac * width) + "-" * (width - int(frac * width))
        self.stream.write(
            f"\rreading event files [{bar}] {frac:6.1%} {done / 2**20:.1f}/{total / 2**20:.1f} MiB"
        )
        self.stream.flush()
        self.shown = True

    def close(self) -> None:
        if self.shown:
            self.stream.write("\n")
            self.stream.flush()


def _use_color(args: argparse.Namespace, out: TextIO) -> bool:
    if args.no_color or os.environ.get("NO_COLOR") or args.output:
        return False
    return hasattr(out, "isatty") and out.isatty()


def diagnose_command(args: argparse.Namespace) -> int:
    import mpwatch.judge as advisor
    from mpwatch.read import run as reader
    from mpwatch.show import report

    err = sys.stderr
    progress = _Progress(err, force=os.environ.get("MPWATCH_PROGRESS") == "1")
    try:
        if args.run is not None:
            run = reader.load_run(args.logdir, args.run, progress=progress, warn=False)
            runs = {run.name: run}
        else:
            runs = reader.load_runs(args.logdir, progress=progress)
    except reader.ReadError as e:
        progress.close()
        print(f"mpwatch diagnose: {e}", file=err)
        return EXIT_USAGE
    except ValueError as e:
        progress.close()
        print(f"mpwatch diagnose: {e}", file=err)
        return EXIT_USAGE
    progress.close()
    findings = advisor.diagnose_runs(runs)
    logdir = os.fspath(args.logdir)
    if not runs:
        # no event file at all: still a report (and the plain message)
        runs = {".": reader.Run(name=".", path=logdir)}
    text = report.render(
        runs, findings, args.format, logdir=logdir, color=_use_color(args, sys.stdout)
    )
    if args.output:
        try:
            with open(args.output, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as e:
            print(f"mpwatch diagnose: cannot write {args.output!r}: {e}", file=err)
            return EXIT_USAGE
        print(
            f"mpwatch diagnose: wrote {args.format} report to {args.output} "
            f"({sum(1 for f in findings if f.severity == 'error')} error(s), "
            f"{sum(1 for f in findings if f.severity == 'warning')} warning(s))",
            file=err,
        )
    else:
        sys.stdout.write(text)
        sys.stdout.flush()
    if args.output and not any(r.has_data for r in runs.values()):
        print(report.NO_DATA.format(where=logdir), file=err)
    if args.fail_on and any(f.at_least(args.fail_on) for f in findings):
        return EXIT_FINDINGS
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``mpwatch`` console script; returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse exits 2 on usage errors, 0 on --help/--version
        return int(e.code) if isinstance(e.code, int) else EXIT_USAGE
    if args.command is None:
        parser.print_help(sys.stdout)
        return EXIT_OK
    if args.command == "diagnose":
        return diagnose_command(args)
    parser.print_help(sys.stderr)
    return EXIT_USAGE
