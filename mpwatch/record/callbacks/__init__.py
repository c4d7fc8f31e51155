"""The Keras surface of the record stage: one callback a file (see :mod:`mpwatch.record`)."""
