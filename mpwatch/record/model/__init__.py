"""Static facts of the model: memory by kind and dtype, the layer graph, what its inputs become
(see :mod:`mpwatch.record`)."""
