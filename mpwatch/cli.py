"""The ``mpwatch`` command line."""

from __future__ import annotations

import argparse
import sys

from mpwatch._version import __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mpwatch",
        description="Watch Keras mixed-precision training: loss scale, skipped steps, gradient "
        "underflow, per-layer dtypes, speed.",
    )
    parser.add_argument("--version", action="version", version=f"mpwatch {__version__}")
    parser.add_subparsers(dest="command", metavar="COMMAND")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``mpwatch`` console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stdout)
        return 0
    return 0
