"""The only code that writes mpwatch events: :class:`RunWriter` (TensorFlow imported lazily).

Tags, record kinds and the payload encoding come from :mod:`mpwatch.contract`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mpwatch import contract


class RunWriter:
    """Writes mpwatch scalars and records into one run directory.

    ``enabled=False`` makes every call a no-op (a non-chief worker under ``tf.distribute``).
    Several writers may share a logdir: TensorFlow shares one file writer per directory.

    Example:
        >>> import tempfile
        >>> from mpwatch import contract
        >>> w = RunWriter(tempfile.mkdtemp())
        >>> w.scalars(3, {contract.LOSS_SCALE: 1024.0, contract.STEP_SKIPPED: 0.0})
        >>> w.flush()
    """

    def __init__(self, logdir: str, enabled: bool = True) -> None:
        self.logdir = str(logdir)
        self.enabled = enabled
        self._writer = None
        self._series_fn = None

    def _get(self):  # noqa: ANN202
        if self._writer is None:
            import tensorflow as tf

            self._writer = tf.summary.create_file_writer(self.logdir)
        return self._writer

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        """Write several scalars at one step (tags from this module)."""
        if not self.enabled or not values:
            return
        import tensorflow as tf

        with self._get().as_default():
            for tag, value in values.items():
                tf.summary.scalar(tag, float(value), step=int(step))

    def scalar_series(self, tag: str, steps: list[int], values: list[float]) -> None:
        """Write one scalar at several steps (e.g. per-step values gathered over an interval).

        Long series go through one compiled function (an eager ``tf.summary.scalar`` per value
        costs ~0.1-1 ms each: too much for per-step values on a hot path).
        """
        if not self.enabled or not len(steps):
            return
        import tensorflow as tf

        with self._get().as_default():
            if len(steps) < 4:
                for step, value in zip(steps, values):
                    tf.summary.scalar(tag, float(value), step=int(step))
                return
            if self._series_fn is None:
                from tensorboard.plugins.scalar import metadata as scalar_metadata

                meta = scalar_metadata.create_summary_metadata(display_name=None, description=None)

                @tf.function(reduce_retracing=True)
                def series(tag, steps, values):  # noqa: ANN001, ANN202
                    # tf.summary.write keeps the tag as given (scalar() would prefix "while/")
                    for i in tf.range(tf.size(steps)):
                        tf.summary.write(tag, values[i], step=steps[i], metadata=meta)

                self._series_fn = series
            self._series_fn(
                tf.constant(tag, tf.string),  # a tensor: one trace for every tag
                tf.constant([int(s) for s in steps], tf.int64),
                tf.constant([float(v) for v in values], tf.float32),
            )

    def record(self, kind: str, step: int, payload: Mapping[str, Any]) -> int:
        """Write one structured record; returns its compressed size in bytes."""
        blob = contract.encode_payload(payload)
        if len(blob) > contract.MAX_RECORD_BYTES:
            raise ValueError(
                f"mpwatch {kind} record is {len(blob)} bytes compressed, over the "
                f"{contract.MAX_RECORD_BYTES}-byte limit: split the record (see write_probe_record)"
            )
        if not self.enabled:
            return len(blob)
        import tensorflow as tf
        from tensorboard.compat.proto import summary_pb2

        metadata = summary_pb2.SummaryMetadata(
            plugin_data=summary_pb2.SummaryMetadata.PluginData(
                plugin_name=contract.PLUGIN_NAME, content=contract.metadata_content(kind)
            ),
            data_class=summary_pb2.DATA_CLASS_TENSOR,
            summary_description=f"mpwatch {kind} record",
        )
        with self._get().as_default():
            tf.summary.write(
                contract.record_tag(kind),
                tf.constant(blob, dtype=tf.string),
                step=int(step),
                metadata=metadata,
            )
        return len(blob)

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.flush()
            self._writer.close()
            self._writer = None
            self._series_fn = None  # it captured the closed writer
