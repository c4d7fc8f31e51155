"""The ``mpwatch`` command line.

    mpwatch diagnose LOGDIR [--run NAME] [--format text|markdown|json|html] [-o FILE]
                            [--fail-on warning|error]
    mpwatch preflight MODEL BATCH [...]    (:mod:`mpwatch.launch.cli`)

Exit codes of ``mpwatch diagnose`` (also in ``mpwatch diagnose --help``), for CI:

- 0 (:data:`EXIT_OK`): the diagnosis ran; no finding reached ``--fail-on`` (or none was given).
- 1 (:data:`EXIT_FINDINGS`): a finding reached ``--fail-on``. Data the reader could not read (a
  corrupt record, a file named like an event file that is none, an event file or folder without
  permission) is an error finding (rule ``damaged-logs``), so ``--fail-on error`` counts it; a
  last record cut short (a run still being written) is an info finding.
- 2 (:data:`EXIT_USAGE`): a usage error, a logdir (or ``--run``) that is missing or cannot be
  read, or a report that cannot be written; also a logdir in which no mpwatch data could be read
  because part of it could not be read (its only event files damaged or no event files, its run
  folders without permission): data may be there. The report still lists the ``damaged-logs``
  errors, and stderr says what could not be read.
- 3 (:data:`EXIT_NO_DATA`): the logdir exists but holds no mpwatch data: no event file, or event
  files without any ``mpwatch/`` scalar or ``mpwatch/record/`` record (a run recorded without
  mpwatch's callbacks, or the wrong directory), and no profiler trace that could be read (a
  trace alone, ``plugins/profile/<capture>/*.xplane.pb``, is data: its profile is judged), and
  everything in it could be read. The report still says so (on stdout, or in ``-o``), and stderr
  names what was looked for and where. A CI job that expects a run fails on it instead of
  passing on a diagnosis of nothing.

Reading shows a progress bar on stderr when it takes more than a second and stderr is a terminal
(``MPWATCH_PROGRESS=1`` forces it).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO

from mpwatch._version import __version__

if TYPE_CHECKING:  # pragma: no cover
    from mpwatch.judge import Finding
    from mpwatch.read import Run

__all__ = [
    "EXIT_FINDINGS",
    "EXIT_NO_DATA",
    "EXIT_OK",
    "EXIT_USAGE",
    "build_parser",
    "diagnose_command",
    "main",
    "write_report",
]

EXIT_OK = 0  # no finding reached --fail-on
EXIT_FINDINGS = 1  # a finding reached --fail-on
EXIT_USAGE = 2  # usage error, unreadable logdir or run, unwritable report
EXIT_NO_DATA = 3  # the logdir holds no mpwatch data

EXIT_CODES_HELP = f"""\
exit codes:
  {EXIT_OK}  no finding reached --fail-on (or --fail-on not given)
  {EXIT_FINDINGS}  a finding reached --fail-on (data that could not be read, such as a corrupt
     event file, is an error finding)
  {EXIT_USAGE}  usage error, a LOGDIR (or --run) that is missing or cannot be read, or a report
     that cannot be written; also no mpwatch data read because part of LOGDIR could not be
     read (damaged event files, folders without permission: the report lists them)
  {EXIT_NO_DATA}  LOGDIR exists but holds no mpwatch data: no event file with an mpwatch/ scalar
     or record, and no readable profiler trace, all of it read (the report still says so;
     stderr says what was looked for)
