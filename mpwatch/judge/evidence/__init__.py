"""What several rules read from a Run: the loss scale's facts, decision and words
(``scale_facts``, ``scale_evidence``, ``scale_advice``), every skip's cause (``skip_causes``),
the probe's fix checks (``fix_checks``), the model's layer graph (``graph``)."""
