"""What runs leave and how they are read: the metric names (:mod:`~capsexp.records.metric_names`), the
event files read back (:mod:`~capsexp.records.events`) and the comparison of runs
(:mod:`~capsexp.results.compare`)."""
