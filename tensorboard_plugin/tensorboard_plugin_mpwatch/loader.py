"""The TensorBoard loader of the mpwatch tab: import-safe, sets a default ``--samples_per_plugin``.

TensorBoard keeps only a sample of each tensor summary tag (ten by default for unknown plugins).
mpwatch's structured records (layer table, probe results, profile) are tensor summaries with plugin
name ``mpwatch``; sampling them would drop probe steps. The loader therefore adds ``mpwatch=0``
("keep all") to ``--samples_per_plugin`` unless the user gave a value for ``mpwatch`` themselves.

>>> import argparse
>>> flags = argparse.Namespace(samples_per_plugin={"images": 5})
>>> MpwatchLoader().fix_flags(flags)
>>> flags.samples_per_plugin == {"images": 5, "mpwatch": 0}
True
"""

from __future__ import annotations

from typing import Any

from tensorboard.plugins import base_plugin

# == mpwatch.contract.PLUGIN_NAME, kept literal: this module stays import-light
PLUGIN_NAME = "mpwatch"
DEFAULT_SAMPLES = 0  # 0: keep every record


def _parse_samples(value: str) -> dict[str, int]:
    """``"a=1,b=2"`` -> ``{"a": 1, "b": 2}``, the same grammar as TensorBoard's flag."""
    result: dict[str, int] = {}
    for token in value.split(","):
        token = token.strip()
        if token:
            key, _, num = token.partition("=")
            result[key.strip()] = int(num)
    return result


class MpwatchLoader(base_plugin.TBLoader):
    """Loads :class:`tensorboard_plugin_mpwatch.plugin.MpwatchPlugin`."""

    def define_flags(self, parser: Any) -> None:
        """mpwatch adds no flags (``--samples_per_plugin`` belongs to TensorBoard's core plugin)."""

    def fix_flags(self, flags: Any) -> None:
        """Merge ``mpwatch=0`` into ``--samples_per_plugin``; a user-given ``mpwatch=N`` wins."""
        current = getattr(flags, "samples_per_plugin", None)
        if current is None or isinstance(current, str):
            current = _parse_samples(current or "")
        else:
            current = dict(current)
        current.setdefault(PLUGIN_NAME, DEFAULT_SAMPLES)
        flags.samples_per_plugin = current

    def load(self, context: base_plugin.TBContext) -> base_plugin.TBPlugin:
        from tensorboard_plugin_mpwatch.plugin import MpwatchPlugin

        return MpwatchPlugin(context)
