"""Per-tensor reductions over many tensors at once on Keras' JAX backend (inside ``jax.jit``).

The probe and the tap reduce hundreds of tensors (every gradient, every layer output) to a few
numbers each. One reduction per tensor makes the traced program grow by a dozen ops per tensor;
one segment reduction over the tensors concatenated (a segment id per element) keeps the program
small but is a scatter of every element, which XLA runs one element after the other on a CPU (and
the ids themselves are a binary search per element): 1.5 s of a 2.5 s probe of MobileNetV2 at
batch 8, measured on 2 CPU cores.

:class:`BlockLayout` keeps the program small and reduces along rows instead: each tensor,
flattened, is padded with zeros to a whole number of ``BLOCK``-element rows, and the rows of all
tensors are stacked into one ``[rows, BLOCK]`` matrix. A per-tensor sum, count or max is a
reduction along each row (vectorised, in parallel) and then a segment reduction over the rows'
partial results (one element per row). Zero padding changes no statistic the callers take
(counts of nonzero, nonfinite or changed elements, sums of squared differences, maxima of
magnitudes, which are at least 0); a count of exact zeros must subtract :attr:`padding`.

Example:
    >>> import jax, jax.numpy as jnp  # doctest: +SKIP
    >>> blocks = BlockLayout([3, 1000])  # doctest: +SKIP
    >>> m = blocks.matrix([jnp.ones(3), jnp.full(1000, 2.0)])  # doctest: +SKIP
    >>> blocks.sum(m)  # doctest: +SKIP
    Array([   3., 2000.], dtype=float32)
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: elements per row: long enough that a row reduction is vectorised, short enough that the
#: padding (at most ``BLOCK - 1`` zeros per tensor) stays small beside the tensors
BLOCK = 256


class BlockLayout:
    """Tensors of static ``sizes`` laid out as rows of :data:`BLOCK` elements (see the module
    doc). ``runtime_zero`` (an int32 0 known only at run time) keeps XLA from folding the
    row ids into the executable."""

    def __init__(self, sizes: Any, runtime_zero: Any = 0) -> None:
        import jax.numpy as jnp

        self.sizes = np.asarray(sizes, np.int64).reshape(-1)
        self.n = len(self.sizes)
        self.rows = -(-self.sizes // BLOCK)  # a tensor of 0 elements has no row
        #: zeros added to each tensor, and in all (what a count of exact zeros must subtract)
        self.pads = self.rows * BLOCK - self.sizes
        self.padding = int(self.pads.sum())
        ids = np.repeat(np.arange(self.n, dtype=np.int32), self.rows)
        self.ids = jnp.asarray(ids) + runtime_zero

    @classmethod
    def of(cls, tensors: list[Any], runtime_zero: Any = 0) -> BlockLayout:
        """The layout of tensors shaped as ``tensors``."""
        return cls([int(np.prod(np.shape(t))) for t in tensors], runtime_zero)

    def matrix(self, tensors: list[Any]) -> Any:
        """``[rows, BLOCK]`` float32: the tensors (of this layout's sizes) flattened, each padded
        with zeros to its rows, stacked."""
        import jax.numpy as jnp

        parts = []
        for t, size, rows in zip(tensors, self.sizes, self.rows):
            flat = jnp.ravel(t).astype(jnp.float32)
            if int(flat.size) != int(size):
                raise ValueError(f"a tensor of {flat.size} elements where {size} were laid out")
            if rows:
                parts.append(jnp.pad(flat, (0, int(rows) * BLOCK - int(size))))
        if not parts:
            return jnp.zeros((0, BLOCK), jnp.float32)
        return jnp.concatenate(parts).reshape(-1, BLOCK)

    def _segments(self, per_row: Any, op: Any) -> Any:
        return op(per_row, self.ids, num_segments=self.n, indices_are_sorted=True)

    def count(self, mask: Any) -> Any:
        """int32 ``[n]``: true elements of each tensor (padding must be false)."""
        import jax
        import jax.numpy as jnp

        return self._segments(jnp.sum(mask, axis=1, dtype=jnp.int32), jax.ops.segment_sum)

    def sum(self, x: Any) -> Any:
        """``[n]``: the sum over each tensor's elements (padding must add 0)."""
        import jax

        return self._segments(x.sum(axis=1), jax.ops.segment_sum)

    def max(self, x: Any) -> Any:
        """``[n]``: the largest element of each tensor, or 0 (x >= 0; padding is 0; a tensor
        without elements gives 0)."""
        import jax
        import jax.numpy as jnp

        if x.shape[0] == 0:
            return jnp.zeros((self.n,), x.dtype)
        return jnp.maximum(self._segments(x.max(axis=1), jax.ops.segment_max), 0.0)

    def spread(self, per_tensor: Any) -> Any:
        """``[rows, 1]``: each tensor's value on each of its rows (broadcasts over a row)."""
        return per_tensor[self.ids][:, None]
