"""What runs leave and how they are read: the metric names (:mod:`~capsexp.results.metric_names`), the
event files read back (:mod:`~capsexp.results.events`) and the comparison of runs
(:mod:`~capsexp.results.compare`)."""
