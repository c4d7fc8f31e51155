"""mpwatch's own XLA programs on JAX, compiled once per machine: a cache across processes.

The probe's program (two training-mode passes of the model and their statistics), the float8
readiness capture and the fix checks are ``jax.jit`` programs that XLA compiles when a fit first
runs them: on a CPU that compile is most of a first probe (MobileNetV2 on 2 cores: 12-14 s of
about 20 s), and it is the same program every time the same model is probed on the same batch
shape. :class:`CachedJit` keeps the compiled executable (``jax.experimental.serialize_executable``)
in the user's cache directory, ``xla/`` beside the converted traces (:mod:`mpwatch.user_cache`:
``$MPWATCH_CACHE_DIR``, else ``$XDG_CACHE_HOME/mpwatch``, else ``~/.cache/mpwatch``;
``MPWATCH_CACHE_DIR=off`` turns it off), and a later process that lowers the same program loads
it instead of compiling it.

What makes two programs the same (the entry's key, :func:`program_key`): the lowered StableHLO
text without debug information (so layer names and source lines, which differ between two fresh
models of one architecture, do not count; shapes, dtypes, constants and the computation do), the
function's label, jax's and jaxlib's versions, the platform and its version, the devices' kind and
count, ``$XLA_FLAGS``, and on a CPU the processor's feature flags (an executable built for one
instruction set must not load on another). A loaded executable is the very program XLA compiled:
the probe's numbers are the same bit for bit (``tests/record/test_program_cache.py``).

The cache never costs a fit its training: an entry that cannot be read, loaded or written is
compiled as before (a damaged entry is removed), and the folder is kept under
:data:`MAX_CACHE_BYTES` (least recently used first). It is used where the program runs on one
device of one process; a program over several devices or processes is compiled by ``jax.jit`` as
it always was.

Example:
    >>> import jax.numpy as jnp  # doctest: +SKIP
    >>> f = CachedJit(lambda a: (a * 2).sum(), "example")  # doctest: +SKIP
    >>> float(f(jnp.ones(3)))  # compiled, or loaded from the cache  # doctest: +SKIP
    6.0
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from functools import lru_cache
from typing import Any

logger = logging.getLogger("mpwatch")

__all__ = [
    "CachedJit",
    "MAX_CACHE_BYTES",
    "cached",
    "entry",
    "from_entry",
    "load_or_compile",
    "program_key",
    "stats",
]

#: the cache folder's size limit; the least recently used entries go first
MAX_CACHE_BYTES = 1 << 30
SUFFIX = ".xla"

#: what the cache did in this process (for the benchmark's and tests' reading)
stats: dict[str, float] = {"hits": 0, "misses": 0, "errors": 0, "load_s": 0.0, "compile_s": 0.0}


def folder() -> str | None:
    """Where the executables are kept (None: the cache is off)."""
    from mpwatch.user_cache import cache_dir

    where = cache_dir()
    return None if where is None else os.path.join(where, "xla")


@lru_cache(maxsize=1)
def _host_cpu() -> str:
    """The processor's model and feature flags (what an executable compiled for the CPU
    assumes)."""
    import platform

    parts = [platform.machine(), platform.processor()]
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key = line.split(":", 1)[0].strip()
                if key in ("flags", "Features", "model name", "CPU part"):
                    parts.append(line.strip())
                if key in ("flags", "Features"):
                    break
    except OSError:
        pass
    return "\n".join(parts)


def _machine(devices: list[Any]) -> str:
    import jax
    import jaxlib

    d = devices[0]
    fields = [
        f"jax {jax.__version__}",
        f"jaxlib {getattr(jaxlib, '__version__', '') or jaxlib.version.__version__}",
        f"platform {d.platform} {getattr(d.client, 'platform_version', '')}",
        f"devices {len(devices)} {sorted({str(x.device_kind) for x in devices})}",
        f"XLA_FLAGS {os.environ.get('XLA_FLAGS', '')}",
    ]
    if d.platform == "cpu":
        fields.append(_host_cpu())
    return "\n".join(fields)


def program_key(lowered: Any, label: str) -> str:
    """The cache key of a lowered program (see the module doc)."""
    import jax

    h = hashlib.blake2b(digest_size=20)
    h.update(f"{label}\n{_machine(jax.devices())}\n".encode())
    h.update(lowered.as_text(debug_info=False).encode())
    return h.hexdigest()


def entry(lowered: Any, label: str) -> str | None:
    """The path of this program's cache entry (None when the cache is off or the program has
    no key); it may not exist yet."""
    where = folder()
    if where is None or not _one_device():  # a mesh or several processes: compiled as before
        return None
    try:
        return os.path.join(where, f"{label}-{program_key(lowered, label)}{SUFFIX}")
    except Exception:  # noqa: BLE001 - no key, no cache: compiled as before
        logger.debug("mpwatch: program cache: no key for %s", label, exc_info=True)
        return None


def cached(lowered: Any, label: str) -> bool:
    """Whether this program's executable is in the cache (loading it, unlike compiling it, is
    light work that can run beside training on a CPU)."""
    path = entry(lowered, label)
    return path is not None and os.path.isfile(path)


def load_or_compile(lowered: Any, label: str) -> Any:
    """``lowered.compile()``, loaded from the cache where this program was compiled before on this
    kind of machine, else compiled and kept there."""
    return from_entry(lowered, entry(lowered, label))


def from_entry(lowered: Any, path: str | None) -> Any:
    """:func:`load_or_compile` with the program's :func:`entry` already known (its key is the
    program's whole text, hashed: worth computing once)."""
    if path is None:
        return _compile(lowered)
    loaded = _load(path, lowered)
    if loaded is not None:
        return loaded
    compiled = _compile(lowered)
    _store(path, compiled)
    return compiled


