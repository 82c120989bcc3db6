"""The closed loop under test: the ``slo``, ``saturate``, ``outage`` and ``control``
scenarios (plan, jobs, targets, report, plots), the time series a run records, and
the step model's bounds."""
