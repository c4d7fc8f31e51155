"""The pre-flight: whether mixed precision will work for a model and its data, before the fit.

``mpwatch.preflight(model, batch)`` (:mod:`.check`) tries each candidate policy on one batch:
:mod:`.candidate` records the model seen under it as a run, :mod:`.verdict` judges that run's
diagnosis, :mod:`.report` writes the report, :mod:`.cli` is ``mpwatch preflight``. It is the
stage after ``show``: it records, reads, judges and shows.
"""

#: the policies a pre-flight can try, in its default order of preference (the float32 baseline
#: needs no probe)
CANDIDATES = ("mixed_float16", "mixed_bfloat16")
#: the report's formats
FORMATS = ("text", "markdown", "json", "html")
