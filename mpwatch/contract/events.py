"""Event files and the order of writes: which files hold a run, in TensorBoard's order, and which
values survive 'later writes win'.

The reader, the plugin and resume all apply these.
"""

from __future__ import annotations

import os
from typing import Any


def is_event_file(name: str) -> bool:
    """Whether a file name is an event file TensorBoard reads (not a temporary or lock file)."""
    return "tfevents" in name and not name.endswith((".tmp", ".lock"))


def event_files(path: str) -> list[str]:
    """The event files directly in directory ``path``, in TensorBoard's order: by the timestamp in
    the name, then the name. Raises OSError when ``path`` cannot be listed."""
    names = [n for n in os.listdir(path) if is_event_file(n)]

    def key(n: str) -> tuple[int, str]:
        parts = n.split(".")
        try:
            i = parts.index("tfevents")
            return (int(parts[i + 1]), n)
        except (ValueError, IndexError):
            return (0, n)

    return [os.path.join(path, n) for n in sorted(names, key=key)]


def later_writes_win(seq: Any, step: Any, strict: bool = False) -> Any:
    """Indices (into arrays in write order) of the values that survive 'later writes win': a value
    is dropped when a later write has a step <= its step (< with strict: several records at one
    step are parts of one). A resumed run rewrites the steps after its checkpoint this way, as
    TensorBoard's purge of orphaned data does.

    >>> import numpy as np
    >>> later_writes_win(np.arange(5), np.array([1, 2, 3, 2, 3])).tolist()  # a resume at step 2
    [0, 3, 4]
    """
    import numpy as np

    n = len(step)
    if not n:
        return np.zeros(0, dtype=np.int64)
    rev_min = np.minimum.accumulate(step[::-1])[::-1]
    later_min = np.empty(n, dtype=step.dtype)
    later_min[:-1] = rev_min[1:]
    later_min[-1] = np.iinfo(np.int64).max
    keep = step < later_min if not strict else step <= later_min
    return np.nonzero(keep)[0]
