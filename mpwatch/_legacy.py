"""Module paths of mpwatch before the record / read / judge / show layout, kept importable.

``import mpwatch.reader`` (or ``from mpwatch.callbacks.monitor import MixedPrecisionMonitor``) gives
the module at its new home: the same module object, not a copy, so attributes set on one are seen
through the other. :data:`ALIASES` is the whole map; :func:`install` puts the finder on
``sys.meta_path`` (``mpwatch/__init__.py`` calls it).

Example:
    >>> import mpwatch.reader, mpwatch.read.run
    >>> mpwatch.reader is mpwatch.read.run
    True
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from types import ModuleType

#: old module path -> the module that holds its code now
ALIASES: dict[str, str] = {
    "mpwatch.callbacks": "mpwatch.record",
    "mpwatch.callbacks._base": "mpwatch.record.base",
    "mpwatch.callbacks._state": "mpwatch.record.state",
    "mpwatch.callbacks._resume": "mpwatch.record.resume",
    "mpwatch.callbacks.monitor": "mpwatch.record.monitor",
    "mpwatch.callbacks.loss_scale": "mpwatch.record.loss_scale",
    "mpwatch.callbacks.gradient_health": "mpwatch.record.gradient_health",
    "mpwatch.callbacks.layer_dtypes": "mpwatch.record.layer_dtypes",
    "mpwatch.callbacks.step_time": "mpwatch.record.step_time",
    "mpwatch.callbacks.probe": "mpwatch.record.probe",
    "mpwatch.callbacks.profile_capture": "mpwatch.record.profile_capture",
    "mpwatch.loop": "mpwatch.record.loop",
    "mpwatch.reference": "mpwatch.record.twin",
    "mpwatch.stats": "mpwatch.record.stats",
    "mpwatch.underflow": "mpwatch.record.underflow",
    "mpwatch.summary": "mpwatch.contract",
    "mpwatch.reader": "mpwatch.read.run",
    "mpwatch.advisor": "mpwatch.judge",
    "mpwatch.apply": "mpwatch.judge.apply",
    "mpwatch.report": "mpwatch.show.report",
    "mpwatch.report_html": "mpwatch.show.html",
    "mpwatch.charts_svg": "mpwatch.show.charts_svg",
    "mpwatch.cli": "mpwatch.show.cli",
}


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self.target = target
        self._spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(self.target)
        self._spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # the import system set the alias's spec on the module: give it back its own
        module.__spec__ = self._spec


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        new = ALIASES.get(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(new))


def install() -> None:
    """Put the alias finder first on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _AliasFinder())
