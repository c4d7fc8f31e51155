"""The float32-reference probe, its fix checks and float8 readiness (see :mod:`mpwatch.record`)."""
