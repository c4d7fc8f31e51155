"""What one fit shares: the model's recording state, the cost budget, the event writer,
resuming, the backend seam and mpwatch's compiled XLA programs (see :mod:`mpwatch.record`)."""
