"""mpwatch's Keras callbacks: one callback per file, bundled by
``monitor.MixedPrecisionMonitor``."""
