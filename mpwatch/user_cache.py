"""Where mpwatch keeps what it can make again, outside any logdir: the user's cache directory.

``$MPWATCH_CACHE_DIR`` when set, else ``$XDG_CACHE_HOME/mpwatch``, else ``~/.cache/mpwatch``;
``MPWATCH_CACHE_DIR=off`` keeps nothing. Its folders: ``profiles/`` (converted profiler traces,
:mod:`mpwatch.read.traces`) and ``xla/`` (mpwatch's own compiled JAX programs,
:mod:`mpwatch.record.runtime.program_cache`). Everything there is safe to delete.

Example:
    >>> import os; os.environ["MPWATCH_CACHE_DIR"] = "off"; cache_dir() is None
    True
    >>> del os.environ["MPWATCH_CACHE_DIR"]
"""

from __future__ import annotations

import os
import tempfile

__all__ = ["CACHE_ENV", "CACHE_OFF", "cache_dir", "write_atomically"]

CACHE_ENV = "MPWATCH_CACHE_DIR"
CACHE_OFF = "off"


def cache_dir() -> str | None:
    """The user's mpwatch cache directory (see the module doc); None when it is off."""
    chosen = os.environ.get(CACHE_ENV)
    if chosen is not None:
        chosen = chosen.strip()
        if chosen.lower() == CACHE_OFF:
            return None
        if chosen:
            return os.path.abspath(os.path.expanduser(chosen))
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    base = xdg if os.path.isabs(xdg) else os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "mpwatch")


def write_atomically(path: str, blob: bytes) -> None:
    """Write ``blob`` at ``path`` through a temporary file in the same folder, renamed: a reader
    (another process) never sees half an entry. Raises OSError when it cannot be written."""
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
