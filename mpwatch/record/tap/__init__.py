"""The in-step taps: what the train step and its optimizer did at each batch, read inside the
step, and the statistics they take of the gradients (see :mod:`mpwatch.record`)."""