def _compile(lowered: Any) -> Any:
    t0 = time.perf_counter()
    compiled = lowered.compile()
    stats["compile_s"] += time.perf_counter() - t0
    return compiled


def _load(path: str, lowered: Any) -> Any:
    """The executable kept at ``path``, or None (none yet, or one that cannot be loaded: removed,
    and compiled again)."""
    try:
        with open(path, "rb") as f:
            blob = f.read()
    except OSError:
        stats["misses"] += 1
        return None
    t0 = time.perf_counter()
    try:
        from jax.experimental.serialize_executable import deserialize_and_load

        compiled = deserialize_and_load(blob, lowered.in_tree, lowered.out_tree)
    except Exception as e:  # noqa: BLE001 - a damaged or foreign entry: compile instead
        stats["errors"] += 1
        logger.warning("mpwatch: program cache: %s not loaded (%r); compiling", path, e)
        _remove(path)
        return None
    stats["hits"] += 1
    stats["load_s"] += time.perf_counter() - t0
    try:
        os.utime(path)  # used now: the last to be pruned
    except OSError:
        pass
    return compiled


def _store(path: str, compiled: Any) -> None:
    """Keep the executable (written to a temporary file, then renamed: a reader never sees half
    an entry); nothing happens when it cannot be serialized or written."""
    try:
        from jax.experimental.serialize_executable import serialize

        from mpwatch.user_cache import write_atomically

        write_atomically(path, serialize(compiled)[0])
    except Exception as e:  # noqa: BLE001 - the program runs; only the next process compiles
        logger.debug("mpwatch: program cache: %s not written (%r)", path, e)
        return
    prune(os.path.dirname(path))


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def prune(where: str, limit: int | None = None) -> None:
    """Remove the least recently used entries until the folder holds at most ``limit`` bytes
    (:data:`MAX_CACHE_BYTES`)."""
    limit = MAX_CACHE_BYTES if limit is None else limit
    try:
        entries = [e for e in os.scandir(where) if e.name.endswith(SUFFIX)]
        sizes = {e.path: e.stat() for e in entries}
    except OSError:
        return
    total = sum(s.st_size for s in sizes.values())
    for path, st in sorted(sizes.items(), key=lambda kv: kv[1].st_mtime_ns):
        if total <= limit:
            break
        _remove(path)
        total -= st.st_size


def _signature(args: tuple) -> tuple:
    """What one compiled executable takes: the arguments' tree and each leaf's shape and dtype
    (a Python scalar by its type)."""
    import jax

    leaves, tree = jax.tree_util.tree_flatten(args)
    return (
        tree,
        tuple(
            (tuple(getattr(v, "shape", ())), str(getattr(v, "dtype", type(v).__name__)))
            for v in leaves
        ),
    )


def _one_device() -> bool:
    import jax

    return jax.process_count() == 1 and jax.device_count() == 1


class CachedJit:
    """``jax.jit(fn)`` whose executables come from mpwatch's program cache (module doc).

    Called like the function; each new argument signature is traced in the calling context (the
    policies in force, as ``jax.jit`` would) and its executable loaded or compiled once.
    ``label`` names the program in the cache's file names.

    Example:
        >>> import jax.numpy as jnp  # doctest: +SKIP
        >>> double_sum = CachedJit(lambda a: (a * 2).sum(), "double-sum")  # doctest: +SKIP
        >>> float(double_sum(jnp.arange(4.0)))  # doctest: +SKIP
        12.0
    """

    def __init__(self, fn: Any, label: str) -> None:
        import jax

        self.jit = jax.jit(fn)
        self.label = label
        self._compiled: dict[tuple, Any] = {}

    def lower(self, *args: Any) -> Any:
        return self.jit.lower(*args)

    def compile(self, *args: Any) -> Any:
        """The executable for these arguments (lowered here, then loaded or compiled)."""
        return load_or_compile(self.lower(*args), self.label)

    def executable(self, *args: Any) -> Any:
        """The executable these arguments run (loaded or compiled once, then kept), or None where
        the program spans several devices (``jax.jit`` compiles it as it runs)."""
        if not _one_device():
            return None
        sig = _signature(args)
        fn = self._compiled.get(sig)
        if fn is None:
            fn = self._compiled[sig] = self.compile(*args)
        return fn

    def __call__(self, *args: Any) -> Any:
        fn = self.executable(*args)
        return self.jit(*args) if fn is None else fn(*args)