"""


#: a command added by a later stage (the pre-flight): (add its subparser, run it -> exit code)
Command = tuple[Callable[[Any], None], Callable[[argparse.Namespace], int]]


def build_parser(commands: dict[str, Command] | None = None) -> argparse.ArgumentParser:
    """The ``mpwatch`` parser: ``diagnose``, and each of ``commands``' subparsers."""
    parser = argparse.ArgumentParser(
        prog="mpwatch",
        description="Watch Keras mixed-precision training: loss scale, skipped steps, gradient "
        "underflow, per-layer dtypes, speed.",
        epilog="mpwatch diagnose --help lists the exit codes.",
    )
    parser.add_argument("--version", action="version", version=f"mpwatch {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    d = sub.add_parser(
        "diagnose",
        help="diagnose a finished (or running) run from its logdir",
        description="Read LOGDIR's event files and print what is wrong with mixed precision and "
        "what to change.",
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
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
    for add, _ in (commands or {}).values():
        add(sub)
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
    """Colours only on a terminal, and not with ``--no-color``, ``-o``, a non-empty ``NO_COLOR``
    (https://no-color.org) or ``TERM=dumb``."""
    if args.no_color or os.environ.get("NO_COLOR") or args.output:
        return False
    if os.environ.get("TERM") == "dumb":
        return False
    return hasattr(out, "isatty") and out.isatty()


def _no_data_message(logdir: str, runs: dict[str, Run], run_option: str | None) -> str:
    """What was looked for, and where, when no run holds mpwatch data."""
    where = os.path.join(logdir, run_option) if run_option else logdir
    looked = (
        "looked for TensorFlow event files (events.out.tfevents.*) holding an 'mpwatch/' scalar "
        "or an 'mpwatch/record/' record, and for profiler traces (plugins/profile/<capture>/"
        "*.xplane.pb)"
    )
    if not runs:
        found = "found no event file and no profiler trace"
    else:
        other = sorted({str(t) for r in runs.values() for t in r.scalars.columns})
        found = f"found {len(runs)} run(s) ({', '.join(sorted(runs)[:5])}"
        found += ", ..." if len(runs) > 5 else ""
        found += "), none with mpwatch data"
        if other:
            found += f"; their scalar tags: {', '.join(other[:8])}" + (
                ", ..." if len(other) > 8 else ""
            )
        skipped = sum(len(r.warnings) for r in runs.values())
        if skipped:
            found += f"; the reader skipped {skipped} damaged record(s) or file(s)"
        traces = [w for r in runs.values() for w in r.warnings if "profiler trace" in w]
        if traces:
            found += f"; {traces[0]}"
    return (
        f"mpwatch diagnose: no mpwatch data in {where!r}: {looked} in it and its subdirectories; "
        f"{found}. Record a run with mpwatch.MixedPrecisionMonitor(log_dir=...) in model.fit's "
        f"callbacks. Exit {EXIT_NO_DATA}."
    )


def _unreadable_message(logdir: str, lost: list[Finding], run_option: str | None) -> str:
    """What could not be read, when no mpwatch data could be (the ``damaged-logs`` errors)."""
    where = os.path.join(logdir, run_option) if run_option else logdir
    said = "; ".join(f.evidence for f in lost[:3])
    more = f"; and {len(lost) - 3} more (see the report)" if len(lost) > 3 else ""
    return (
        f"mpwatch diagnose: no mpwatch data could be read in {where!r}: {said}{more}. "
        f"Exit {EXIT_USAGE}."
    )


def write_report(path: str, text: str, command: str) -> bool:
    """Write a report to ``path``; False (said on stderr, naming ``command``) where it cannot."""
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        print(f"mpwatch {command}: cannot write {path!r}: {e}", file=sys.stderr)
        return False
    return True


def diagnose_command(args: argparse.Namespace) -> int:
    # a raw profiler trace is converted by xprof, whose C++ layer logs every step on stderr
    # (TensorFlow's variable, which xprof honours; a user's own value wins)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    from mpwatch.judge import diagnose_runs
    from mpwatch.read import ReadError, Run, load_run, load_runs
    from mpwatch.show.report import render
    from mpwatch.show.summary import unreadable

    err = sys.stderr
    progress = _Progress(err, force=os.environ.get("MPWATCH_PROGRESS") == "1")
    try:
        if args.run is not None:
            run = load_run(args.logdir, args.run, progress=progress, warn=False)
            runs = {run.name: run}
        else:
            runs = load_runs(args.logdir, progress=progress)
    except (ReadError, ValueError) as e:
        progress.close()
        print(f"mpwatch diagnose: {e}", file=err)
        return EXIT_USAGE
    progress.close()
    findings = diagnose_runs(runs)
    logdir = os.fspath(args.logdir)
    has_data = any(r.has_data for r in runs.values())
    shown = runs or {".": Run(name=".", path=logdir)}  # no event file at all: still a report
    text = render(shown, findings, args.format, logdir=logdir, color=_use_color(args, sys.stdout))
    if args.output:
        if not write_report(args.output, text, "diagnose"):
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
    if not has_data:
        lost = unreadable(findings)
        if lost:  # data may be there: "cannot be read", not "nothing recorded"
            print(_unreadable_message(logdir, lost, args.run), file=err)
            return EXIT_USAGE
        print(_no_data_message(logdir, runs, args.run), file=err)
        return EXIT_NO_DATA
    if args.fail_on and any(f.at_least(args.fail_on) for f in findings):
        return EXIT_FINDINGS
    return EXIT_OK


def main(argv: list[str] | None = None, commands: dict[str, Command] | None = None) -> int:
    """The ``mpwatch`` command line (its console script is :func:`mpwatch.__main__.main`, which
    adds ``preflight`` through ``commands``); returns the exit code."""
    parser = build_parser(commands)
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse exits 2 on usage errors, 0 on --help/--version
        return int(e.code) if isinstance(e.code, int) else EXIT_USAGE
    if args.command is None:
        parser.print_help(sys.stdout)
        return EXIT_OK
    if args.command == "diagnose":
        return diagnose_command(args)
    if commands and args.command in commands:
        return commands[args.command][1](args)
    parser.print_help(sys.stderr)
    return EXIT_USAGE
