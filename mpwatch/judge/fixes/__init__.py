"""The code a finding proposes, and applying it: one finding's advice as one object (``fix``:
``Fix``), applying findings to a model (``apply``: ``apply_recommendations``), the clone it
trains (``clone``), the containers a layer sits in (``containers``)."""
