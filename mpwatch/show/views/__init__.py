"""Every view of a run that the reports and the tab both show, computed once from a ``Run``.

The text, Markdown, JSON and HTML reports (:mod:`mpwatch.show.report`, :mod:`mpwatch.show.html`)
and the TensorBoard tab (``tensorboard_plugin_mpwatch``) import their views from here and only
render them:

- memory by kind and dtype beside the measured peak and mpwatch's own share (``memory``);
- float8 readiness per layer (``float8``);
- the profile's source and the time it could not join to a layer (``profile_view``);
- the loss scale from the first step, the skipped steps, a scalar's last value (``series``);
- gradient underflow by layer and probe step (``heatmap``).

Example:
    >>> import mpwatch  # doctest: +SKIP
    >>> from mpwatch.show import views  # doctest: +SKIP
    >>> run = next(iter(mpwatch.load_run("logs/run1").values()))  # doctest: +SKIP
    >>> views.memory_view(run)["rows"][0]  # doctest: +SKIP
"""

from mpwatch.show.views.float8 import float8_html, float8_view
from mpwatch.show.views.heatmap import HEATMAP_MAX_STEPS, underflow_heatmap
from mpwatch.show.views.memory import memory_html, memory_view, own_memory
from mpwatch.show.views.profile_view import UNJOINED_SAID, source_label, unjoined_math_share
from mpwatch.show.views.series import (
    initial_scale,
    last_value,
    loss_scale_series,
    scale_from_the_first_step,
    skip_marks,
)

__all__ = [
    "HEATMAP_MAX_STEPS",
    "UNJOINED_SAID",
    "float8_html",
    "float8_view",
    "initial_scale",
    "last_value",
    "loss_scale_series",
    "memory_html",
    "memory_view",
    "own_memory",
    "scale_from_the_first_step",
    "skip_marks",
    "source_label",
    "underflow_heatmap",
    "unjoined_math_share",
]
