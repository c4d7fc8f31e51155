"""``mpwatch`` and ``python -m mpwatch``: the command line, every stage's commands.

``diagnose`` is :mod:`mpwatch.show.cli`'s; ``preflight`` is :mod:`mpwatch.launch.cli`'s (the
stage after show), added here.
"""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``mpwatch`` console script; returns the exit code."""
    from mpwatch.launch.cli import COMMAND
    from mpwatch.show.cli import main as cli_main

    return cli_main(argv, commands={"preflight": COMMAND})


if __name__ == "__main__":
    raise SystemExit(main())
